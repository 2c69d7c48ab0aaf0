"""Held-back accuracy of a deployed *ensemble* (``task.holdout_ensemble``, issue 32): a DepthFL
device scores the mean softmax of every output of its prefix, exactly as the server's
``ensemble_model_accuracy`` scores it, on every runtime here; the field on the wire; and an
in-process ``simulate --method depthfl --holdout 0.2`` whose per-tier rows are the ensemble's."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from export.onnx import export_inference
from export.tflite import export_tflite, litert_python_path
from fedcore import modelspec
from fedcore.recipe import Recipe
from fedcore.torch_model import build_model, state_numpy
from fedcore.torch_train import train_model
from sdk_device.holdout import ensemble_scores, holdout_metrics, split_holdout
from sdk_device.local_tensors import LocalTensors
from sdk_device.protocol import messages as msgs
from sdk_device.protocol.errors import ProtocolError
from sdk_device.protocol.task_plan import TaskPlan, TrainStep
from sdk_device.runtimes.executorch_native_runtime import NativeExecutorchRuntime
from sdk_device.runtimes.executorch_runtime import ExecutorchRuntime
from sdk_device.runtimes.onnxruntime_runtime import OnnxEvalRuntime
from sdk_device.runtimes.torch_runtime import TorchRuntime
from sdk_device.task_runner import LoadedModel, run_task
from server_toolkit.data.datasets import load_dataset
from server_toolkit.models.exit_eval import ensemble_accuracy, exit_accuracies
from server_toolkit.models.zoo import model_spec
from server_toolkit.sim.simulate import Simulation, SimulationConfig
from tests.unit.test_holdout import _task  # the wire task the held-back tests share

from ..ort_env import run_ort
from .pte_cache import cached_programs  # noqa: F401 - provides the program_for fixture

BATCH = 8  # the pte programs' batch (the last chunk is padded)
CE = {"kind": "ce"}
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def case() -> dict:
    """lenet5_multi_exit on digits, trained for 40 steps (exits and final output disagree on
    some samples), and one device's held-back split of 300 training samples."""
    data = load_dataset("digits", seed=0)
    spec = model_spec("lenet5_multi_exit", data.input_shape, data.num_classes)
    model = build_model(spec, seed=3)
    train_model(model, data.x_train[:600], data.y_train[:600],
                Recipe(epochs=1, batch_size=16, lr=0.05, momentum=0.9, max_steps=40, seed=1))
    x, y = data.x_train[600:900], data.y_train[600:900]
    _, held = split_holdout(y, 0.2)
    weights = state_numpy(model)
    return {"spec": spec, "weights": weights, "x": x[held], "y": y[held], "all_x": x, "all_y": y,
            "server": ensemble_accuracy(spec, weights, x[held], y[held]),
            "final": exit_accuracies(spec, weights, x[held], y[held])[-1]}


def _check(metrics: dict, case: dict) -> None:
    assert metrics["holdout_samples"] == len(case["y"]) == 60
    assert metrics["holdout_accuracy"] == pytest.approx(case["server"], abs=1e-12)
    assert metrics["holdout_loss"] is not None and 0 < metrics["holdout_loss"] < 5


def test_the_case_tells_the_ensemble_from_the_final_output(case):
    assert case["server"] != case["final"]  # otherwise the tests below could not fail
    assert len(exit_accuracies(case["spec"], case["weights"], case["x"], case["y"])) == 2  # exit, final


def test_the_torch_device_scores_the_servers_ensemble_before_training(case):
    runtime = TorchRuntime()
    runtime.load_program(modelspec.dumps(case["spec"]), modelspec.FORMAT)
    runtime.set_weights(case["weights"])
    plan = TaskPlan((TrainStep("model", Recipe(epochs=1, batch_size=16, max_steps=5, seed=1)),))
    loaded = {"model": LoadedModel(runtime, "p", case["weights"])}
    out = run_task(plan, loaded, case["all_x"], case["all_y"], LocalTensors(), holdout=0.2,
                   holdout_ensemble=True)
    _check(out.metrics, case)
    runtime.set_weights(case["weights"])
    final = run_task(plan, loaded, case["all_x"], case["all_y"], LocalTensors(), holdout=0.2)
    assert final.metrics["holdout_accuracy"] == pytest.approx(case["final"])  # absent: the final output
    # the loss is the mean NLL of the mean softmax (computed here from torch's outputs)
    model = runtime.model
    runtime.set_weights(case["weights"])
    with torch.no_grad():
        model.eval()
        probs = torch.stack([torch.softmax(o, 1) for o in model(torch.from_numpy(case["x"]))]).mean(0)
    want = -float(torch.log(probs[torch.arange(len(case["y"])), torch.from_numpy(case["y"])]).mean())
    assert out.metrics["holdout_loss"] == pytest.approx(want, rel=1e-5)


def test_onnx_eval_graph_scores_the_servers_ensemble(case):
    runtime = OnnxEvalRuntime()
    runtime.load_program(export_inference(case["spec"]), "onnx/1")
    runtime.set_weights(case["weights"])
    assert [o.shape for o in runtime.outputs(case["x"][:0])] == [(0, 10)] * 2
    _check(holdout_metrics(runtime, case["x"], case["y"], ensemble=True), case)


@pytest.mark.parametrize("runtime_class,kernels", [(NativeExecutorchRuntime, "portable"),
                                                   (ExecutorchRuntime, "portable"),
                                                   (NativeExecutorchRuntime, "fused")])
def test_executorch_programs_score_the_servers_ensemble(case, program_for, runtime_class, kernels):
    runtime = runtime_class()
    runtime.load_program(program_for(case["spec"], CE, BATCH, kernels=kernels), "pte/1")
    runtime.set_weights(case["weights"])
    assert [o.shape for o in runtime.outputs(case["x"])] == [(60, 10)] * 2
    _check(holdout_metrics(runtime, case["x"], case["y"], ensemble=True), case)


def test_the_ort_training_runtime_scores_the_servers_ensemble(case, tmp_path):
    from export.onnx import export_ort_training_program

    (tmp_path / "program").write_bytes(export_ort_training_program(case["spec"], CE))
    weights = {f"w:{k}": v for k, v in case["weights"].items()}
    np.savez(tmp_path / "data.npz", x=case["x"], y=case["y"], **weights)
    script = ("import json, sys, numpy as np\n"
              "from sdk_device.holdout import holdout_metrics\n"
              "from sdk_device.runtimes.onnxruntime_runtime import OrtTrainingRuntime\n"
              "d = np.load(sys.argv[1] + '/data.npz'); r = OrtTrainingRuntime()\n"
              "r.load_program(open(sys.argv[1] + '/program', 'rb').read(), 'ort-training/1')\n"
              "r.set_weights({k[2:]: d[k] for k in d.files if k.startswith('w:')})\n"
              "print(json.dumps(holdout_metrics(r, d['x'], d['y'], ensemble=True)))\n")
    done = run_ort(["-c", script, str(tmp_path)])
    _check(json.loads(done.stdout.strip().splitlines()[-1]), case)


def test_litert_scores_the_servers_ensemble(case):
    from sdk_device.runtimes.litert_runtime import LiteRTRuntime

    if not Path(litert_python_path()).exists():
        pytest.fail(f"the litert-torch environment is missing ({litert_python_path()}): run "
                    "`sh scripts/setup-litert-env.sh` (make test does) or set FEDSDK_LITERT_PYTHON")
    runtime = LiteRTRuntime()
    runtime.load_program(export_tflite(case["spec"], batch=32), "tflite/1")
    runtime.set_weights(case["weights"])
    _check(holdout_metrics(runtime, case["x"], case["y"], ensemble=True), case)


def test_ensemble_scores_by_hand():
    y = np.array([0, 1])
    big = np.array([[4.0, 0.0], [0.0, 4.0]], np.float32)
    wrong = np.array([[0.0, 1.0], [1.0, 0.0]], np.float32)
    accuracy, loss = ensemble_scores([wrong, big], y)  # mean softmax still picks the right class
    p = (1 / (1 + math.e) + 1 / (1 + math.exp(-4))) / 2
    assert accuracy == 1.0 and loss == pytest.approx(-math.log(p))
    assert ensemble_scores([wrong], y)[0] == 0.0 and ensemble_scores([wrong], y[:0]) == (0.0, 0.0)


# -- on the wire -------------------------------------------------------------------------------
def test_task_holdout_ensemble_travels_and_a_non_bool_is_refused_in_one_line():
    assert msgs.decode(_task(holdout=0.1, holdout_ensemble=True)).holdout_ensemble is True
    assert msgs.decode(_task(holdout=0.1)).holdout_ensemble is None  # an older server
    task = msgs.decode(_task(holdout=0.1, holdout_ensemble=False))
    assert msgs.decode(msgs.encode(task)).holdout_ensemble is False
    for bad in ("true", 1, 0, [True], {"a": 1}):
        with pytest.raises(ProtocolError) as err:
            msgs.decode(_task(holdout=0.1, holdout_ensemble=bad))
        assert err.value.code == "invalid_field" and "holdout_ensemble" in err.value.detail
        assert "\n" not in str(err.value)


# -- a run -------------------------------------------------------------------------------------
def test_simulate_depthfl_with_holdout_writes_the_ensembles_held_back_accuracy(tmp_path):
    """``simulate --grid inprocess --method depthfl --model lenet5_multi_exit --tiers 2,1
    --holdout 0.2`` on digits, 2 rounds: every task asked for the ensemble, and each tier's
    row is the sample-weighted mean of the ensemble accuracy of the model each device received
    (computed here by the server's own ``ensemble_accuracy``) on its held-back split."""
    config = SimulationConfig(method="depthfl", model="lenet5_multi_exit", tiers=["2", "1"], devices=4,
                              rounds=2, holdout=0.2, grid="inprocess", partition="iid", seed=0,
                              train_samples=800, test_samples=200,
                              recipe=Recipe(epochs=1, batch_size=16, lr=0.05, momentum=0.9).to_dict())
    sim = Simulation(config, tmp_path / "run")
    report = sim.run()
    row = report.rows[-1]
    devices = sim.loop.grid.devices  # device id -> LocalDevice (its data as partitioned)
    by_tier: dict[str, list[tuple[float, float, int]]] = {}
    for u in sim.loop.last_updates:
        assert u.instruction.holdout == 0.2 and u.instruction.holdout_ensemble
        dev = devices[u.device_id]
        _, held = split_holdout(dev.y, 0.2)
        x, y = dev.x[held], dev.y[held]
        want = ensemble_accuracy(u.instruction.spec, u.instruction.weights, x, y)
        final = exit_accuracies(u.instruction.spec, u.instruction.weights, x, y)[-1]
        assert u.metrics["holdout_accuracy"] == pytest.approx(want, abs=1e-12)
        by_tier.setdefault(dev.info.tier, []).append((want, final, len(y)))
    assert set(by_tier) == {"2", "1"}
    for tier, scores in by_tier.items():
        n = sum(s for *_, s in scores)
        assert row[f"accuracy_holdout_tier_{tier}"] == pytest.approx(sum(a * s for a, _, s in scores) / n)
    # tier 2 has two outputs; its ensemble is not (here) what its final output scores
    n2 = sum(s for *_, s in by_tier["2"])
    assert row["accuracy_holdout_tier_2"] != pytest.approx(sum(f * s for _, f, s in by_tier["2"]) / n2)


# -- carried by the server's paths -------------------------------------------------------------
def test_a_resumed_task_and_a_bundles_members_keep_holdout_ensemble(tmp_path):
    from sdk_device.protocol.blobs import encode_tensors
    from sdk_device.transport.blob_store import BlobStore
    from server_toolkit.edge.bundle_relay import member_tasks
    from server_toolkit.methods.base import ModelRecord, TrainInstruction
    from server_toolkit.rounds.task_records import instruction_from_record, task_record

    spec = modelspec.make((1, 4, 4), 3, [{"op": "flatten"}, {"op": "linear", "in": 16, "out": 3}])
    weights = state_numpy(build_model(spec, seed=0))
    store = BlobStore(tmp_path / "blobs")
    blob = store.put(encode_tensors(weights))
    for flag in (True, False):
        sent = TrainInstruction("d", spec, weights, Recipe(), holdout=0.2, holdout_ensemble=flag)
        record = json.loads(json.dumps(task_record(sent, {"model": blob}, {"model": []})))
        assert instruction_from_record(record, store).holdout_ensemble is flag
    assert instruction_from_record({**record, "holdout_ensemble": None}, store).holdout_ensemble is False
    template = TrainInstruction("", spec, {}, Recipe(), models={"m_a": ModelRecord(spec, {})})
    plan = TaskPlan((TrainStep("model", Recipe()),), ("model", "m_a"),
                    members={"m_a": {"device": "a", "recipe": Recipe().to_dict()}})
    member = member_tasks(template, plan, {"a"}, 0.1, True)["a"]
    assert member.holdout == 0.1 and member.holdout_ensemble
