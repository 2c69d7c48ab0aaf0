"""Open tasks go to their device again when it may have missed them (``mqtt_presence.py``), and
a device process takes each task id once (``seen_tasks.py``)."""

from __future__ import annotations

import queue
import time
import types
from collections import Counter

from sdk_device.protocol import messages as msgs
from sdk_device.seen_tasks import SeenTasks
from server_toolkit.fleet.registry import FleetRegistry
from server_toolkit.methods.base import DeviceInfo
from server_toolkit.rounds.mqtt_grid import MqttGrid
from server_toolkit.rounds.results import PendingTask

REF = msgs.BlobRef(id="ab" * 32, size=10, kind="weights", format="safetensors")


class RecordingEndpoint:
    """What the grid uses of an endpoint, recording what it sends."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, msgs.Message]] = []
        self.link = types.SimpleNamespace(connects=1)
        self.comebacks: Counter[str] = Counter()
        self.inbox: queue.Queue = queue.Queue()

    def announce_epoch(self, epoch) -> None:
        pass

    def send(self, peer: str, message: msgs.Message) -> None:
        self.sent.append((peer, message))


def task_for(deadline: float) -> msgs.Task:
    return msgs.Task(task_id=msgs.new_id(), round=4, programs={"model": [REF]}, arrays={"model": REF},
                     config={}, deadline=deadline)


def grid_with_open_tasks(tmp_path, devices=("a", "b")):
    registry = FleetRegistry(tmp_path / "registry.sqlite")
    endpoint = RecordingEndpoint()
    grid = MqttGrid(endpoint, registry)
    grid._open_round = 4
    for dev in devices:
        registry.add_device(dev)
        task = task_for(time.time() + 60)
        instruction = types.SimpleNamespace(device_id=dev)
        grid._pending[task.task_id] = PendingTask(task.task_id, 4, instruction, {}, {}, None, task=task)
        grid._task_of[dev] = task.task_id
        grid.devices[dev] = DeviceInfo(dev, 10, None)
    return grid, endpoint


def test_a_device_back_online_gets_its_open_task_again_with_the_same_id(tmp_path):
    grid, endpoint = grid_with_open_tasks(tmp_path)
    grid._on_status("a", "online")  # a reconnect the server never saw begin (no will: a killed broker)
    [(peer, copy)] = endpoint.sent
    first = grid._pending[grid._task_of["a"]].task
    assert peer == "a" and copy.task_id == first.task_id and copy.deadline == first.deadline
    assert copy.msg_id != first.msg_id


def test_a_device_that_left_and_came_back_is_awaited_and_sent_its_task(tmp_path):
    grid, endpoint = grid_with_open_tasks(tmp_path)
    grid.registry.record_hello("a", {}, ["torch"], 10)
    grid._on_status("a", "offline")
    assert "a" in grid._resolved
    grid._on_status("a", "online")
    assert "a" not in grid._resolved and [p for p, _ in endpoint.sent] == ["a"]


def test_answered_refused_expired_or_offline_tasks_are_not_sent_again(tmp_path):
    grid, endpoint = grid_with_open_tasks(tmp_path, devices=("a", "b", "c", "d"))
    grid._pending[grid._task_of["a"]].answered = True
    grid._resolved.add("b")  # it refused its task
    grid.devices.pop("c")
    grid._pending[grid._task_of["d"]].task = task_for(time.time() - 1)  # past its deadline
    assert grid._resend_tasks({"a", "b", "c", "d"}, "test") == 0
    grid._open_round = None  # the round closed
    grid._pending[grid._task_of["a"]].answered = False
    assert grid._resend_tasks({"a"}, "test") == 0 and endpoint.sent == []


def test_the_servers_own_reconnect_sends_open_tasks_again_and_a_repeated_hello_does_not(tmp_path):
    grid, endpoint = grid_with_open_tasks(tmp_path)
    grid._on_hello("b", msgs.Hello(device_id="b", runtimes=["torch"], num_samples=10, profile={}))
    grid._check_reconnect()  # no reconnect yet
    assert endpoint.sent == []
    endpoint.link.connects = 2
    grid._check_reconnect()
    assert sorted(p for p, _ in endpoint.sent) == ["a", "b"]


def test_a_refused_copy_of_an_answered_task_and_a_refused_blob_are_not_booked(tmp_path):
    grid, _ = grid_with_open_tasks(tmp_path)
    answered = grid._pending[grid._task_of["a"]]
    answered.answered = True
    grid._on_device_error("a", msgs.Error(code="bad_task", detail="blob not offered", ref=answered.task_id))
    grid._on_device_error("b", msgs.Error(code="not_offered", detail="not offered", ref="cd" * 32))
    assert grid.registry.rejections() == [] and grid._rejections == {} and "a" not in grid._resolved
    grid._on_device_error("b", msgs.Error(code="policy", detail="charging only", ref=grid._task_of["b"]))
    assert [r["code"] for r in grid.registry.rejections()] == ["device:policy"] and "b" in grid._resolved


def test_a_device_takes_each_task_id_once_and_remembers_a_bounded_number():
    seen = SeenTasks(limit=2)
    assert seen.first_time("t1") and not seen.first_time("t1")
    assert seen.first_time("t2") and seen.first_time("t3")
    assert seen.first_time("t1")  # the oldest was forgotten


def test_the_time_spent_exporting_a_rounds_programs_moves_its_deadline(tmp_path):
    """An export that takes long (a VGG under load: minutes) must not eat the devices' time."""
    from fedcore.recipe import Recipe
    from server_toolkit.methods.base import TrainInstruction

    class SlowExports:
        def programs(self, spec, recipe, portable=False):
            time.sleep(1.0)
            return [("torchspec/1", b"{}")]

    grid, _ = grid_with_open_tasks(tmp_path, devices=())
    grid.programs = SlowExports()
    sent = []
    grid._send_task = lambda rnd, instruction, deadline: sent.append(deadline)
    instruction = TrainInstruction("a", {"layers": []}, {}, Recipe())
    deadline = time.time() + 30
    grid.exchange(5, [instruction], deadline, quorum=0)
    assert sent and sent[0] - deadline >= 0.9
