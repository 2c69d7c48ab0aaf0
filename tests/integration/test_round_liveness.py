"""Rounds against a fleet that disappears, and results that are not what they claim.

Real mosquitto, real device processes: a broker SIGTERM mid-run (every device's will fires)
makes the next round wait until the broker and devices are back; a fleet that never comes
back fails the run (non-zero exit, one line); garbage and a forged result on a device's
topic do not cost the device its round, and every rejection carries its round.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from sdk_device.protocol import messages as msgs
from sdk_device.protocol.topics import FleetTopics
from sdk_device.transport.blob_store import BlobStore
from sdk_device.transport.endpoint import SERVER, Endpoint
from server_toolkit.fleet.registry import FleetRegistry
from server_toolkit.sim.simulate import start_device_process, stop_processes

from .harness import Fleet

pytestmark = pytest.mark.integration


def test_a_broker_restart_mid_run_makes_rounds_wait_for_the_fleet_and_then_finish(mosquitto, tmp_path):
    fleet = Fleet(mosquitto.address, tmp_path)
    devices = ["a", "b", "c"]
    rows: list[dict] = []
    try:
        for dev, path in fleet.write_data(devices, "iid").items():
            fleet.start_process(dev, path)
        loop = fleet.server(rounds=3, round_timeout_s=60, min_devices=2, fleet_timeout_s=120,
                            status_every_s=2)
        loop.on_round = rows.append
        loop.start()
        assert loop.grid.wait_for_devices(3, timeout_s=120) == 3
        outcome: dict = {}
        thread = threading.Thread(target=lambda: outcome.update(rows=loop.run()), daemon=True)
        thread.start()
        deadline = time.monotonic() + 120
        while not rows and time.monotonic() < deadline:
            time.sleep(0.1)
        assert rows, "round 1 never finished"
        mosquitto.stop()  # SIGTERM: mosquitto publishes every device's will
        time.sleep(3)
        mosquitto.start()
        thread.join(timeout=300)
        assert not thread.is_alive(), "the run did not finish after the broker came back"
    finally:
        fleet.close()
    assert [r["round"] for r in outcome["rows"]] == [1, 2, 3]
    assert all(r["accepted"] >= 2 for r in outcome["rows"]), outcome["rows"]
    assert outcome["rows"][-1]["accuracy"] > 0.5


def test_a_fleet_that_never_comes_back_fails_the_run_after_the_fleet_timeout(mosquitto, tmp_path):
    run_dir = tmp_path / "run"
    registry = FleetRegistry(run_dir / "registry.sqlite")
    fleet = Fleet(mosquitto.address, tmp_path / "devices", fleet="harness")  # for its data; idle server
    paths = fleet.write_data(["a", "b"], "iid")
    procs = []
    for dev in paths:
        registry.add_device(dev)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    server = subprocess.Popen(
        [sys.executable, "-m", "server_toolkit.cli", "run", "--broker", mosquitto.url, "--fleet", "cli",
         "--run-dir", str(run_dir), "--rounds", "200", "--min-devices", "2", "--fleet-timeout", "8",
         "--round-timeout", "20", "--local-epochs", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        for dev, path in paths.items():
            procs.append(start_device_process(mosquitto.url, "cli", dev, path, tmp_path / dev,
                                              tmp_path / f"{dev}.log"))
        metrics = run_dir / "metrics.jsonl"
        deadline = time.monotonic() + 180
        while not (metrics.exists() and metrics.read_text().strip()) and time.monotonic() < deadline:
            assert server.poll() is None, server.communicate()
            time.sleep(0.2)
        assert metrics.exists(), "round 1 never finished"
        started = time.monotonic()
        stop_processes(procs)  # every device leaves for good
        out, err = server.communicate(timeout=120)
        waited = time.monotonic() - started
    finally:
        if server.poll() is None:
            server.kill()
        stop_processes(procs)
        fleet.close()
    assert server.returncode != 0, out
    assert "(--min-devices) came back within 8 s (--fleet-timeout)" in err, err
    assert "waits: 0 devices online, need 2 (--min-devices)" in err, err
    assert waited >= 8
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert rows[0]["accepted"] == 2
    assert len(rows) < 200  # (rounds take ~1 s: enough of them that the devices leave mid-run)
    assert all(r["accepted"] == 2 for r in rows[:-1])
    if rows[-1]["accepted"] == 0:  # a round had started: its devices left mid-training
        assert "all 2 selected devices went offline or refused" in err, err


class Spy(Endpoint):
    """Reads a device's tasks and writes on its topics (anyone can, on an anonymous broker);
    answers no blob request (an answering spy could refuse the device's own blobs: only a
    secured broker's ACL stops that)."""

    def _serve(self, peer, request):
        pass


def test_garbage_and_a_forged_result_do_not_cost_a_device_its_round(mosquitto, tmp_path):
    fleet = Fleet(mosquitto.address, tmp_path)
    spy = Spy(fleet.broker, FleetTopics(fleet.fleet), BlobStore(tmp_path / "spy"), device_id="victim",
                   client_id="spy", ephemeral=True).start()
    try:
        for dev, path in fleet.write_data(["victim", "other"], "iid").items():
            fleet.start_process(dev, path)
        loop = fleet.server(rounds=1, round_timeout_s=90)
        loop.start()
        assert loop.grid.wait_for_devices(2, timeout_s=120) == 2
        outcome: dict = {}
        thread = threading.Thread(target=lambda: outcome.update(rows=loop.run()), daemon=True)
        thread.start()
        task = _next_task(spy, timeout_s=60)
        topic = fleet.endpoint.topics.up("victim")
        spy.link.publish(topic, b"{not json")  # garbage
        spy.link.publish(topic, json.dumps({"schema": 99, "type": "result"}).encode())  # wrong schema
        never_offered = msgs.BlobRef(id="ab" * 32, size=1000, kind="weights", format="safetensors")
        spy.send(SERVER, msgs.Result(task_id=msgs.new_id(), round=task.round, arrays={"model": never_offered},
                                     metrics={"samples": 10}))  # a task id the server never issued
        spy.send(SERVER, msgs.Result(task_id=task.task_id, round=task.round, arrays={"model": never_offered},
                                     metrics={"samples": 10}))  # the victim's task, a blob it never offered
        spy.send(SERVER, msgs.Result(task_id=task.task_id, round=task.round, arrays=dict(task.arrays),
                                     metrics={"samples": 10}))  # ... naming the weights the server sent
        thread.join(timeout=180)
        assert not thread.is_alive()
    finally:
        spy.close()
        fleet.close()
    row = outcome["rows"][0]
    assert row["accepted"] == 2, row
    assert {u["device_id"] for u in fleet.registry.updates(1)} == {"victim", "other"}
    sent = {ref.id for ref in task.arrays.values()}
    assert not any(u["blob_id"] in sent for u in fleet.registry.updates(1))  # the victim's own result won
    rejections = fleet.registry.rejections()
    codes = {r["code"] for r in rejections if r["device_id"] == "victim"}
    assert {"malformed", "unsupported_schema", "unknown_task", "not_offered"} <= codes, rejections
    assert all(r["round"] == 1 for r in rejections), rejections  # every rejection carries its round


def _next_task(spy: Endpoint, timeout_s: float) -> msgs.Task:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            incoming = spy.inbox.get(timeout=0.5)
        except Exception:
            continue
        if isinstance(incoming.message, msgs.Task):
            return incoming.message
    raise AssertionError("the spy never saw the victim's task")
