"""Blob transfer through a real mosquitto: chunked pull, resume, limits, access."""

from __future__ import annotations

import os

import pytest

from sdk_device.protocol import ProtocolError
from sdk_device.protocol.blobs import sha256_hex
from sdk_device.protocol.messages import BlobRef
from sdk_device.protocol.topics import FleetTopics
from sdk_device.transport.blob_store import BlobStore
from sdk_device.transport.endpoint import SERVER, Endpoint

pytestmark = pytest.mark.integration


@pytest.fixture
def pair(mosquitto, tmp_path):
    topics = FleetTopics("blobs")
    server = Endpoint(
        mosquitto.address, topics, BlobStore(tmp_path / "server"), chunk_bytes=64 * 1024
    ).start()
    device = Endpoint(
        mosquitto.address,
        topics,
        BlobStore(tmp_path / "device"),
        device_id="d1",
        chunk_bytes=64 * 1024,
        max_blob_bytes=8 * 1024 * 1024,
    ).start()
    yield server, device
    device.close()
    server.close()


def test_chunked_fetch_both_ways(pair):
    server, device = pair
    data = os.urandom(1_000_003)  # not a multiple of the chunk size
    assert device.fetch(SERVER, server.offer("d1", data, "weights", "safetensors")) == data
    back = os.urandom(300_000)
    assert server.fetch("d1", device.offer(SERVER, back, "weights", "safetensors")) == back
    assert server.bytes_sent >= len(data) and server.bytes_received >= len(back)


def test_interrupted_fetch_resumes_from_disk(pair):
    server, device = pair
    data = os.urandom(640 * 1024)  # 10 chunks
    ref = server.offer("d1", data, "weights", "safetensors")
    part = device.store.partial(ref.id, ref.size, device.chunk_bytes)
    for i in range(4):  # as if the first 4 chunks arrived before a disconnect
        chunk = data[i * 65536 : (i + 1) * 65536]
        part.write(i, chunk, sha256_hex(chunk))
    part.close()
    sent_before = server.bytes_sent
    assert device.fetch(SERVER, ref) == data
    assert server.bytes_sent - sent_before == len(data) - 4 * 65536  # only the missing chunks moved


def test_size_limit_is_enforced_before_anything_is_fetched(pair):
    server, device = pair
    ref = BlobRef(id="ab" * 32, size=9 * 1024 * 1024, kind="weights", format="safetensors")
    with pytest.raises(ProtocolError, match="too_large"):
        device.fetch(SERVER, ref)
    assert not (device.store.root / "partial").exists()


def test_a_blob_not_offered_to_a_device_is_refused(pair):
    server, device = pair
    secret = server.offer("someone-else", os.urandom(1000), "weights", "safetensors")
    with pytest.raises(ProtocolError, match="not_offered"):
        device.fetch(SERVER, secret, timeout_s=30)
    refusals = [i.message for i in list(device.inbox.queue) if i.message is not None]
    assert any(m.code == "not_offered" for m in refusals)


def test_fetch_survives_a_broker_restart(mosquitto, tmp_path):
    """The broker goes down mid-transfer; both sides reconnect and the fetch completes."""
    import threading
    import time

    topics = FleetTopics("restart")
    server = Endpoint(
        mosquitto.address, topics, BlobStore(tmp_path / "s"), chunk_bytes=16 * 1024, window=2
    ).start()
    device = Endpoint(
        mosquitto.address, topics, BlobStore(tmp_path / "d"), device_id="d1", chunk_bytes=16 * 1024, window=2
    ).start()
    data = os.urandom(4 * 1024 * 1024)  # 256 chunks, two in flight at a time
    ref = server.offer("d1", data, "weights", "safetensors")
    result = {}
    fetcher = threading.Thread(
        target=lambda: result.setdefault("data", device.fetch(SERVER, ref, timeout_s=60, idle_s=2))
    )
    fetcher.start()
    while server.bytes_sent < 256 * 1024:  # let some chunks through, then pull the plug
        time.sleep(0.005)
    mosquitto.stop()
    time.sleep(1.0)
    mosquitto.start()
    fetcher.join(timeout=60)
    device.close()
    server.close()
    assert result.get("data") == data
    assert server.bytes_sent < 2 * len(data)  # resumed, not restarted from zero
