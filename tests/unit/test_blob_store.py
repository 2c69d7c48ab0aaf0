"""Unit tests of the on-disk blob store and resumable partial blobs (sdk_device.transport.blob_store)."""

from __future__ import annotations

import pytest

from sdk_device.protocol.blobs import chunk_count, sha256_hex
from sdk_device.protocol.errors import ProtocolError
from sdk_device.transport.blob_store import BlobStore

CHUNK = 16


def _data(size: int, salt: int = 0) -> bytes:
    return bytes((i * 31 + salt) % 251 for i in range(size))


def _chunks(data: bytes, chunk_bytes: int = CHUNK) -> list[bytes]:
    return [data[i * chunk_bytes:(i + 1) * chunk_bytes] for i in range(chunk_count(len(data), chunk_bytes))]


def _files(root) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


# ---- BlobStore --------------------------------------------------------------------------------

def test_put_get_has_size(tmp_path):
    store = BlobStore(tmp_path / "blobs")
    data = _data(100)
    blob_id = store.put(data)
    assert blob_id == sha256_hex(data)
    assert store.has(blob_id)
    assert store.get(blob_id) == data
    assert store.size(blob_id) == 100
    assert store.path(blob_id) == tmp_path / "blobs" / blob_id[:2] / blob_id
    assert not store.has(sha256_hex(b"something else"))


def test_get_unknown_blob_raises(tmp_path):
    store = BlobStore(tmp_path)
    with pytest.raises(FileNotFoundError):
        store.get("0" * 64)


def test_empty_blob(tmp_path):
    store = BlobStore(tmp_path)
    blob_id = store.put(b"")
    assert store.has(blob_id) and store.get(blob_id) == b"" and store.size(blob_id) == 0


def test_read_range(tmp_path):
    store = BlobStore(tmp_path)
    data = _data(50)
    blob_id = store.put(data)
    assert store.read_range(blob_id, 0, 10) == data[:10]
    assert store.read_range(blob_id, 20, 16) == data[20:36]
    assert store.read_range(blob_id, 45, 16) == data[45:]   # short read at the end
    assert store.read_range(blob_id, 50, 16) == b""


def test_put_is_idempotent(tmp_path):
    store = BlobStore(tmp_path)
    data = _data(64)
    first = store.put(data)
    mtime = store.path(first).stat().st_mtime_ns
    assert store.put(data) == first
    assert store.path(first).stat().st_mtime_ns == mtime  # not rewritten
    assert store.get(first) == data
    # no temporary files left behind
    assert _files(tmp_path) == {f"{first[:2]}/{first}"}


def test_store_survives_reopen(tmp_path):
    blob_id = BlobStore(tmp_path).put(b"persist me")
    assert BlobStore(tmp_path).get(blob_id) == b"persist me"


# ---- PartialBlob --------------------------------------------------------------------------------

def test_partial_full_transfer(tmp_path):
    store = BlobStore(tmp_path)
    data = _data(70)  # 5 chunks of 16, the last one 6 bytes
    blob_id = sha256_hex(data)
    part = store.partial(blob_id, len(data), CHUNK)
    assert part.count == 5
    assert part.missing() == [0, 1, 2, 3, 4]
    for i, chunk in reversed(list(enumerate(_chunks(data)))):  # order does not matter
        part.write(i, chunk)
    assert part.missing() == []
    assert not store.has(blob_id)
    assert part.complete() == data
    assert store.has(blob_id) and store.get(blob_id) == data
    assert not part.data_path.exists() and not part.have_path.exists()


def test_partial_resume_after_close(tmp_path):
    store = BlobStore(tmp_path)
    data = _data(100)  # 7 chunks
    blob_id = sha256_hex(data)
    chunks = _chunks(data)
    part = store.partial(blob_id, len(data), CHUNK)
    for i in (0, 2, 5):
        part.write(i, chunks[i])
    part.close()
    part.close()  # idempotent

    resumed = BlobStore(tmp_path).partial(blob_id, len(data), CHUNK)
    assert resumed.missing() == [1, 3, 4, 6]
    for i in resumed.missing():
        resumed.write(i, chunks[i])
    assert resumed.missing() == []
    assert resumed.complete() == data
    assert store.get(blob_id) == data


def test_resume_is_per_chunk_size(tmp_path):
    store = BlobStore(tmp_path)
    data = _data(64)
    blob_id = sha256_hex(data)
    part = store.partial(blob_id, len(data), CHUNK)
    part.write(0, data[:CHUNK])
    part.close()
    other = store.partial(blob_id, len(data), 32)  # another chunk size starts from scratch
    assert other.missing() == [0, 1]
    other.close()
    again = store.partial(blob_id, len(data), CHUNK)
    assert again.missing() == [1, 2, 3]
    again.close()


def test_resume_ignores_garbage_in_have_file(tmp_path):
    store = BlobStore(tmp_path)
    data = _data(48)
    blob_id = sha256_hex(data)
    part = store.partial(blob_id, len(data), CHUNK)
    part.write(1, _chunks(data)[1])
    part.close()
    with open(part.have_path, "a") as f:
        f.write("junk\n-1\n99\n2")  # junk, negative, out of range; "2" without newline counts
    resumed = store.partial(blob_id, len(data), CHUNK)
    assert resumed.missing() == [0]
    resumed.close()


def test_wrong_chunk_content_is_checksum_mismatch(tmp_path):
    store = BlobStore(tmp_path)
    data = _data(40)
    blob_id = sha256_hex(data)
    chunks = _chunks(data)
    part = store.partial(blob_id, len(data), CHUNK)
    part.write(0, chunks[0])
    part.write(1, bytes(b ^ 0xFF for b in chunks[1]))  # corrupt content, right length
    part.write(2, chunks[2])
    with pytest.raises(ProtocolError) as info:
        part.complete()
    assert info.value.code == "checksum_mismatch"
    assert not part.data_path.exists() and not part.have_path.exists()
    assert not store.has(blob_id)
    # a new attempt starts from nothing
    fresh = store.partial(blob_id, len(data), CHUNK)
    assert fresh.missing() == [0, 1, 2]
    fresh.close()


def test_missing_chunk_is_checksum_mismatch(tmp_path):
    store = BlobStore(tmp_path)
    data = _data(40)
    blob_id = sha256_hex(data)
    part = store.partial(blob_id, len(data), CHUNK)
    part.write(0, _chunks(data)[0])  # chunks 1 and 2 never arrive: the file holds zeros there
    with pytest.raises(ProtocolError, match="checksum_mismatch"):
        part.complete()
    assert not store.has(blob_id)


def test_overlong_chunk_is_checksum_mismatch(tmp_path):
    store = BlobStore(tmp_path)
    data = _data(20)
    blob_id = sha256_hex(data)
    part = store.partial(blob_id, len(data), CHUNK)
    part.write(0, data[:CHUNK])
    part.write(1, data[CHUNK:] + b"extra")  # grows the file beyond the blob size
    with pytest.raises(ProtocolError, match="checksum_mismatch"):
        part.complete()


def test_complete_durable(tmp_path):
    store = BlobStore(tmp_path)
    data = _data(33)
    blob_id = sha256_hex(data)
    part = store.partial(blob_id, len(data), CHUNK)
    for i, chunk in enumerate(_chunks(data)):
        part.write(i, chunk)
    assert part.complete(durable=True) == data
    assert store.get(blob_id) == data
    assert not part.data_path.exists()


def test_empty_partial_blob(tmp_path):
    store = BlobStore(tmp_path)
    blob_id = sha256_hex(b"")
    part = store.partial(blob_id, 0, CHUNK)
    assert part.missing() == [0]
    part.write(0, b"")
    assert part.complete() == b""
    assert store.has(blob_id)


def test_discard_removes_parts(tmp_path):
    store = BlobStore(tmp_path)
    data = _data(40)
    part = store.partial(sha256_hex(data), len(data), CHUNK)
    part.write(0, data[:CHUNK])
    part.discard()
    assert not part.data_path.exists() and not part.have_path.exists()
