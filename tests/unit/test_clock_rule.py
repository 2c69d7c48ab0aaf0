"""The clock rule (docs/protocol.md §9.6): a task's deadline is a duration from the server's
time, counted on the device's monotonic clock from the task's arrival; a task without
``server_time`` keeps the old rule (deadline against the device's wall clock)."""

from __future__ import annotations

import time

from sdk_device.protocol import messages as msgs
from sdk_device.protocol.clock import OFFSET_ENV, seconds_left, wall_clock

SERVER_NOW = 1_800_000_000.0  # unix seconds on the server's clock
REF = msgs.BlobRef(id="a" * 64, size=1, kind="weights", format="safetensors")


def test_a_device_clock_an_hour_fast_or_slow_sees_the_time_the_server_gave():
    for device_now in (SERVER_NOW + 3600, SERVER_NOW - 3600, SERVER_NOW):
        left = seconds_left(SERVER_NOW + 120, SERVER_NOW, waited_s=0.0, device_now=device_now)
        assert left == 120.0


def test_time_spent_waiting_on_the_device_counts_against_the_deadline():
    assert seconds_left(SERVER_NOW + 120, SERVER_NOW, waited_s=30.0) == 90.0
    assert seconds_left(SERVER_NOW + 120, SERVER_NOW, waited_s=150.0) == -30.0


def test_a_task_without_server_time_is_judged_by_the_device_clock_as_before():
    fast = SERVER_NOW + 3600
    assert seconds_left(SERVER_NOW + 120, None, waited_s=0.0, device_now=fast) == 120 - 3600
    assert seconds_left(SERVER_NOW + 120, None, waited_s=0.0, device_now=SERVER_NOW) == 120


def test_the_clock_offset_hook_shifts_the_device_wall_clock(monkeypatch):
    monkeypatch.setenv(OFFSET_ENV, "3600")
    assert abs(wall_clock() - time.time() - 3600) < 1.0
    assert seconds_left(time.time() + 120, None, waited_s=0.0) < -3000  # the old rule now refuses
    monkeypatch.setenv(OFFSET_ENV, "-3600")
    assert abs(wall_clock() - time.time() + 3600) < 1.0


def test_a_task_carries_server_time_on_the_wire_and_an_old_task_decodes_without_it():
    task = msgs.Task(task_id="t" * 32, round=1, programs={"model": [REF]}, arrays={"model": REF},
                     config={"steps": []}, deadline=SERVER_NOW + 60, server_time=SERVER_NOW)
    assert msgs.decode(msgs.encode(task)).server_time == SERVER_NOW
    old = msgs.encode(task).replace(b',"server_time":1800000000.0', b"")
    assert b"server_time" not in old
    assert msgs.decode(old).server_time is None
