"""A device's held-back split (``sdk_device.holdout``, ``task_runner``), ``task.holdout`` on the
wire, and the server's per-tier held-back accuracy (``methods/holdout_accuracy.py``): the split,
the scoring before training, the weighted means, the closing table's columns, a round loop."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fedcore import modelspec
from fedcore.recipe import Recipe
from sdk_device.holdout import split_holdout
from sdk_device.local_tensors import LocalTensors
from sdk_device.protocol import messages as msgs
from sdk_device.protocol.errors import ProtocolError
from sdk_device.protocol.task_plan import TaskPlan, TrainStep
from sdk_device.runtimes.torch_runtime import TorchRuntime
from sdk_device.task_runner import LoadedModel, run_task
from server_toolkit.data.datasets import load_dataset
from server_toolkit.methods import method_class
from server_toolkit.methods.base import ClientUpdate, DeviceInfo, TrainInstruction
from server_toolkit.methods.holdout_accuracy import holdout_row
from server_toolkit.models.zoo import model_spec
from server_toolkit.report.run_report import RunReport
from server_toolkit.rounds.inprocess_grid import InProcessGrid
from server_toolkit.rounds.local_device import LocalDevice
from server_toolkit.rounds.loop import LoopConfig, RoundLoop

SHAPE = (1, 4, 4)


def _data(n: int, seed: int = 0, classes: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    x = (y[:, None, None, None] - 1.0) + 0.7 * rng.standard_normal((n, *SHAPE))
    return x.astype(np.float32), y.astype(np.int64)


# -- the split ---------------------------------------------------------------------------------
def test_the_split_is_disjoint_complete_stratified_and_the_same_every_time():
    y = np.repeat(np.arange(4), [50, 30, 15, 5])
    np.random.default_rng(3).shuffle(y)
    train, held = split_holdout(y, 0.2)
    assert len(held) == 20 and len(train) == 80
    assert not set(train) & set(held) and sorted({*train, *held}) == list(range(100))
    assert np.bincount(y[held], minlength=4).tolist() == [10, 6, 3, 1]  # exactly 20 % of each label
    again_train, again_held = split_holdout(y.copy(), 0.2)
    assert np.array_equal(held, again_held) and np.array_equal(train, again_train)


def test_the_split_rounds_to_the_nearest_sample_by_largest_remainders():
    y = np.array([0] * 7 + [1] * 7 + [2] * 3)  # 0.25 x 17 = 4.25 -> 4 held back
    _, held = split_holdout(y, 0.25)
    assert len(held) == 4
    counts = np.bincount(y[held], minlength=3)
    assert counts.tolist() == [2, 1, 1]  # quotas 1.75, 1.75, 0.75: floors 1, 1, 0; a tie goes to label 0


def test_a_tiny_device_keeps_a_sample_to_train_on_and_zero_holds_back_nothing():
    assert [len(p) for p in split_holdout(np.array([3]), 0.5)] == [1, 0]
    assert [len(p) for p in split_holdout(np.array([0, 1]), 0.5)] == [1, 1]
    assert [len(p) for p in split_holdout(np.arange(10) % 2, 0.0)] == [10, 0]


@pytest.mark.parametrize("bad", [-0.1, 0.6, float("nan"), True, "0.1"])
def test_a_fraction_outside_0_to_half_is_refused(bad):
    with pytest.raises(ValueError, match="holdout must be a fraction"):
        split_holdout(np.arange(10) % 2, bad)


# -- on the device -----------------------------------------------------------------------------
class RecordingRuntime(TorchRuntime):
    """The torch runtime, remembering the samples of every call to train."""

    def __init__(self) -> None:
        super().__init__()
        self.trained_on: list[np.ndarray] = []

    def train(self, x, y, recipe, progress=None, extras=None):
        self.trained_on.append(np.array(x))
        return super().train(x, y, recipe, progress=progress, extras=extras)


def _spec() -> dict:
    return modelspec.make(SHAPE, 3, [{"op": "flatten"}, {"op": "linear", "in": 16, "out": 8}, {"op": "relu"},
                                     {"op": "linear", "in": 8, "out": 3}])


def test_the_device_scores_the_received_model_on_its_held_back_split_before_training():
    x, y = _data(100)
    torch.manual_seed(0)
    runtime = RecordingRuntime()
    runtime.load_program(modelspec.dumps(_spec()), modelspec.FORMAT)
    sent = runtime.get_weights()
    train_idx, held_idx = split_holdout(y, 0.2)
    expected = runtime.evaluate(x[held_idx], y[held_idx])  # the model as received
    plan = TaskPlan((TrainStep("model", Recipe(epochs=2, batch_size=8, seed=1)),),
                    reports={"label_counts": {}})
    out = run_task(plan, {"model": LoadedModel(runtime, "p", sent)}, x, y, LocalTensors(), holdout=0.2)
    m = out.metrics
    assert m["holdout_samples"] == 20 and m["samples"] == 80
    assert m["holdout_accuracy"] == pytest.approx(expected.accuracy)
    assert m["holdout_loss"] == pytest.approx(expected.loss)
    [trained] = runtime.trained_on
    assert np.array_equal(trained, x[train_idx])  # the training part only, never a held-back sample
    assert m["label_counts"] == np.bincount(y[train_idx]).tolist()  # outputs see the training part too
    after = runtime.evaluate(x[held_idx], y[held_idx])
    assert after.loss != pytest.approx(expected.loss)  # training changed the model: scored before it


def test_without_a_holdout_the_device_trains_on_everything_and_reports_no_holdout_keys():
    x, y = _data(50)
    runtime = RecordingRuntime()
    runtime.load_program(modelspec.dumps(_spec()), modelspec.FORMAT)
    plan = TaskPlan((TrainStep("model", Recipe(epochs=1, batch_size=8)),))
    out = run_task(plan, {"model": LoadedModel(runtime, "p", runtime.get_weights())}, x, y, LocalTensors())
    assert out.metrics["samples"] == 50 and not any(k.startswith("holdout") for k in out.metrics)


def test_the_device_scores_the_model_the_server_names_when_it_is_not_the_last_steps():
    x, y = _data(60)
    torch.manual_seed(1)
    model, teacher = RecordingRuntime(), RecordingRuntime()
    for runtime in (model, teacher):
        runtime.load_program(modelspec.dumps(_spec()), modelspec.FORMAT)
    train_idx, held_idx = split_holdout(y, 0.25)
    expected = teacher.evaluate(x[held_idx], y[held_idx]).accuracy
    assert expected != model.evaluate(x[held_idx], y[held_idx]).accuracy  # the two can be told apart
    plan = TaskPlan((TrainStep("teacher", Recipe(epochs=1, batch_size=8)),
                     TrainStep("model", Recipe(epochs=1, batch_size=8))), ("model", "teacher"))
    loaded = {"model": LoadedModel(model, "p", model.get_weights()),
              "teacher": LoadedModel(teacher, "q", teacher.get_weights())}
    out = run_task(plan, loaded, x, y, LocalTensors(), holdout=0.25, holdout_model="teacher")
    assert out.metrics["holdout_accuracy"] == pytest.approx(expected)
    assert [len(b) for b in teacher.trained_on] == [len(train_idx)]  # the teacher too: training part only


def test_recipfl_strong_devices_deploy_their_large_model():
    data = load_dataset("digits", seed=0)
    spec = model_spec("lenet5", data.input_shape, data.num_classes)
    method = method_class("recipfl")(spec, Recipe(), small_model="width:0.3")
    weights = method.initial_weights(0)
    strong, weak = DeviceInfo("s", 100, "strong"), DeviceInfo("w", 100, "weak")
    by_device = {i.device_id: i for i in method.configure_train(1, weights, [strong, weak])}
    assert by_device["s"].deploys == "teacher" and by_device["w"].deploys == "model"
    large_spec, _ = method.deployable(weights, strong)
    assert by_device["s"].models["teacher"].spec == large_spec


# -- on the wire -------------------------------------------------------------------------------
def _task(**extra) -> bytes:
    ref = {"id": "a" * 64, "size": 1, "kind": "weights", "format": "safetensors"}
    body = {"schema": 2, "type": "task", "msg_id": "m", "sent_at": 1.0, "task_id": "t", "round": 1,
            "programs": {"model": [{**ref, "kind": "program", "format": "torchspec/1"}]},
            "arrays": {"model": ref}, "config": {"steps": [{"train": "model"}]}, "deadline": 2.0, **extra}
    return json.dumps(body).encode()


def test_task_holdout_travels_and_is_checked():
    assert msgs.decode(_task(holdout=0.1)).holdout == 0.1
    assert msgs.decode(_task()).holdout is None  # a server without --holdout
    task = msgs.decode(_task(holdout=0.25))
    assert msgs.decode(msgs.encode(task)).holdout == 0.25
    assert msgs.decode(_task(holdout=0.1, holdout_model="teacher")).holdout_model == "teacher"
    for bad in ({"holdout": 0.75}, {"holdout": -0.1}, {"holdout": "0.1"}, {"holdout_model": "Teacher!"},
                {"holdout_model": 3}):
        with pytest.raises(ProtocolError) as err:
            msgs.decode(_task(**bad))
        assert err.value.code == "invalid_field"


# -- on the server -----------------------------------------------------------------------------
def _update(device: str, **metrics) -> ClientUpdate:
    instruction = TrainInstruction(device, {}, {}, Recipe())
    return ClientUpdate(device, 10, {}, {"samples": 10, **metrics}, instruction)


def test_the_round_row_has_each_tiers_sample_weighted_mean_and_tolerates_devices_without_one():
    devices = {d.device_id: d for d in (DeviceInfo("a", 10, "1.0"), DeviceInfo("b", 10, "1.0"),
                                        DeviceInfo("c", 10, "0.5"), DeviceInfo("d", 10, "0.5"))}
    updates = [_update("a", holdout_accuracy=0.9, holdout_samples=30),
               _update("b", holdout_accuracy=0.5, holdout_samples=10),
               _update("c", holdout_accuracy=0.4, holdout_samples=5),
               _update("d"),  # an older device, or the C++ client: no held-back split
               _update("e", holdout_accuracy=1.0, holdout_samples=5),  # a device of no known tier
               _update("f", holdout_accuracy=float("nan"), holdout_samples=5),  # invalid: left out
               _update("g", holdout_accuracy=0.5, holdout_samples=2.0)]  # samples not an integer
    row = holdout_row(updates, devices)
    assert row == {"accuracy_holdout": pytest.approx((27 + 5 + 2 + 5) / 50), "holdout_samples": 50,
                   "accuracy_holdout_tier_1.0": pytest.approx(32 / 40),
                   "accuracy_holdout_tier_0.5": pytest.approx(0.4),
                   "accuracy_holdout_tier_default": pytest.approx(1.0)}
    assert holdout_row([_update("d")], devices) == {}


def test_the_closing_table_shows_a_holdout_column_per_tier(tmp_path):
    report = RunReport(tmp_path, "r")
    report.add_round({"round": 1, "accuracy": 0.5, "accuracy_tier_1.0": 0.5, "accuracy_tier_0.5": 0.4,
                      "accuracy_holdout_tier_1.0": 0.61, "accuracy_holdout_tier_0.5": 0.52, "loss": 1.0})
    table = report.summary_table()
    headers = [c.header for c in table.columns]
    assert headers[:6] == ["round", "accuracy", "tier 0.5", "tier 1.0", "holdout 0.5", "holdout 1.0"]
    assert list(table.columns[5].cells) == ["0.610"]


def test_a_round_loop_with_holdout_writes_per_tier_held_back_accuracy():
    data = load_dataset("digits", seed=0)
    spec = model_spec("small_cnn", data.input_shape, data.num_classes)
    method = method_class("heterofl")(spec, Recipe(epochs=1, batch_size=16, max_steps=10))
    part = [slice(i * 120, (i + 1) * 120) for i in range(3)]
    devices = [LocalDevice(DeviceInfo(f"d{i}", 120, tier), data.x_train[part[i]], data.y_train[part[i]])
               for i, tier in enumerate(["1.0", "0.5", "0.5"])]
    loop = RoundLoop(method, InProcessGrid(devices), LoopConfig(rounds=2, holdout=0.25),
                     test_data=(data.x_test[:100], data.y_test[:100]))
    loop.start()
    rows = loop.run()
    for row in rows:
        assert {"accuracy_holdout", "accuracy_holdout_tier_1.0", "accuracy_holdout_tier_0.5"} <= set(row)
        assert row["holdout_samples"] == 3 * 30 and 0 <= row["accuracy_holdout_tier_0.5"] <= 1
    assert all(u.num_samples == 90 and u.instruction.holdout == 0.25 for u in loop.last_updates)
    # round 2 scores what round 1 built: better than the random initial model of round 1
    assert rows[1]["accuracy_holdout"] > rows[0]["accuracy_holdout"]


def test_a_bundle_passes_holdout_to_its_members_and_forwards_what_they_report():
    from sdk_device.protocol.task_plan import TaskPlan as Plan
    from server_toolkit.edge.bundle_relay import member_metrics, member_tasks
    from server_toolkit.methods.base import ModelRecord

    template = TrainInstruction("", _spec(), {}, Recipe(), models={"m_a": ModelRecord(_spec(), {})})
    plan = Plan((TrainStep("model", Recipe()),), ("model", "m_a"),
                members={"m_a": {"device": "a", "recipe": Recipe().to_dict()}})
    assert member_tasks(template, plan, {"a"}, 0.1)["a"].holdout == 0.1
    update = _update("a", holdout_accuracy=0.7, holdout_loss=0.9, holdout_samples=4)
    assert {k: v for k, v in member_metrics(update).items() if k.startswith("holdout")} == \
        {"holdout_accuracy": 0.7, "holdout_loss": 0.9, "holdout_samples": 4}


def test_the_report_and_the_dashboard_chart_the_held_back_keys_as_accuracy_parts():
    from server_toolkit.observe.pages import part_keys
    from server_toolkit.report.series import is_accuracy_part

    keys = ["accuracy", "accuracy_holdout", "accuracy_holdout_tier_0.5", "holdout_samples", "loss"]
    assert part_keys(keys) == ["accuracy_holdout", "accuracy_holdout_tier_0.5"]
    assert [k for k in keys if is_accuracy_part(k)] == ["accuracy_holdout", "accuracy_holdout_tier_0.5"]
