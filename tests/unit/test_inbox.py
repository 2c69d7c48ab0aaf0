"""The endpoint's inbox (results first) and its bookkeeping of unknown ids
(sdk_device/transport/inbox.py)."""

from __future__ import annotations

import queue

import pytest

import sdk_device.transport.inbox as inbox_module
from sdk_device.protocol import messages as msgs
from sdk_device.transport.endpoint import Incoming
from sdk_device.transport.inbox import Inbox, Strangers


def _hello(dev: str) -> Incoming:
    return Incoming(dev, message=msgs.Hello(device_id=dev, runtimes=["torch"], num_samples=1, profile={}))


def test_inbox_hands_out_results_before_everything_else_and_keeps_arrival_order_otherwise():
    inbox = Inbox()
    for i in range(3):
        inbox.put(_hello(f"d{i}"))
    inbox.put(Incoming("d9", status="offline"))
    result = Incoming("d1", message=msgs.Result(task_id="t", round=1, arrays={}, metrics={}))
    inbox.put(result)
    assert inbox.qsize() == 5
    got = [inbox.get(timeout=1) for _ in range(5)]
    assert got[0] is result
    assert [g.peer for g in got[1:]] == ["d0", "d1", "d2", "d9"]
    with pytest.raises(queue.Empty):
        inbox.get(timeout=0.01)


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(inbox_module.time, "monotonic", lambda: now[0])
    return now


def test_strangers_let_one_message_per_id_a_minute_through_and_count_the_rest(clock):
    strangers = Strangers(window_s=60.0)
    assert strangers.admit("x") == 0
    assert [strangers.admit("x") for _ in range(9)] == [None] * 9
    assert strangers.admit("y") == 0  # every id has its own minute
    clock[0] += 59.9
    assert strangers.admit("x") is None
    clock[0] += 0.2
    assert strangers.admit("x") == 10  # logged again, with what was dropped meanwhile
    assert strangers.total == 13


def test_strangers_remember_a_bounded_number_of_ids(clock):
    strangers = Strangers(window_s=60.0, max_ids=100)
    assert all(strangers.admit(f"s{i}") == 0 for i in range(100))
    assert strangers.admit("one-too-many") is None  # only counted while 100 ids are in their minute
    clock[0] += 61
    assert strangers.admit("one-too-many") == 0  # the old ones expired
    assert len(strangers._since) == 1 and strangers.total == 102
