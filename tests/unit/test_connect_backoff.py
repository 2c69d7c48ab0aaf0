"""Waiting for the broker (sdk_device/transport/backoff.py): waits double from 1 s to a 60 s
cap with jitter; an unreachable broker is retried, a refusal is not; a stop ends the wait."""

from __future__ import annotations

import random
import threading
import time

import pytest

from sdk_device.transport.backoff import Backoff, connect_patiently
from sdk_device.transport.mqtt_link import BrokerRefused


def test_waits_double_up_to_the_cap_each_with_jitter():
    backoff = Backoff(rng=random.Random(0))
    waits = [backoff.next_wait() for _ in range(10)]
    steps = [1, 2, 4, 8, 16, 32, 60, 60, 60, 60]
    assert all(0.5 * s <= w <= s for w, s in zip(waits, steps, strict=True)), waits
    assert len({round(w / s, 6) for w, s in zip(waits, steps, strict=True)}) > 5  # jittered


class Attempts:
    """A connect function failing with ``errors`` in turn, then succeeding."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.timeouts: list[float] = []

    def __call__(self, timeout_s: float) -> None:
        self.timeouts.append(timeout_s)
        if self.errors:
            raise self.errors.pop(0)


def test_an_unreachable_broker_is_tried_again_until_it_answers(caplog):
    attempts = Attempts(ConnectionError("cannot reach"), ConnectionError("cannot reach"))
    with caplog.at_level("WARNING"):
        assert connect_patiently(attempts, threading.Event(), backoff=Backoff(first_s=0.01))
    assert len(attempts.timeouts) == 3
    lines = [r.getMessage() for r in caplog.records if "next attempt in" in r.getMessage()]
    assert len(lines) == 2 and "(attempt 2)" in lines[1]


def test_a_refused_login_is_not_retried():
    attempts = Attempts(ConnectionError("cannot reach"), BrokerRefused("refused us: Not authorized"))
    with pytest.raises(BrokerRefused):
        connect_patiently(attempts, threading.Event(), backoff=Backoff(first_s=0.01))
    assert len(attempts.timeouts) == 2


def test_a_connect_timeout_gives_up_with_the_last_reason():
    attempts = Attempts(*[ConnectionError("cannot reach broker")] * 100)
    started = time.monotonic()
    with pytest.raises(ConnectionError, match=r"cannot reach broker \(gave up after \d+ attempts in 0.5 s\)"):
        connect_patiently(attempts, threading.Event(), timeout_s=0.5, backoff=Backoff(first_s=0.1))
    assert time.monotonic() - started < 3.0
    assert all(t >= 1.0 for t in attempts.timeouts)  # each attempt still waits a moment for a CONNACK


def test_a_stop_while_waiting_returns_at_once():
    stop = threading.Event()
    attempts = Attempts(*[ConnectionError("cannot reach")] * 100)
    threading.Timer(0.3, stop.set).start()
    started = time.monotonic()
    assert connect_patiently(attempts, stop, backoff=Backoff(first_s=30.0)) is False
    assert time.monotonic() - started < 2.0
