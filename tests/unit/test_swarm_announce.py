"""A swarm device follows the agent's re-announce rules (sdk_device/announce.py, docs/protocol.md
§3.1, §9.4, §9.5): hellos, heartbeats and result re-offers, without a broker."""

from __future__ import annotations

import time

import numpy as np

from sdk_device.protocol import messages as msgs
from sdk_device.protocol.blobs import encode_chunk, encode_tensors, sha256_hex
from sdk_device.protocol.epoch import ServerEpoch
from sdk_device.protocol.topics import FleetTopics
from server_toolkit.swarm.counters import Counters
from server_toolkit.swarm.device import SwarmDevice
from server_toolkit.swarm.link import EventLoop

TOPICS = FleetTopics("f")


class Later:
    """A scheduler that keeps the delayed calls for the test to run."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, object]] = []

    def __call__(self, delay_s, fn):
        self.calls.append((delay_s, fn))
        return EventLoop().call_later(delay_s, fn)  # something with cancel()

    def hello_delays(self) -> list[float]:
        """The delays of the scheduled calls, status-request retries left out."""
        return [d for d, fn in self.calls if "_ask_status" not in fn.__qualname__]

    def run_all(self) -> None:
        calls, self.calls = self.calls, []
        for _, fn in calls:
            fn()


def device(heartbeat_s: float = 0.0) -> tuple[SwarmDevice, list[tuple[msgs.Message, int]], Later]:
    sent, later = [], Later()
    dev = SwarmDevice("d1", TOPICS, Counters(), heartbeat_s=heartbeat_s, schedule=later)
    dev.publish = lambda topic, payload, qos=1: sent.append((msgs.decode(payload), qos))
    return dev, sent, later


def types(sent) -> list[str]:
    """What was sent, status requests left out (tests/unit/test_status_request.py)."""
    return [m.TYPE for m, _ in sent if m.TYPE != "status_request"]


def epoch(name: str, window: float = 30.0) -> bytes:
    return ServerEpoch(name, 1.0, window).encode()


def test_a_swarm_device_says_hello_once_at_start_and_not_for_each_online_of_the_server():
    dev, sent, later = device()
    dev.on_connected(True)
    dev.on_message(TOPICS.server_epoch, epoch("aa"), True)  # retained: the server of the start hello
    dev.on_message(TOPICS.server_status, b"online", True)
    dev.on_message(TOPICS.server_status, b"online", False)  # a broker restart: same epoch
    dev.on_message(TOPICS.server_epoch, epoch("aa"), False)
    assert types(sent) == ["hello"] and later.hello_delays() == []
    assert dev.counters.hellos == 1


def test_a_new_server_epoch_brings_one_hello_after_a_delay_within_its_window():
    dev, sent, later = device()
    dev.on_connected(True)
    dev.on_message(TOPICS.server_epoch, epoch("aa"), True)
    dev.on_message(TOPICS.server_epoch, epoch("bb", window=30.0), False)  # the server restarted
    dev.on_message(TOPICS.server_epoch, epoch("bb", window=30.0), False)  # a repeat changes nothing
    assert len(later.hello_delays()) == 1 and 0.0 <= later.hello_delays()[0] <= 30.0
    assert types(sent) == ["hello"]  # not yet: only after the delay
    later.run_all()
    assert types(sent) == ["hello", "hello"]
    assert dev.counters.hellos == 2


def test_heartbeats_go_at_qos_0_and_pause_while_the_server_is_offline():
    dev, sent, _ = device(heartbeat_s=1.0)
    dev.on_connected(True)
    dev.on_message(TOPICS.server_epoch, epoch("aa"), True)
    sent.clear()
    now = time.monotonic()
    dev.tick(now + 2)
    assert [(m.TYPE, qos) for m, qos in sent] == [("heartbeat", 0)]
    dev.on_message(TOPICS.server_status, b"offline", False)
    dev.tick(now + 4)
    dev.tick(now + 6)
    assert len(sent) == 1  # nobody listens
    dev.on_message(TOPICS.server_status, b"online", False)  # the same server back (same epoch)
    dev.tick(now + 8)
    assert [(m.TYPE, qos) for m, qos in sent] == [("heartbeat", 0), ("heartbeat", 0)]


def answer_a_task(dev: SwarmDevice, sent) -> msgs.Result:
    tensors = {"w": np.ones((2, 2), np.float32)}
    blob = encode_tensors(tensors)
    ref = msgs.BlobRef(id=sha256_hex(blob), size=len(blob), kind="weights", format="safetensors")
    config = {"steps": [{"train": "model", "recipe": {"epochs": 1, "batch_size": 8, "lr": 0.1, "seed": 5}}]}
    task = msgs.Task(task_id="t" * 32, round=1, programs={"model": [ref]}, arrays={"model": ref},
                     config=config, deadline=1e12)
    dev.on_message(TOPICS.down("d1"), msgs.encode(task))
    request = sent[-1][0]
    dev.on_message(TOPICS.down_chunk("d1"), encode_chunk(ref.id, 0, len(blob), request.chunk_bytes, blob))
    result = sent[-1][0]
    assert isinstance(result, msgs.Result)
    return result


def test_a_result_is_offered_again_after_a_reconnect_and_a_new_epoch_until_acknowledged():
    dev, sent, later = device()
    dev.on_connected(True)
    dev.on_message(TOPICS.server_epoch, epoch("aa"), True)
    result = answer_a_task(dev, sent)
    sent.clear()
    dev.on_connected(False)  # the device's own reconnect
    dev.on_message(TOPICS.server_epoch, epoch("bb"), False)
    later.run_all()  # the hello to the new server, then the result again
    assert types(sent) == ["result", "hello", "result"]
    assert all(m == result for m, _ in sent if m.TYPE == "result")
    assert dev.counters.reoffers == 2
    dev.on_message(TOPICS.down("d1"), msgs.encode(msgs.Ack(ref=result.task_id)))
    sent.clear()
    dev.on_connected(False)
    dev.on_message(TOPICS.server_status, b"online", False)
    assert types(sent) == []  # answered: nothing waits any more
    assert dev.counters.accepted == 1


def test_the_event_loop_runs_a_delayed_call_once_and_never_a_cancelled_one():
    loop, ran = EventLoop(), []
    loop.call_later(0.0, lambda: ran.append("due"))
    loop.call_later(0.0, lambda: ran.append("cancelled")).cancel()
    loop.call_later(60.0, lambda: ran.append("later"))
    loop.run_once(0.01)
    loop.run_once(0.01)
    assert ran == ["due"]
