"""The hypernetwork methods over a real mosquitto with real device processes.

* ``fedsdk-server simulate --method mh-pfedhn``: five devices of five architectures, two
  rounds; every update accepted, each device uploads exactly its architecture's parameters
  (its BatchNorm statistics stay on it), every device gets its own generated weights; then
  ``hn adapt`` brings a sixth device into the run.
* ``mh-pfedhngd``: one paper round (stage 1 + stage 2); the stage-2 tasks carry the global
  model as their teacher, and replaying a device's training shows it used exactly that
  teacher (with it the replay gives the uploaded weights, without it it does not).
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner

from fedcore import modelspec
from sdk_device.data.npz import load_npz
from sdk_device.local_tensors import LocalTensors
from sdk_device.protocol.blobs import decode_tensors
from sdk_device.protocol.task_plan import TaskPlan, TrainStep
from sdk_device.runtimes.torch_runtime import TorchRuntime
from sdk_device.task_runner import LoadedModel, run_task
from sdk_device.transport.blob_store import BlobStore
from server_toolkit.cli import main
from server_toolkit.cli.hn import load_hypernet_run
from server_toolkit.fleet.registry import FleetRegistry
from server_toolkit.methods.hypernet.mh_pfedhngd import MHPFedHNGD
from server_toolkit.models.architectures import architecture
from server_toolkit.models.zoo import model_spec

from .harness import RECIPE, Fleet

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_torch_thread")]

TIERS = ["lenet", "vgg8", "resnet10", "resnet18", "mlp"]


def test_simulate_mh_pfedhn_with_five_architectures(mosquitto, tmp_path):
    result = CliRunner().invoke(main, [
        "simulate", "--method", "mh-pfedhn", "--model", "lenet", "--devices", "5", "--rounds", "2",
        "--tiers", ",".join(TIERS), "--partition", "iid", "--broker", mosquitto.url, "--runs-dir",
        str(tmp_path / "runs"), "--round-timeout", "150", "--method-option", "client_epochs=1"])
    assert result.exit_code == 0, result.output
    (run_dir,) = (tmp_path / "runs").iterdir()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2]
    assert all(r["accepted"] == 5 and r["rejected"] == 0 for r in rows), rows
    assert all(0 <= r["accuracy"] <= 1 and r["personal_devices"] == 5 and r["hn_parameters"] > 0
               for r in rows)

    registry, store = FleetRegistry(run_dir / "registry.sqlite"), BlobStore(run_dir / "blobs")
    try:
        for update in registry.updates(2):
            arch = architecture(registry.device(update["device_id"])["tier"], (1, 8, 8), 10)
            uploaded = decode_tensors(store.get(update["blob_id"]))
            assert {k: v.shape for k, v in uploaded.items()} == dict(arch.parameters)  # no BN statistics
    finally:
        registry.close()
    for dev in ("dev002", "dev003"):  # the ResNets kept their running statistics on the device
        assert list((run_dir / "devices" / dev / "work" / "local_state").glob("*.safetensors")), dev

    method, _, _ = load_hypernet_run(run_dir)
    generated = {d: method.generate(c).detach().numpy() for d, c in method.clients.items()}
    assert sorted(generated) == [f"dev{i:03d}" for i in range(5)]
    ids = sorted(generated)
    for i, a in enumerate(ids):
        for b in ids[i + 1:]:
            n = min(len(generated[a]), len(generated[b]))
            assert not np.allclose(generated[a][:n], generated[b][:n]), (a, b)
    assert method.clients["dev001"].head == method.clients["dev002"].head == "tau12"  # vgg8, resnet10

    adapted = CliRunner().invoke(main, ["hn", "adapt", "--run-dir", str(run_dir), "--device-id", "dev005",
                                        "--tier", "resnet12", "--data",
                                        str(run_dir / "devices" / "dev000" / "data.npz"), "--steps", "2"])
    assert adapted.exit_code == 0, adapted.output
    method, _, _ = load_hypernet_run(run_dir)
    assert method.clients["dev005"].head == "tau17"


def test_mh_pfedhngd_round_sends_the_global_model_as_teacher_and_devices_use_it(mosquitto, tmp_path):
    fleet = Fleet(mosquitto.address, tmp_path)
    shape, classes = fleet.data.input_shape, fleet.data.num_classes
    method = MHPFedHNGD(model_spec("lenet", shape, classes), RECIPE, global_arch="mlp",
                        kd_alpha=0.5, kd_temperature=2.0, client_lr=0.05,
                        client_batch_size=32, client_epochs=1)
    updates = {}
    aggregate = method.aggregate_train

    def keep(rnd, weights, round_updates):
        updates[rnd] = {u.device_id: u for u in round_updates}
        return aggregate(rnd, weights, round_updates)

    method.aggregate_train = keep
    paths = fleet.write_data(["dev0", "dev1"], "iid")
    try:
        for dev, path in paths.items():
            fleet.start_process(dev, path)
        # the run's tier overrides, applied by the round loop before the method sees a device
        rows = fleet.run_method(method, rounds=2, devices=2, round_timeout_s=150,
                                tier_map={"dev0": "lenet", "dev1": "vgg8"})
    finally:
        fleet.close()
    assert all(r["accepted"] == 2 and r["rejected"] == 0 for r in rows), rows
    assert [r["stage"] for r in rows] == [1, 2] and 0 <= rows[1]["global_accuracy"] <= 1
    assert method.architectures == {"dev0": "lenet", "dev1": "vgg8"}  # the method saw the overridden tiers

    stage_one, stage_two = updates[1], updates[2]
    sent_global = stage_one["dev0"].instruction.weights
    assert all(u.instruction.spec == architecture("mlp", shape, classes).spec for u in stage_one.values())
    for dev, update in stage_two.items():
        assert update.instruction.teacher == "teacher" and not update.instruction.steps_before  # frozen
        teacher = update.instruction.models["teacher"]
        assert teacher.spec == stage_one[dev].instruction.spec
        assert all(np.array_equal(teacher.weights[k], sent_global[k]) for k in sent_global)
        assert not update.others  # a frozen teacher is not returned

        # replay the device's training: with the teacher it gives what the device uploaded
        x, y = load_npz(paths[dev])
        replayed = {}
        for distil in (True, False):
            student = TorchRuntime()
            student.load_program(modelspec.dumps(update.instruction.spec), modelspec.FORMAT)
            # as the device does: tensors the task omits (vgg8's BatchNorm statistics) are the
            # program's own right after loading, the first time (sdk_device/local_tensors.py)
            sent = update.instruction.weights
            student.set_weights(LocalTensors().complete("s", sent, student.get_weights()))
            teacher_runtime = TorchRuntime()
            teacher_runtime.load_program(modelspec.dumps(teacher.spec), modelspec.FORMAT)
            teacher_runtime.set_weights(teacher.weights)
            recipe = update.instruction.recipe if distil else replace(update.instruction.recipe, loss="ce")
            plan = TaskPlan((TrainStep("model", recipe, "teacher" if distil else None),))
            loaded = {"model": LoadedModel(student, "s", update.instruction.weights),
                      "teacher": LoadedModel(teacher_runtime, "t", teacher.weights)}
            run_task(plan, loaded, x, y, LocalTensors())
            replayed[distil] = student.get_weights()
        assert all(np.allclose(replayed[True][k], update.weights[k], atol=1e-5) for k in update.weights), dev
        assert not all(np.allclose(replayed[False][k], update.weights[k], atol=1e-5) for k in update.weights)
