"""The device client written only from docs/protocol.md (``doc_client.py``) against the real
server: ``RoundLoop`` + ``MqttGrid`` over a real mosquitto. Two FedAvg rounds accepted; a
two-model task (a teacher trained first and returned, label counts asked for); and every
error the document promises for what the client does wrong.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from fedcore.recipe import Recipe
from fedcore.torch_model import build_model, state_numpy
from server_toolkit.methods.fedavg import FedAvg
from server_toolkit.methods.records import asking, with_teacher
from server_toolkit.models.zoo import model_spec

from .doc_client import DocClient
from .harness import RECIPE, Fleet

pytestmark = pytest.mark.integration
DEVICE = "doc-dev"


def _wait_for(predicate, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _errors(client: DocClient) -> list[dict]:
    return [m for m in client.received if m["type"] == "error"]


def _start(client: DocClient) -> threading.Thread:
    thread = threading.Thread(target=client.start().run, daemon=True)
    thread.start()
    return thread


def test_doc_client_takes_part_in_two_fedavg_rounds(mosquitto, tmp_path, one_torch_thread):
    fleet = Fleet(mosquitto.address, tmp_path)
    fleet.registry.add_device(DEVICE)
    loop = fleet.server(rounds=2, round_timeout_s=60)
    loop.start()
    initial = {k: v.copy() for k, v in loop.global_weights.items()}
    client = DocClient(mosquitto.address.host, mosquitto.address.port, fleet.fleet, DEVICE)
    _start(client)
    try:
        assert loop.grid.wait_for_devices(1, timeout_s=30) == 1
        after = []
        for rnd in (1, 2):
            row = loop.run_round(rnd)
            assert row["accepted"] == 1 and not row["rejected"], row
            after.append({k: v.copy() for k, v in loop.global_weights.items()})
        _wait_for(lambda: len(client.answers) == 2)
    finally:
        client.stop()
        loop.grid.close()
        fleet.close()
    assert [a["type"] for a in client.answers.values()] == ["ack", "ack"]
    assert all(a["detail"] == "persisted" for a in client.answers.values())
    # FedAvg of one device is its update: every tensor is 0.98 of the one before
    for before, now in ((initial, after[0]), (after[0], after[1])):
        assert set(now) == set(before)
        for name in now:
            np.testing.assert_allclose(now[name], before[name] * 0.98, rtol=1e-6, atol=1e-7)
            assert not np.array_equal(now[name], before[name]) or not before[name].any()
    updates = fleet.registry.updates(2)
    assert [u["device_id"] for u in updates] == [DEVICE] and updates[0]["num_samples"] == client.num_samples
    assert not _errors(client)
    tasks = [m for m in client.received if m["type"] == "task"]
    assert [t["round"] for t in tasks] == [1, 2] and tasks[0]["task_id"] != tasks[1]["task_id"]


def test_doc_client_gets_the_documented_errors(mosquitto, tmp_path, one_torch_thread):
    fleet = Fleet(mosquitto.address, tmp_path)
    fleet.registry.add_device(DEVICE)
    host, port = mosquitto.address.host, mosquitto.address.port
    stranger = DocClient(host, port, fleet.fleet, "not-registered").start()
    client = DocClient(host, port, fleet.fleet, DEVICE)
    client.misbehave = {1: "missing_record", 2: "unexpected_record", 3: "refuse"}
    client.start()
    # rounds 1 and 2 last their deadline: a rejection of the result message alone leaves the
    # task open (protocol §10.2); the client answers within a second, so 20 s is plenty
    loop = fleet.server(rounds=3, round_timeout_s=20)
    loop.start()
    initial = {k: v.copy() for k, v in loop.global_weights.items()}
    try:
        # before any hello: envelope errors (§5.2, §11), answered with ref null
        v1_hello = {"schema": 1, "type": "hello", "msg_id": uuid.uuid4().hex, "sent_at": time.time(),
                    "device_id": DEVICE, "runtimes": ["torch"], "num_samples": 10, "profile": {}}
        client.send_raw(json.dumps(v1_hello).encode())
        client.send_raw(json.dumps({"schema": 2, "type": "goodbye"}).encode())
        client.send_raw(b"\xef\xbb\xbf{}")
        client.send("task", task_id="x", round=1, programs={"model": []}, arrays={"model": {
            "id": "0" * 64, "size": 1, "kind": "weights", "format": "safetensors"}}, config={}, deadline=0.0)
        client.send("blob_request", blob="ab" * 32, indices=[0], chunk_bytes=1024)
        stranger.hello()
        _wait_for(lambda: len(_errors(client)) == 5 and _errors(stranger))
        assert [(e["code"], e["ref"]) for e in _errors(client)] == [
            ("unsupported_schema", None), ("unknown_type", None), ("malformed", None),
            ("invalid_field", None), ("not_offered", "ab" * 32)]
        assert [(e["code"], e["ref"]) for e in _errors(stranger)] == [("unknown_device", None)]
        # then a proper hello, and three rounds in which the client does something wrong
        threading.Thread(target=client.run, daemon=True).start()
        assert loop.grid.wait_for_devices(1, timeout_s=30) == 1
        rows = [loop.run_round(rnd) for rnd in (1, 2, 3)]
        _wait_for(lambda: len(client.answers) == 2)
        first = next(m for m in client.received if m["type"] == "task" and m["round"] == 1)
        late = {**client.last_result, "task_id": first["task_id"], "round": 1}
        client.send("result", **late)  # a result for a closed round
        _wait_for(lambda: (loop.grid.poll(0.1), any(e["code"] == "round_closed" for e in _errors(client)))[1])
    finally:
        client.stop()
        stranger.stop()
        loop.grid.close()
        fleet.close()
    assert [r["accepted"] for r in rows] == [0, 0, 0]
    assert [r["rejected"] for r in rows] == [1, 1, 1]
    recorded = [[r["code"] for r in fleet.registry.rejections(rnd)] for rnd in (1, 2, 3)]
    assert recorded == [["missing_record", "round_closed"],  # the late result counts in its round
                        ["unexpected_record"], ["device:unsupported_task"]]
    before = sorted(r["code"] for r in fleet.registry.rejections() if r["round"] is None)
    assert before == ["invalid_field", "malformed", "unknown_device", "unknown_type", "unsupported_schema"]
    tasks = {m["round"]: m["task_id"] for m in client.received if m["type"] == "task"}
    answers = {e["code"]: e["ref"] for e in _errors(client)[5:]}
    assert answers == {"missing_record": tasks[1], "unexpected_record": tasks[2], "round_closed": tasks[1]}
    assert all(np.array_equal(loop.global_weights[k], v) for k, v in initial.items())


def test_doc_client_trains_a_teacher_first_and_returns_both_models(mosquitto, tmp_path, one_torch_thread):
    """The two-model task of §5.6: a teacher (the §12.5 network: BatchNorm, residual, exit) trained
    first and returned, the label counts and (declined) features asked for."""
    teacher_spec = {"format": "torchspec/1", "input_shape": [1, 8, 8], "num_classes": 10, "layers": [
        {"op": "conv2d", "in": 1, "out": 4, "k": 3, "pad": 1, "bias": False}, {"op": "batchnorm2d", "c": 4},
        {"op": "relu"}, {"op": "residual", "body": [{"op": "conv2d", "in": 4, "out": 4, "k": 3, "pad": 1},
                                                     {"op": "relu"}], "shortcut": []},
        {"op": "maxpool2d", "k": 2},
        {"op": "exit", "head": [{"op": "flatten"}, {"op": "linear", "in": 64, "out": 10}]},
        {"op": "gap"}, {"op": "flatten"}, {"op": "dropout", "p": 0.25}, {"op": "linear", "in": 4, "out": 10}]}
    teacher = state_numpy(build_model(teacher_spec, seed=1))

    class TeacherFirst(FedAvg):
        name = ""  # a test method

        def configure_train(self, round_number, global_weights, devices):
            return [asking(with_teacher(i, teacher_spec, teacher, train_first=Recipe(), returned=True),
                           label_counts={}, features={"samples": 8})
                    for i in super().configure_train(round_number, global_weights, devices)]

    fleet = Fleet(mosquitto.address, tmp_path)
    fleet.registry.add_device(DEVICE)
    method = TeacherFirst(model_spec("small_cnn", fleet.data.input_shape, fleet.data.num_classes), RECIPE)
    loop = fleet.server(rounds=1, method=method, round_timeout_s=60)
    loop.start()
    initial = {k: v.copy() for k, v in loop.global_weights.items()}
    client = DocClient(mosquitto.address.host, mosquitto.address.port, fleet.fleet, DEVICE)
    _start(client)
    try:
        assert loop.grid.wait_for_devices(1, timeout_s=30) == 1
        row = loop.run_round(1)
        _wait_for(lambda: len(client.answers) == 1)
    finally:
        client.stop()
        loop.grid.close()
        fleet.close()
    assert row["accepted"] == 1 and not row["rejected"], row
    assert [a["type"] for a in client.answers.values()] == ["ack"]
    task = next(m for m in client.received if m["type"] == "task")
    assert set(task["programs"]) == set(task["arrays"]) == {"model", "teacher"}
    assert [s["train"] for s in task["config"]["steps"]] == ["teacher", "model"]
    (update,) = loop.last_updates
    assert set(update.others) == {"teacher"}  # features declined: no record, still accepted
    for name, value in teacher.items():
        np.testing.assert_allclose(update.others["teacher"][name], value * 0.98, rtol=1e-6)
    for name, value in initial.items():
        np.testing.assert_allclose(update.weights[name], value * 0.98, rtol=1e-6)
    assert update.metrics["label_counts"] == np.bincount(client.labels).tolist()


def test_the_client_uses_only_the_document():
    source = "".join((Path(__file__).parent / name).read_text(encoding="utf-8")
                     for name in ("doc_client.py", "doc_client_formats.py"))
    imported = re.findall(r"^\s*(?:from|import) ([\w.]+)", source, re.M)
    allowed = {"__future__", "hashlib", "json", "queue", "re", "struct", "threading", "time", "uuid",
               "pathlib", "numpy", "paho.mqtt.client", "safetensors.numpy", ".doc_client_formats"}
    assert set(imported) <= allowed, imported
