"""Held-back accuracy of a *nested* width deployment (``task.holdout_members``, issue 32): a
device scores the mean softmax of its window and the narrower fleet windows exactly as the
server's ``members_accuracy`` does (torch and ONNX runtimes); HeteroFL's ``also_narrowest`` /
``also_nested`` tasks reference their own ``"narrow"`` / ``"nested_k"`` models and plain
HeteroFL adds untrained ones; the field on the wire and through a resumed task record; an
in-process ``simulate --method heterofl ... --method-option deploy=nested --holdout 0.2``."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest

from export.onnx import export_inference
from fedcore.recipe import Recipe
from fedcore.torch_model import build_model, state_numpy
from fedcore.torch_train import train_model
from sdk_device.holdout import check_members, holdout_metrics, split_holdout
from sdk_device.protocol import messages as msgs
from sdk_device.protocol.errors import ProtocolError
from sdk_device.runtimes.onnxruntime_runtime import OnnxEvalRuntime
from server_toolkit.data.datasets import load_dataset
from server_toolkit.methods import method_class
from server_toolkit.methods.base import DeviceInfo
from server_toolkit.methods.tier_accuracy import members_accuracy, model_accuracy
from server_toolkit.models.zoo import model_spec
from server_toolkit.rounds.local_device import LocalDevice, TorchRuntimePool, train_on_device
from server_toolkit.sim.simulate import Simulation, SimulationConfig
from tests.unit.test_holdout import _task  # the wire task the held-back tests share

TIERS = ("1.0", "0.5", "0.25")


@pytest.fixture(scope="module")
def case() -> dict:
    """small_cnn on digits, the full model trained for 60 steps (the windows disagree on some
    samples), and one full-width device with 300 samples of its own."""
    data = load_dataset("digits", seed=0)
    spec = model_spec("small_cnn", data.input_shape, data.num_classes)
    probe = method_class("heterofl")(spec, Recipe(), deploy="nested")
    model = build_model(probe.global_spec, seed=3)
    train_model(model, data.x_train[:600], data.y_train[:600],
                Recipe(epochs=1, batch_size=16, lr=0.05, momentum=0.9, max_steps=60, seed=1))
    x, y = data.x_train[600:900], data.y_train[600:900]
    _, held = split_holdout(y, 0.2)
    return {"spec": spec, "weights": state_numpy(model), "x": x, "y": y, "held": held}


def _planned(case: dict, **options):
    """The method, the full device and its task (three tiers asked to train)."""
    method = method_class("heterofl")(case["spec"], Recipe(epochs=1, batch_size=16, max_steps=3), **options)
    devices = [DeviceInfo(f"d{t}", 100, t) for t in TIERS]
    instruction = method.configure_train(1, case["weights"], devices)[0]
    assert instruction.device_id == "d1.0"
    return method, devices[0], instruction


@pytest.mark.parametrize("options, extra, names", [
    ({"deploy": "nested"}, ["member_1", "member_2"], ("member_1", "member_2")),
    ({"deploy": "nested", "also_narrowest": 0.25}, ["member_1"], ("member_1", "narrow")),
    ({"deploy": "nested", "also_narrowest": 0.25, "also_nested": True}, [], ("nested_1", "narrow")),
])
def test_a_full_device_scores_the_nested_ensemble_as_the_server_does(case, options, extra, names):
    method, device, instruction = _planned(case, **options)
    added, members = method.holdout_members(case["weights"], device, instruction)
    assert sorted(added) == extra and members == names
    task = dataclasses.replace(instruction, models={**instruction.models, **added},
                                             holdout=0.2, holdout_members=members)
    local = LocalDevice(device, case["x"], case["y"])
    update = train_on_device(local, task, TorchRuntimePool())
    assert set(update.others) == set(instruction.returns) - {"model"}  # the extra ones are not returned
    x, y = case["x"][case["held"]], case["y"][case["held"]]
    windows = method.deployable_members(case["weights"], device)
    assert len(windows) == 3
    want = members_accuracy(windows, x, y)
    own = model_accuracy(*windows[0], x, y)
    assert want != own  # otherwise this test could not fail
    assert update.metrics["holdout_accuracy"] == pytest.approx(want, abs=1e-12)
    alone = train_on_device(local, dataclasses.replace(task, holdout_members=()), TorchRuntimePool())
    assert alone.metrics["holdout_accuracy"] == pytest.approx(own, abs=1e-12)


def test_onnx_eval_graphs_score_the_same_members(case):
    method, device, _ = _planned(case, deploy="nested")
    windows = method.deployable_members(case["weights"], device)
    runtimes = []
    for spec, weights in windows:
        runtime = OnnxEvalRuntime()
        runtime.load_program(export_inference(spec), "onnx/1")
        runtime.set_weights(weights)
        runtimes.append(runtime)
    x, y = case["x"][case["held"]], case["y"][case["held"]]
    got = holdout_metrics(runtimes[0], x, y, members=runtimes[1:])
    assert got["holdout_accuracy"] == pytest.approx(members_accuracy(windows, x, y), abs=1e-12)
    assert got["holdout_samples"] == len(y) and got["holdout_loss"] is not None


def test_window_deployment_and_a_device_without_torch_get_no_members(case):
    method, device, instruction = _planned(case)
    assert method.holdout_members(case["weights"], device, instruction) == ({}, ())
    method, device, instruction = _planned(case, deploy="nested")
    onnx_only = DeviceInfo(device.device_id, 100, device.tier, runtimes=("onnxruntime",))
    assert method.holdout_members(case["weights"], onnx_only, instruction) == ({}, ())


def test_task_holdout_members_travels_and_bad_values_are_refused_in_one_line():
    base = json.loads(_task(holdout=0.1))
    models = sorted(base["programs"])
    assert msgs.decode(_task(holdout=0.1)).holdout_members is None  # an older server
    good = msgs.decode(_task(holdout=0.1, holdout_members=models[:1]))
    assert good.holdout_members == models[:1] and msgs.decode(msgs.encode(good)).holdout_members == models[:1]
    assert msgs.decode(_task(holdout=0.1, holdout_members=[])).holdout_members == []
    for bad in ("model", [3], ["Model!"], [f"m{i}" for i in range(9)]):  # the wire's own checks
        with pytest.raises(ProtocolError) as err:
            msgs.decode(_task(holdout=0.1, holdout_members=bad))
        assert err.value.code == "invalid_field" and "holdout_members" in err.value.detail, bad
        assert "\n" not in str(err.value)
    # the agent's checks against the task's models (refused as invalid_field, agent.py)
    task_models = {"model", "narrow", "member_1"}
    assert check_members(None, task_models, "model") == () == check_members([], task_models, "model")
    assert check_members(["narrow", "member_1"], task_models, "model") == ("narrow", "member_1")
    for bad in (["absent"], ["narrow", "narrow"], ["model"], ["narrow"] * 9):
        with pytest.raises(ValueError, match="holdout_members") as err:
            check_members(bad, task_models, "model")
        assert "\n" not in str(err.value)


def test_a_resumed_task_keeps_holdout_members(tmp_path):
    from fedcore import modelspec
    from sdk_device.protocol.blobs import encode_tensors
    from sdk_device.transport.blob_store import BlobStore
    from server_toolkit.methods.base import ModelRecord, TrainInstruction
    from server_toolkit.rounds.task_records import instruction_from_record, task_record

    spec = modelspec.make((1, 4, 4), 3, [{"op": "flatten"}, {"op": "linear", "in": 16, "out": 3}])
    weights = state_numpy(build_model(spec, seed=0))
    store = BlobStore(tmp_path / "blobs")
    blob = store.put(encode_tensors(weights))
    sent = TrainInstruction("d", spec, weights, Recipe(), models={"member_1": ModelRecord(spec, weights)},
                            holdout=0.2, holdout_members=("member_1",))
    record = json.loads(json.dumps(task_record(sent, {"model": blob, "member_1": blob},
                                               {"model": [], "member_1": []})))
    back = instruction_from_record(record, store)
    assert back.holdout_members == ("member_1",) and set(back.models) == {"member_1"}
    assert instruction_from_record({**record, "holdout_members": None}, store).holdout_members == ()


def test_simulate_heterofl_nested_with_holdout_writes_the_nested_ensembles_held_back_accuracy(tmp_path):
    """``simulate --grid inprocess --method heterofl --tiers 1.0,0.5,0.25 --method-option
    also_narrowest=0.25 --method-option deploy=nested --holdout 0.2`` on digits, 2 rounds: each
    tier's held-back row is the sample-weighted mean of ``members_accuracy`` of the windows
    each device's task sent (its own, then its ``holdout_members``) on its held-back split."""
    config = SimulationConfig(method="heterofl", model="small_cnn", tiers=list(TIERS), devices=6, rounds=2,
                              holdout=0.2, grid="inprocess", partition="iid", seed=0, train_samples=900,
                              test_samples=200, method_options={"also_narrowest": 0.25, "deploy": "nested"},
                              recipe=Recipe(epochs=1, batch_size=16, lr=0.05, momentum=0.9).to_dict())
    sim = Simulation(config, tmp_path / "run")
    row = sim.run().rows[-1]
    devices = sim.loop.grid.devices
    by_tier: dict[str, list[tuple[float, float, int]]] = {}
    for u in sim.loop.last_updates:
        ins, dev = u.instruction, devices[u.device_id]
        _, held = split_holdout(dev.y, 0.2)
        x, y = dev.x[held], dev.y[held]
        wanted = {"1.0": 2, "0.5": 1, "0.25": 0}[dev.info.tier]
        assert len(ins.holdout_members) == wanted
        windows = [(ins.spec, ins.weights)] + [(ins.models[n].spec, ins.models[n].weights)
                                               for n in ins.holdout_members]
        want = members_accuracy(windows, x, y)
        assert u.metrics["holdout_accuracy"] == pytest.approx(want, abs=1e-12)
        own = model_accuracy(ins.spec, ins.weights, x, y)
        by_tier.setdefault(dev.info.tier, []).append((want, own, len(y)))
    assert set(by_tier) == set(TIERS)
    for tier, scores in by_tier.items():
        n = sum(s for *_, s in scores)
        assert row[f"accuracy_holdout_tier_{tier}"] == pytest.approx(sum(a * s for a, _, s in scores) / n)
    own = {t: sum(o * s for _, o, s in v) / sum(s for *_, s in v) for t, v in by_tier.items()}
    assert row["accuracy_holdout_tier_1.0"] != pytest.approx(own["1.0"])  # not the own window's score
    assert row["accuracy_holdout_tier_0.25"] == pytest.approx(own["0.25"])  # no narrower window


@pytest.mark.parametrize("members", [["absent"], ["narrow", "narrow"], ["model"]])
def test_the_agent_refuses_bad_holdout_members_in_one_line_before_loading(tmp_path, members):
    from sdk_device.agent import DeviceAgent
    from tests.unit.test_agent_secure_recipes import REF, _agent

    agent, endpoint = _agent(tmp_path)
    assert isinstance(agent, DeviceAgent)
    config = {"steps": [{"train": "model", "recipe": Recipe().to_dict()}], "return": ["model"], "report": {}}
    now = time.time()
    task = msgs.Task(task_id=msgs.new_id(), round=3, programs={"model": [REF], "narrow": [REF]},
                     arrays={"model": REF, "narrow": REF}, config=config, deadline=now + 60, server_time=now,
                     holdout=0.2, holdout_members=members)
    agent._run_task(task, time.monotonic())
    [(_, error)] = endpoint.sent  # the endpoint fails any fetch: refused before loading
    assert isinstance(error, msgs.Error) and error.ref == task.task_id
    assert error.code == "invalid_field" and "holdout_members" in error.detail and "\n" not in error.detail
    assert agent._trained == 0
