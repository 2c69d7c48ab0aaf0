"""Hostile input (issue 28): every field bounded in one place (sdk_device/protocol/bounds.py),
a write-behind that cannot end the server, replays refused, and pulls that name the chunk
that lied (sdk_device/transport/pull.py)."""

from __future__ import annotations

import json
import logging
import queue
import time

import pytest

from sdk_device.protocol import messages as msgs
from sdk_device.protocol.blobs import Chunk, chunk_count, sha256_hex
from sdk_device.protocol.errors import OwnDataError, ProtocolError
from sdk_device.transport.blob_store import BlobStore
from sdk_device.transport.pull import BlobPull
from server_toolkit.fleet.registry import FleetRegistry
from server_toolkit.rounds.results import check_pulled


def _hello(**fields) -> bytes:
    body = {"schema": 2, "type": "hello", "msg_id": "a" * 32, "sent_at": 1767225600.0, "device_id": "pi",
            "runtimes": ["torch"], "num_samples": 600, "profile": {}, **fields}
    return json.dumps(body).encode()


def _code(payload: bytes) -> str:
    with pytest.raises(ProtocolError) as caught:
        msgs.decode(payload)
    return caught.value.code


@pytest.mark.parametrize("fields", [
    {"num_samples": -5}, {"num_samples": 10**18}, {"runtimes": ["torch"] * 17}, {"runtimes": ["tor ch"]},
    {"runtimes": [""]}, {"device_id": "d/0"}, {"device_id": "x" * 65}, {"msg_id": ""}, {"msg_id": "a\x00b"},
    {"sent_at": -1.0}, {"sent_at": 1e300}, {"profile": json.loads("[" * 17 + "]" * 17)},
])
def test_a_hello_with_a_field_out_of_bounds_is_an_invalid_field(fields):
    assert _code(_hello(**fields)) == "invalid_field"


def test_every_other_message_type_bounds_its_fields_too():
    def raw(kind: str, **fields) -> bytes:
        return json.dumps({"schema": 2, "type": kind, "msg_id": "m", "sent_at": 1.0, **fields}).encode()

    assert _code(raw("heartbeat", state="training", progress=1.5)) == "invalid_field"
    assert _code(raw("heartbeat", state="TRAIN!", progress=0.5)) == "invalid_field"
    assert _code(raw("blob_request", blob="z" * 64, indices=[0], chunk_bytes=16)) == "invalid_field"
    assert _code(raw("blob_request", blob="a" * 64, indices=[-1], chunk_bytes=16)) == "invalid_field"
    ref = {"id": "a" * 64, "size": 2**60, "kind": "weights", "format": "safetensors"}
    assert _code(raw("result", task_id="t", round=1, arrays={"model": ref}, metrics={})) == "invalid_field"
    assert _code(raw("result", task_id="t", round=-1, arrays={}, metrics={})) == "invalid_field"
    assert _code(raw("error", code="x" * 65, detail="")) == "invalid_field"
    assert _code(raw("secagg", round=1, stage="keys", data=json.loads("{\"a\":" * 17 + "1" + "}" * 17))) \
        == "invalid_field"
    # and the edges are fine
    assert msgs.decode(raw("heartbeat", state="training", progress=1.0)).progress == 1.0
    assert msgs.decode(_hello(num_samples=10**9, runtimes=["torch"] * 16)).num_samples == 10**9


def test_a_hello_that_would_overflow_sqlite_is_dropped_once_and_the_run_goes_on(tmp_path, caplog):
    registry = FleetRegistry(tmp_path / "registry.sqlite")
    registry.add_device("d0")
    registry.add_device("d1")
    registry.record_hello("d0", {}, ["torch"], 10**30)  # past the decoder's bounds: as if a bug let it in
    registry.record_hello("d1", {}, ["torch"], 600)
    with caplog.at_level(logging.ERROR):
        registry.open_round(1, ["d1"], "")  # flushes first; raised OverflowError before
        registry.record_hello("d0", {}, ["torch"], 10**30)
        registry.flush()
    assert registry.device("d1")["num_samples"] == 600  # the good row was written
    assert registry.device("d0")["num_samples"] is None  # the bad one was not stored
    reports = [r for r in caplog.records if "d0" in r.getMessage() and "cannot be stored" in r.getMessage()]
    assert len(reports) == 1  # reported once
    assert registry.round_info(1)["status"] == "open"
    registry.close()


def test_an_update_byte_identical_to_an_earlier_one_of_the_device_is_a_replay(tmp_path):
    registry = FleetRegistry(tmp_path / "registry.sqlite")
    registry.add_update(1, "d0", "task1", "b" * 64, 10, {})
    assert registry.replayed("d0", "b" * 64, "task2") == "task1"
    assert registry.replayed("d0", "b" * 64, "task1") is None  # the same task again is a repeat
    assert registry.replayed("d1", "b" * 64, "task2") is None  # another device's: not a replay
    with pytest.raises(OwnDataError) as caught:
        check_pulled("model", b"", None, "task1")
    assert caught.value.code == "replay"
    registry.close()


def test_garbage_pulled_from_the_device_is_its_own_data_error():
    with pytest.raises(OwnDataError) as caught:
        check_pulled("model", b"not safetensors", None, None)
    assert caught.value.code == "malformed"


class _Holder:
    """Answers each request with the true frames, after a forger's frame for ``forge`` (once)."""

    def __init__(self, blob: bytes, chunk_bytes: int, arrivals: queue.Queue, forge: int | None) -> None:
        self.blob, self.cb, self.arrivals, self.forge = blob, chunk_bytes, arrivals, forge
        self.asked: list[list[int]] = []

    def frame(self, index: int, data: bytes | None = None) -> Chunk:
        true = self.blob[index * self.cb:(index + 1) * self.cb]
        data = true if data is None else data
        return Chunk(sha256_hex(self.blob), index, chunk_count(len(self.blob), self.cb), len(self.blob),
                     self.cb, sha256_hex(data), data)

    def request(self, indices: list[int]) -> None:
        self.asked.append(list(indices))
        for index in indices:
            if index == self.forge:
                self.forge = None
                self.arrivals.put(self.frame(index, b"F" * self.cb))  # self-consistent, and first
            self.arrivals.put(self.frame(index))


def _pull(tmp_path, forge: int | None, blob: bytes = bytes(range(256)) * 4, cb: int = 64):
    arrivals: queue.Queue = queue.Queue()
    holder = _Holder(blob, cb, arrivals, forge)
    ref = msgs.BlobRef(id=sha256_hex(blob), size=len(blob), kind="weights", format="safetensors")
    part = BlobStore(tmp_path).partial(ref.id, ref.size, cb)
    pull = BlobPull("dev", ref, part, arrivals, holder.request, window=16)
    ok = pull.run(time.monotonic() + 10, idle_s=1.0)
    return ok, pull, holder, part


def test_a_forged_chunk_is_named_and_only_it_is_fetched_again(tmp_path):
    ok, pull, holder, part = _pull(tmp_path, forge=5)
    assert ok and part.verified()
    assert pull.contested == 1 and pull.refetched == 1
    assert holder.asked[-1] == [5]  # the pull resumed with the forged chunk alone


def test_an_honest_pull_fetches_every_chunk_once(tmp_path):
    ok, pull, holder, _ = _pull(tmp_path, forge=None)
    assert ok and pull.contested == 0 and pull.refetched == 0
    assert sorted(i for batch in holder.asked for i in batch) == list(range(16))
