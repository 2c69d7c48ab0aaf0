"""The grid's fallback to portable programs (``rounds/kernel_fallback.py``) in the synchronous
and the asynchronous grid: a refusal for kernels sends the work again instead of resolving the
device, is not counted as a rejection, and a second one (of the portable program) resolves it."""

from __future__ import annotations

import time
import types

import pytest

from sdk_device.protocol import messages as msgs
from server_toolkit.fleet.registry import FleetRegistry
from server_toolkit.methods.base import DeviceInfo
from server_toolkit.rounds.mqtt_async import AsyncMqttGrid
from server_toolkit.rounds.mqtt_grid import MqttGrid
from server_toolkit.rounds.results import PendingTask

from .test_task_resend import RecordingEndpoint, task_for


def _grid(tmp_path, grid_class):
    registry = FleetRegistry(tmp_path / "registry.sqlite")
    grid = grid_class(RecordingEndpoint(), registry, program_formats=["pte/1"], pte_kernels="fused")
    registry.add_device("a")
    grid.devices["a"] = DeviceInfo("a", 10, None)
    sent = []

    def send_task(rnd, instruction, deadline):  # what _send_task leaves behind, without exporting
        task = task_for(deadline)
        grid._pending[task.task_id] = PendingTask(task.task_id, rnd, instruction, {}, {}, None, task=task)
        grid._task_of[instruction.device_id] = task.task_id
        sent.append((task.task_id, "a" in grid._portable_only))

    grid._send_task = send_task
    instruction = types.SimpleNamespace(device_id="a")
    if grid_class is AsyncMqttGrid:
        grid.open_version(3)
    else:
        grid._open_round = 4
    expires = time.time() + 60
    send_task(4, instruction, expires)
    first = grid._task_of["a"]
    if grid_class is AsyncMqttGrid:
        grid._expires[first] = expires
    return grid, first, sent, expires


@pytest.mark.parametrize("grid_class", [MqttGrid, AsyncMqttGrid], ids=["sync", "async"])
def test_a_kernels_refusal_sends_the_work_again_as_portable_and_a_second_one_resolves(tmp_path, grid_class):
    grid, first, sent, expires = _grid(tmp_path, grid_class)
    grid._on_device_error("a", msgs.Error(code="unsupported_kernels", detail="no library", ref=first))
    second = grid._task_of["a"]
    assert second != first and sent[-1] == (second, True)  # sent again, the device now portable-only
    assert "a" not in grid._resolved and grid._rejections == {}
    assert [r["code"] for r in grid.registry.rejections()] == ["device:unsupported_kernels"]
    if grid_class is AsyncMqttGrid:
        assert grid._expires == {second: expires} and first not in grid._pending  # the slot carried over
        assert grid.counters()["rejected"] == 0
    grid._on_device_error("a", msgs.Error(code="unsupported_kernels", detail="still not", ref=second))
    assert grid._task_of["a"] == second and len(sent) == 2  # no third task
    if grid_class is AsyncMqttGrid:
        assert grid._expires[second] == 0.0  # freed, as any refusal frees it
    else:
        assert "a" in grid._resolved


def test_a_portable_server_does_not_fall_back(tmp_path):
    registry = FleetRegistry(tmp_path / "registry.sqlite")
    grid = MqttGrid(RecordingEndpoint(), registry, program_formats=["pte/1"])
    grid._open_round, grid.devices["a"] = 4, DeviceInfo("a", 10, None)
    task = task_for(time.time() + 60)
    grid._pending[task.task_id] = PendingTask(task.task_id, 4, types.SimpleNamespace(device_id="a"), {}, {},
                                              None, task=task)
    grid._on_device_error("a", msgs.Error(code="unsupported_kernels", detail="no library", ref=task.task_id))
    assert "a" in grid._resolved and grid._rejections == {"device:unsupported_kernels": 1}
