"""Broker crashes and restarts between rounds, a device restarted mid-upload, a server restarted
mid-round, and numbers that overflow: no round waits its deadline for devices that are alive,
none is empty, nothing acknowledged is lost, and nothing a dead process left behind is booked.

Real mosquitto on a fixed port (killed and started again), real ``fedsdk run`` device processes
(the restarted device and the spy are in-process, to control when they die and what they send).
"""

from __future__ import annotations

import logging
import re
import signal
import threading
import time

import pytest

from fedcore.recipe import Recipe
from sdk_device.agent import DeviceAgent
from sdk_device.protocol import messages as msgs
from sdk_device.protocol.blobs import DEFAULT_CHUNK_BYTES
from sdk_device.protocol.topics import FleetTopics
from sdk_device.transport.blob_store import BlobStore
from sdk_device.transport.endpoint import SERVER, Endpoint
from server_toolkit.broker.mosquitto import MosquittoBroker
from server_toolkit.methods.fedavg import FedAvg
from server_toolkit.models.zoo import model_spec
from server_toolkit.rounds.mqtt_grid import MqttGrid

from .harness import Fleet

pytestmark = pytest.mark.integration

ROUND_TIMEOUT_S = 120.0  # a round that waited for lost tasks would take this long
FAST = Recipe(epochs=1, batch_size=16, lr=0.05)
ACKED = re.compile(r"server accepted the result of task ([0-9a-f]{8})")


def run_through_a_broker_fault(fleet: Fleet, broker: MosquittoBroker, kill: bool, rounds: int = 3):
    """Three device processes, ``rounds`` rounds; right after round 1 closes the broker dies
    (SIGKILL or SIGTERM) and starts again on the same port 2 s later. The devices are paused
    meanwhile and resume 3 s after the server is back, so the server publishes round 2's tasks
    before they have subscribed again: the order a crash produces when the server reconnects
    first (left to chance, the devices often win the race). Returns (rows, grid)."""
    devices = ["a", "b", "c"]
    for dev, path in fleet.write_data(devices, "iid").items():
        fleet.start_process(dev, path)
    spec = model_spec("small_cnn", fleet.data.input_shape, fleet.data.num_classes)
    loop = fleet.server(rounds=rounds, method=FedAvg(spec, FAST), round_timeout_s=ROUND_TIMEOUT_S,
                        min_devices=3, fleet_timeout_s=120)

    def resume_devices() -> None:
        for proc in fleet.procs:
            proc.send_signal(signal.SIGCONT)

    def crash_after_round_1(row: dict) -> None:
        if row["round"] != 1:  # before round 2's tasks go out
            return
        for proc in fleet.procs:
            proc.send_signal(signal.SIGSTOP)
        broker.stop(kill=kill)
        time.sleep(2)
        broker.start()
        deadline = time.monotonic() + 60
        while not fleet.endpoint.link.connected and time.monotonic() < deadline:
            time.sleep(0.05)
        threading.Timer(3.0, resume_devices).start()

    loop.on_round = crash_after_round_1
    loop.start()
    assert loop.grid.wait_for_devices(3, timeout_s=120) == 3
    try:
        rows = loop.run()
    finally:
        resume_devices()
        loop.grid.close()
    return rows, loop.grid


def assert_no_round_lost(fleet: Fleet, rows: list[dict], grid: MqttGrid, rounds: int = 3) -> None:
    assert [r["round"] for r in rows] == list(range(1, rounds + 1))
    for row in rows:  # every device was alive: every round holds all three, none waited its deadline
        assert row["accepted"] == 3, rows
        assert row["seconds"] < ROUND_TIMEOUT_S / 3, rows
    stored = {u["task_id"] for rnd in range(1, rounds + 1) for u in fleet.registry.updates(rnd)}
    assert len(stored) == 3 * rounds
    assert set(grid._answers) <= stored  # every update the server acknowledged is stored ...
    acked_by_devices = {m for dev in "abc" for m in ACKED.findall((fleet.root / f"{dev}.log").read_text())}
    assert acked_by_devices and acked_by_devices <= {t[:8] for t in stored}  # ... and was aggregated


def test_a_broker_killed_right_after_a_round_closes_costs_no_round(mosquitto, tmp_path):
    fleet = Fleet(mosquitto.address, tmp_path)
    try:
        rows, grid = run_through_a_broker_fault(fleet, mosquitto, kill=True)
    finally:
        fleet.close()
    assert_no_round_lost(fleet, rows, grid)


def test_a_broker_stopped_without_persistence_costs_no_round(tmp_path):
    broker = MosquittoBroker(workdir=tmp_path / "mosquitto", persistence=False).start()
    fleet = Fleet(broker.address, tmp_path)
    try:
        rows, grid = run_through_a_broker_fault(fleet, broker, kill=False)
    finally:
        fleet.close()
        broker.stop()
    assert_no_round_lost(fleet, rows, grid)


class Unresponsive(Endpoint):
    """Offers its result but serves no chunk of it: the process dies mid-upload."""

    def _serve(self, peer, request):
        pass


def test_a_device_restarted_mid_upload_runs_its_task_again_and_nothing_is_booked(mosquitto, tmp_path, caplog):
    fleet = Fleet(mosquitto.address, tmp_path)
    config = fleet.agent_config("flaky", fleet.write_data(["flaky"], "iid")["flaky"])
    dying = Unresponsive(fleet.broker, FleetTopics(fleet.fleet), BlobStore(config.work_dir / "blobs"),
                         device_id="flaky", chunk_bytes=DEFAULT_CHUNK_BYTES)
    first = fleet.start_thread(DeviceAgent(config, endpoint=dying))
    spec = model_spec("small_cnn", fleet.data.input_shape, fleet.data.num_classes)
    loop = fleet.server(rounds=1, method=FedAvg(spec, FAST), round_timeout_s=ROUND_TIMEOUT_S)
    outcome: dict = {}
    try:
        loop.start()
        assert loop.grid.wait_for_devices(1, timeout_s=120) == 1
        thread = threading.Thread(target=lambda: outcome.update(rows=loop.run()), daemon=True)
        thread.start()
        deadline = time.monotonic() + 120
        while not loop.grid._pulls:
            assert time.monotonic() < deadline, "the server never pulled flaky's result"
            time.sleep(0.05)
        first.stop()  # the process dies with its offer; the round waits for it to come back
        time.sleep(7)  # the pull asks again after 5 s without a chunk: it waits in flaky's session
        with caplog.at_level(logging.INFO):
            fleet.start_thread(DeviceAgent(config), register=False)  # the restarted process
            thread.join(timeout=150)
        assert not thread.is_alive()
    finally:
        fleet.close()
    refused = [r for r in caplog.records if "refused" in r.getMessage() and "not_offered" in r.getMessage()]
    assert refused, "the restarted process never refused the dead one's blob requests"
    row = outcome["rows"][0]
    assert row["accepted"] == 1 and row["rejected"] == 0, row
    assert row["seconds"] < ROUND_TIMEOUT_S / 2, row  # its task was sent again: no wait for the deadline
    assert [u["device_id"] for u in fleet.registry.updates(1)] == ["flaky"]
    assert fleet.registry.rejections() == []  # the dead process's refusals are not the device's


class Spy(Endpoint):
    """Writes on a device's topics and reads its down topic (anyone can, on an anonymous broker)."""


def spy_on(fleet: Fleet, dev: str, root) -> Spy:
    return Spy(fleet.broker, FleetTopics(fleet.fleet), BlobStore(root), device_id=dev, client_id=f"spy-{dev}",
               ephemeral=True).start()


def answer_to(grid: MqttGrid, spy: Spy, timeout_s: float = 30) -> msgs.Error:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        grid.poll(0.05)
        if not spy.inbox.empty():
            message = spy.inbox.get().message
            if isinstance(message, msgs.Error):
                return message
    raise AssertionError("the server sent no error")


def test_a_result_for_a_task_of_a_killed_server_instance_is_an_unknown_task(mosquitto, tmp_path):
    fleet = Fleet(mosquitto.address, tmp_path)
    spy = spy_on(fleet, "pi", tmp_path / "spy")
    fleet.registry.add_device("pi")
    # what the killed instance left: round 2 closed, round 3 open with a task for "pi" in each
    fleet.registry.open_round(2, ["pi"], "")
    fleet.registry.add_task("t" * 32, 2, "pi", {})
    fleet.registry.close_round(2, {"round": 2})
    fleet.registry.open_round(3, ["pi"], "")
    fleet.registry.add_task("e" * 32, 3, "pi", {})
    grid = MqttGrid(fleet.endpoint, fleet.registry)  # the restarted server
    weights = {"model": msgs.BlobRef(id="ab" * 32, size=100, kind="weights", format="safetensors")}
    try:
        spy.send(SERVER, msgs.Result(task_id="e" * 32, round=3, arrays=weights, metrics={"samples": 9}))
        unknown = answer_to(grid, spy)
        spy.send(SERVER, msgs.Result(task_id="t" * 32, round=2, arrays=weights, metrics={"samples": 9}))
        closed = answer_to(grid, spy)
    finally:
        spy.close()
        grid.close()
        fleet.close()
    assert (unknown.code, unknown.ref) == ("unknown_task", "e" * 32)  # round 3 runs again: not "over"
    assert (closed.code, closed.detail, closed.ref) == ("round_closed", "round 2 is over", "t" * 32)


def test_a_400_digit_number_in_a_hello_gets_malformed_and_no_traceback(mosquitto, tmp_path, caplog):
    fleet = Fleet(mosquitto.address, tmp_path)
    spy = spy_on(fleet, "pi", tmp_path / "spy")
    fleet.registry.add_device("pi")
    grid = MqttGrid(fleet.endpoint, fleet.registry)
    hello = '{"schema":2,"type":"hello","device_id":"pi","runtimes":[],"num_samples":%s,"profile":{}}'
    try:
        with caplog.at_level(logging.WARNING):
            spy.link.publish(spy.topics.up("pi"), (hello % ("9" * 400)).encode())
            malformed = answer_to(grid, spy)
            spy.link.publish(spy.topics.up("pi"), (hello % "-5").encode())
            negative = answer_to(grid, spy)
    finally:
        spy.close()
        grid.close()
        fleet.close()
    assert malformed.code == "malformed" and "out of range" in malformed.detail
    assert negative.code == "invalid_field" and "num_samples" in negative.detail
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    assert "pi" not in grid.devices  # neither hello counted
    assert {r["code"] for r in fleet.registry.rejections()} == {"malformed", "invalid_field"}
