"""Other packages plug in through entry points: a method of its own (``fedsdk.methods``) that
declares the weighted-sum capability gets DP and secure aggregation without subclassing
FedAvg, and a device runtime (``fedsdk.runtimes``) joins the one runtime table. Each package
is written to a tmp dir with its ``.dist-info`` (what ``pip install`` leaves) and put on
``sys.path``; rounds run in-process on the bundled digits."""

from __future__ import annotations

import importlib
import logging
import textwrap
from pathlib import Path

import numpy as np
import pytest

from fedcore import modelspec
from fedcore.recipe import Recipe
from sdk_device.runtimes import registry
from server_toolkit import methods as method_registry
from server_toolkit.assembly import aggregation_stack
from server_toolkit.data.datasets import load_dataset
from server_toolkit.methods.abilities import EDGE_SUMS, PRIVATE_AGGREGATION, SECURE_AGGREGATION, abilities
from server_toolkit.methods.base import ClientUpdate, DeviceInfo
from server_toolkit.methods.fedavg import FedAvg
from server_toolkit.models.zoo import model_spec
from server_toolkit.privacy.settings import PrivacySettings
from server_toolkit.rounds.inprocess_grid import InProcessGrid
from server_toolkit.rounds.local_device import LocalDevice
from server_toolkit.rounds.loop import LoopConfig, RoundLoop
from server_toolkit.secagg.aggregate import layout_for, next_weights, refusal
from server_toolkit.secagg.inprocess import run_secure_round

MEAN_PACKAGE = '''
"""A sample-weighted mean of whole models, written from the Method interface alone."""
import numpy as np

from server_toolkit.methods.base import Method, TrainInstruction
from server_toolkit.methods.capability import FULL, WeightedSum
from server_toolkit.methods.summands import whole


class PlainMean(Method):
    name = "plain-mean"
    family = "averaging"
    weighted_sum = WeightedSum(FULL)  # edges, async, DP / robust and --secagg serve it

    def configure_train(self, round_number, global_weights, devices):
        return [TrainInstruction(d.device_id, self.global_spec, global_weights, self.recipe) for d in devices]

    def aggregate_train(self, round_number, global_weights, updates):
        total = sum(u.num_samples for u in updates)
        return {k: (sum(u.weights[k].astype(np.float64) * u.num_samples for u in updates) / total)
                .astype(v.dtype) for k, v in global_weights.items()}

    def summands(self, global_weights, update):
        return whole(update.weights, update.num_samples)
'''

RUNTIME_PACKAGE = '''
"""A runtime for programs of format demo/1 (a torchspec inside), registered by entry point."""
from fedcore import modelspec
from sdk_device.runtimes.registry import RuntimeEntry


def _create():
    from sdk_device.runtimes.torch_runtime import TorchRuntime  # the engine: imported on use only

    class DemoRuntime(TorchRuntime):
        name = "demo"
        formats = ("demo/1", modelspec.FORMAT)

        def load_program(self, program, fmt):  # a demo/1 program is a torchspec
            super().load_program(program, modelspec.FORMAT)

    return DemoRuntime(threads=1)


ENTRY = RuntimeEntry(formats=("demo/1",), requires="torch", create=_create)
'''


def _install(site: Path, package: str, source: str, entry_points: str) -> None:
    """What ``pip install`` leaves: the package and its metadata with the entry points."""
    (site / package).mkdir(parents=True)
    (site / package / "__init__.py").write_text(textwrap.dedent(source))
    info = site / f"{package}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))
    importlib.invalidate_caches()


@pytest.fixture
def plain_mean(tmp_path, monkeypatch):
    method_registry.methods()  # the package's table is read before the plug-in exists: it stays as it is
    _install(tmp_path, "fedsdk_mean_demo", MEAN_PACKAGE,
             "[fedsdk.methods]\nplain-mean = fedsdk_mean_demo:PlainMean\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return method_registry._entry_point_methods()["plain-mean"]


def _fleet(devices: int = 3, per_device: int = 120) -> tuple[list[LocalDevice], tuple, dict]:
    data = load_dataset("digits", seed=0)
    fleet = [LocalDevice(DeviceInfo(f"d{i}", per_device), data.x_train[i * per_device:(i + 1) * per_device],
                         data.y_train[i * per_device:(i + 1) * per_device]) for i in range(devices)]
    return fleet, (data.x_test[:300], data.y_test[:300]), model_spec("small_cnn", data.input_shape,
                                                                      data.num_classes)


def test_a_method_of_its_own_package_declares_the_capability_and_gets_dp_and_secure_aggregation(plain_mean):
    assert not issubclass(plain_mean, FedAvg)
    assert {EDGE_SUMS, PRIVATE_AGGREGATION, SECURE_AGGREGATION} <= set(abilities(plain_mean))
    assert refusal(plain_mean) is None
    PrivacySettings(clip=1.0, noise_multiplier=0.3).check(plain_mean)  # no ValueError: DP accepts it

    fleet, test, spec = _fleet()
    plain = RoundLoop(plain_mean(spec, Recipe(epochs=2, batch_size=20, lr=0.1)), InProcessGrid(fleet),
                      LoopConfig(rounds=3, seed=0), test_data=test)
    plain.start()
    rows = plain.run()
    assert [r["accepted"] for r in rows] == [3, 3, 3] and rows[-1]["accuracy"] > 0.3  # chance: 0.1

    mean = plain_mean(spec, Recipe(epochs=1, batch_size=20, lr=0.1))
    private = RoundLoop(mean, InProcessGrid(fleet), LoopConfig(rounds=1, seed=0), test_data=test,
                        aggregator=aggregation_stack(mean, privacy=PrivacySettings(clip=0.5,
                                                                                   noise_multiplier=0.3)))
    private.start()
    (row,) = private.run()
    assert row["dp_epsilon"] > 0  # the central DP rule replaced the plug-in's own aggregate


def test_a_secure_round_of_the_plug_in_method_equals_its_plain_aggregate(plain_mean):
    method = plain_mean(model_spec("small_cnn", (1, 8, 8), 10), Recipe())
    before = method.initial_weights(0)
    instructions = method.configure_train(1, before, [DeviceInfo(f"d{i}", 10 + i) for i in range(5)])
    rng = np.random.default_rng(0)
    trained = {i.device_id: ({k: v + rng.normal(0, 0.1, v.shape).astype(v.dtype)
                              for k, v in i.weights.items()}, 10 + int(i.device_id[1:]), None)
               for i in instructions}
    layouts = {i.device_id: layout_for(method, before, i) for i in instructions}
    stats = run_secure_round(1, layouts, trained)
    secure = next_weights(method, 1, before, stats.total, layouts["d0"], instructions[0])
    plain = method.aggregate_train(1, before, [ClientUpdate(i.device_id, trained[i.device_id][1],
                                                            trained[i.device_id][0], {}, i)
                                               for i in instructions])
    assert max(np.abs(secure[n] - plain[n]).max() for n in plain) <= 1e-5
    assert max(np.abs(plain[n] - before[n]).max() for n in plain) > 0.01  # the round moved the model


def test_a_runtime_of_its_own_package_joins_the_one_runtime_table(tmp_path, monkeypatch, caplog):
    _install(tmp_path, "fedsdk_rt_demo", RUNTIME_PACKAGE,
             "[fedsdk.runtimes]\ndemo = fedsdk_rt_demo:ENTRY\ntorch = fedsdk_rt_demo:ENTRY\n"
             "broken = fedsdk_rt_demo:NO_SUCH_NAME\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_RUNTIMES", {})  # read the table afresh, with the plug-in installed
    with caplog.at_level(logging.WARNING, logger=registry.__name__):
        known = registry.runtimes()
    assert list(known)[: len(registry.BUILT_IN)] == list(registry.BUILT_IN)  # built-ins keep their order
    assert "demo" in known and "broken" not in known and known["torch"] is registry.BUILT_IN["torch"]
    assert "broken" in caplog.text and "torch" in caplog.text  # each refusal is logged
    assert "demo" in registry.available_runtimes()
    assert registry.pick_runtime(["demo/1"]) == ("demo", "demo/1")

    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 64)
    x = (np.where(y == 1, 1.0, -1.0)[:, None, None, None] + 0.3 * rng.standard_normal((64, 1, 4, 4)))
    spec = modelspec.make((1, 4, 4), 2, [{"op": "flatten"}, {"op": "linear", "in": 16, "out": 2}])
    runtime = registry.create_runtime("demo")
    runtime.load_program(modelspec.dumps(spec), "demo/1")
    before = runtime.evaluate(x.astype(np.float32), y)
    runtime.train(x.astype(np.float32), y, Recipe(epochs=3, batch_size=16, lr=0.1))
    assert runtime.evaluate(x.astype(np.float32), y).loss < before.loss
