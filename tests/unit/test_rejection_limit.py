"""A flood of garbage on a registered device's topics costs the server a few counter updates a
message (sdk_device/transport/inbox.py ``RejectionLimit``, the endpoint, rounds/mqtt_grid.py):
one rejection per (device, code) a minute is logged, answered and recorded, the rest only
counted and summed up once a minute; chunk frames nobody pulls are dropped unread. The
device's own traffic (a result for its task) is never held back.

Measured before (bench/fuzz.py, 100,000 messages at 1,000/s): every garbage message cost a
committed registry row (~3 ms of the round loop's thread), an ``error`` reply and a log line,
and two honest updates were lost behind the flood.
"""

from __future__ import annotations

import logging
import threading
import types
from collections import Counter

import pytest

import sdk_device.transport.inbox as inbox_module
from sdk_device.protocol import messages as msgs
from sdk_device.protocol.blobs import encode_chunk, sha256_hex
from sdk_device.protocol.topics import FleetTopics
from sdk_device.transport.blob_store import BlobStore
from sdk_device.transport.broker_address import BrokerAddress
from sdk_device.transport.endpoint import Endpoint
from sdk_device.transport.inbox import RejectionLimit
from server_toolkit.fleet.registry import FleetRegistry
from server_toolkit.rounds.mqtt_grid import MqttGrid
from server_toolkit.rounds.results import PendingTask

UP = "fedsdk/v1/f/dev/{}/up"


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(inbox_module.time, "monotonic", lambda: now[0])
    return now


def server_endpoint(tmp_path) -> tuple[Endpoint, list]:
    """A server endpoint never connected (the tests call its routing) and what it publishes."""
    server = Endpoint(BrokerAddress("127.0.0.1", 1), FleetTopics("f"), BlobStore(tmp_path / "s"))
    published: list = []
    server.link.publish = lambda topic, payload, **kw: published.append((topic, msgs.decode(payload)))
    return server, published


def test_a_flood_of_malformed_messages_on_a_registered_devices_topic_is_answered_once_a_minute(
        tmp_path, clock, caplog):
    server, published = server_endpoint(tmp_path)
    for _ in range(1000):
        server._on_message(UP.format("d0"), b"not json")
    server._on_message(UP.format("d0"), b'{"schema": 1, "type": "hello"}')  # another code: its own minute
    server._on_message(UP.format("d1"), b"not json")  # another device: its own minute
    assert [(t, e.code) for t, e in published] == [("fedsdk/v1/f/dev/d0/down", "malformed"),
                                                   ("fedsdk/v1/f/dev/d0/down", "unsupported_schema"),
                                                   ("fedsdk/v1/f/dev/d1/down", "malformed")]
    assert server.inbox.qsize() == 3  # what the round loop records: 3 rows, not 1,002
    assert server.rejections.dropped == 999
    clock[0] += 61
    with caplog.at_level(logging.WARNING):
        server._on_message(UP.format("d0"), b"not json")  # a new minute: answered again
    assert len(published) == 4
    [summary] = [r.getMessage() for r in caplog.records if "only counted" in r.getMessage()]
    assert summary.startswith("999 rejected messages") and "d0 malformed x999" in summary


def test_chunk_frames_that_answer_no_running_pull_are_dropped_unread(tmp_path):
    server, published = server_endpoint(tmp_path)
    data = b"x" * 10
    frame = encode_chunk(sha256_hex(data), 0, 10, 10, data, sha256_hex(data))
    for _ in range(100):
        server._on_message("fedsdk/v1/f/dev/d0/up/chunk", frame)
        server._on_message("fedsdk/v1/f/dev/d0/up/chunk", b"garbage")
    assert server.stray_chunks == 200 and published == [] and server.inbox.empty()


class RecordingEndpoint:
    """What the grid uses of an endpoint: the real rate limit; sends recorded; pulls refused."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, msgs.Message]] = []
        self.rejections = RejectionLimit()
        self.pulling = threading.Event()  # set while a pull runs
        self.release = threading.Event()
        self.comebacks: Counter[str] = Counter()
        self.link = types.SimpleNamespace(connects=1)

    def announce_epoch(self, epoch) -> None:
        pass

    def send(self, peer: str, message: msgs.Message) -> None:
        self.sent.append((peer, message))

    def fetch(self, *args, **kwargs) -> bytes:
        self.pulling.set()
        self.release.wait(10)
        raise TimeoutError("the test pulls nothing")

    def cancel_fetch(self, *args) -> None:
        self.release.set()


def test_results_for_tasks_a_device_never_had_are_booked_once_a_minute_and_its_own_result_still_counts(
        tmp_path):
    registry = FleetRegistry(tmp_path / "registry.sqlite")
    grid = MqttGrid(RecordingEndpoint(), registry)
    grid._open_round = 3
    ref = msgs.BlobRef(id="ab" * 32, size=10, kind="weights", format="safetensors")
    instruction = types.SimpleNamespace(device_id="d0", context={})
    grid._pending["t-own"] = PendingTask("t-own", 3, instruction, {"model": 1000}, {"model": {}}, None)
    for i in range(200):
        grid._on_result("d0", msgs.Result(task_id=f"forged-{i}", round=3, arrays={"model": ref},
                                          metrics={"samples": 5}))
        grid._on_device_error("d0", msgs.Error(code=f"busy{i}", detail="forged", ref=f"forged-{i}"))
    assert [(m.code, m.ref) for _, m in grid.endpoint.sent] == [("unknown_task", "forged-0")]
    assert [r["code"] for r in registry.rejections()] == ["unknown_task", "device:busy0"]
    own = msgs.Result(task_id="t-own", round=3, arrays={"model": ref}, metrics={"samples": 5})
    grid._on_result("d0", own)  # the device's own result: pulled, whatever the flood did
    assert grid.endpoint.pulling.wait(10) and [key[0] for key in grid._pulls] == ["t-own"]
    grid.close()
    registry.close()
