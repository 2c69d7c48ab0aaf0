"""The device's re-announce rules (sdk_device/announce.py, docs/protocol.md §3.1, §9.5) and the
server epoch's format, without a broker."""

from __future__ import annotations

import random
import threading
import time

import pytest

from sdk_device.announce import Announcer
from sdk_device.protocol import messages as msgs
from sdk_device.protocol.epoch import ServerEpoch, announce_window
from sdk_device.protocol.errors import ProtocolError

HELLO = msgs.Hello(device_id="d1", runtimes=["torch"], num_samples=10, profile={})
RESULT = msgs.Result(task_id="t" * 32, round=1, arrays={}, metrics={"samples": 10})


class Sent:
    def __init__(self) -> None:
        self.messages: list[msgs.Message] = []
        self.arrived = threading.Event()

    def __call__(self, message: msgs.Message) -> None:
        self.messages.append(message)
        self.arrived.set()

    def types(self) -> list[str]:
        """What was sent, status requests left out (they have tests of their own below)."""
        return [m.TYPE for m in self.messages if m.TYPE != "status_request"]

    def asked(self) -> int:
        return sum(m.TYPE == "status_request" for m in self.messages)


def epoch(name: str, window: float = 0.0) -> ServerEpoch:
    return ServerEpoch(name, 1.0, window)


def started(window_s: float | None = None) -> tuple[Announcer, Sent]:
    sent = Sent()
    announcer = Announcer(sent, HELLO, window_s, random.Random(0))
    announcer.say_hello()
    return announcer, sent


def test_a_device_joining_a_running_server_says_hello_once():
    announcer, sent = started()
    announcer.on_event("epoch", epoch("aa"), True)  # retained copies delivered on subscribing
    announcer.on_event("status", "online", True)
    time.sleep(0.05)
    assert sent.types() == ["hello"]


def test_a_new_epoch_makes_the_device_say_hello_again_within_the_window():
    announcer, sent = started()
    announcer.on_event("epoch", epoch("aa"), True)
    began = time.monotonic()
    announcer.on_event("epoch", epoch("bb", window=0.3), False)
    announcer.on_event("status", "online", False)  # the restarted server's status follows its epoch
    assert sent.arrived.wait(2) and sent.messages  # the start hello
    deadline = time.monotonic() + 2
    while sent.types().count("hello") < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sent.types() == ["hello", "hello"]
    assert time.monotonic() - began <= 0.3 + 0.2
    announcer.on_event("epoch", epoch("bb"), True)  # the same epoch again (e.g. after a reconnect)
    time.sleep(0.05)
    assert sent.types() == ["hello", "hello"]


def test_a_server_starting_after_the_device_gets_a_hello_of_its_own():
    announcer, sent = started()  # its start hello went to no server (or a lost one)
    announcer.on_event("epoch", epoch("aa", window=0.1), False)  # live: the server starts now
    deadline = time.monotonic() + 2
    while len(sent.types()) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sent.types() == ["hello", "hello"]


def test_the_hello_delays_spread_uniformly_over_the_servers_window():
    delays = []
    for seed in range(200):
        announcer = Announcer(lambda m: None, HELLO, None, random.Random(seed))
        announcer.on_event("epoch", epoch("aa"), True)
        announcer.on_event("epoch", epoch("bb", window=30.0), False)
        delays.append(announcer._timer.interval)
        announcer.close()
    assert 0.0 <= min(delays) < 3.0 and 27.0 < max(delays) <= 30.0
    assert 12.0 < sum(delays) / len(delays) < 18.0


def test_the_devices_own_window_overrides_the_servers():
    announcer = Announcer(lambda m: None, HELLO, 0.5, random.Random(1))
    announcer.on_event("epoch", epoch("aa"), True)
    announcer.on_event("epoch", epoch("bb", window=300.0), False)
    assert announcer._timer.interval <= 0.5
    announcer.close()


def test_a_server_without_epochs_gets_a_hello_when_it_comes_back_online():
    announcer, sent = started()
    announcer.on_event("status", "online", True)  # retained: the start hello covers it
    assert sent.types() == ["hello"]
    announcer.on_event("status", "offline", False)
    assert not announcer.server_online
    announcer.on_event("status", "online", False)
    assert sent.types() == ["hello", "hello"] and announcer.server_online


def test_a_waiting_result_is_offered_again_after_a_reconnect_and_a_server_restart():
    announcer, sent = started()
    announcer.on_event("epoch", epoch("aa"), True)
    announcer.awaiting(RESULT)
    announcer.on_event("connected", True, False)
    assert sent.types() == ["hello", "result"]
    announcer.on_event("status", "online", False)  # the server reconnected (same epoch)
    assert sent.types() == ["hello", "result", "result"]
    announcer.on_event("epoch", epoch("bb"), False)
    deadline = time.monotonic() + 2
    while len(sent.types()) < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sent.types() == ["hello", "result", "result", "hello", "result"]  # hello first


def test_an_answered_result_is_not_offered_again():
    announcer, sent = started()
    announcer.awaiting(RESULT)
    announcer.awaiting(None)
    announcer.on_event("connected", True, False)
    assert sent.types() == ["hello"]


def test_the_first_connect_is_no_reason_to_offer_anything():
    announcer, sent = started()
    announcer.awaiting(RESULT)
    announcer.on_event("connected", False, False)
    assert sent.types() == ["hello"]


def test_the_announce_window_grows_with_the_fleet_between_bounds():
    assert announce_window(3) == 1.0
    assert announce_window(10_000) == pytest.approx(30.0, abs=0.1)
    assert announce_window(10_000_000) == 300.0


def test_an_epoch_round_trips_and_bad_ones_are_refused():
    one = ServerEpoch.new(12.5)
    assert ServerEpoch.decode(one.encode()) == one
    assert len(one.epoch) == 32 and one.epoch != ServerEpoch.new(12.5).epoch
    for bad, code in [(b"online", "malformed"), (b"[]", "malformed"), (b'{"epoch": "XY"}', "invalid_field"),
                      (b'{"epoch": "ab", "announce_window_s": true}', "invalid_field"),
                      (b'{"epoch": "ab", "announce_window_s": NaN}', "malformed")]:  # NaN: not JSON
        with pytest.raises(ProtocolError) as info:
            ServerEpoch.decode(bad)
        assert info.value.code == code
    assert ServerEpoch.decode(b'{"epoch": "ab"}').announce_window_s == 30.0  # the documented default
