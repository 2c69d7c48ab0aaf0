"""Unit tests of the on-disk blob store and resumable partial blobs (sdk_device.transport.blob_store)."""

from __future__ import annotations

import pytest

from sdk_device.protocol.blobs import chunk_count, sha256_hex
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

def _write_all(part, data, order=None, corrupt=None):
    """Write every chunk of ``data`` (declaring its true sha); ``corrupt`` = index to garble."""
    chunks = _chunks(data)
    for i in order or range(len(chunks)):
        payload = chunks[i]
        if i == corrupt:
            payload = bytes(b ^ 0xFF for b in payload)
        part.write(i, payload, sha256_hex(chunks[i]))


def test_partial_full_transfer_in_any_order(tmp_path):
    store = BlobStore(tmp_path)
    data = _data(70)  # 5 chunks of 16, the last one 6 bytes
    part = store.partial(sha256_hex(data), len(data), CHUNK)
    assert part.count == 5 and part.missing() == [0, 1, 2, 3, 4]
    _write_all(part, data, order=[4, 2, 0, 3, 1])
    assert part.missing() == [] and part.verified()
    assert part.commit() == data
    assert store.get(sha256_hex(data)) == data
    assert not part.data_path.exists() and not part.have_path.exists()


def test_not_verified_until_complete(tmp_path):
    data = _data(70)
    part = BlobStore(tmp_path).partial(sha256_hex(data), len(data), CHUNK)
    _write_all(part, data, order=[0, 1, 2, 3])
    assert not part.verified()
    with pytest.raises(ValueError):
        part.commit()


def test_partial_resume_after_close(tmp_path):
    store = BlobStore(tmp_path)
    data = _data(70)
    chunks = _chunks(data)
    part = store.partial(sha256_hex(data), len(data), CHUNK)
    for i in (0, 2):
        part.write(i, chunks[i], sha256_hex(chunks[i]))
    part.close()
    resumed = store.partial(sha256_hex(data), len(data), CHUNK)
    assert resumed.missing() == [1, 3, 4]
    for i in resumed.missing():
        resumed.write(i, chunks[i], sha256_hex(chunks[i]))
    assert resumed.verified() and resumed.commit() == data


def test_resume_is_per_chunk_size(tmp_path):
    store = BlobStore(tmp_path)
    data = _data(64)
    part = store.partial(sha256_hex(data), len(data), CHUNK)
    part.write(0, data[:CHUNK], sha256_hex(data[:CHUNK]))
    part.close()
    assert store.partial(sha256_hex(data), len(data), 32).missing() == [0, 1]


def test_resume_ignores_garbage_in_have_file(tmp_path):
    store = BlobStore(tmp_path)
    data = _data(48)
    part = store.partial(sha256_hex(data), len(data), CHUNK)
    chunk1 = _chunks(data)[1]
    part.write(1, chunk1, sha256_hex(chunk1))
    part.close()
    with open(part.have_path, "a") as f:
        f.write("junk\n-1 x\n99 " + "a" * 64 + "\n2 short\n")
    assert store.partial(sha256_hex(data), len(data), CHUNK).missing() == [0, 2]


def test_corrupt_chunk_is_found_and_fetched_again(tmp_path):
    data = _data(48)
    part = BlobStore(tmp_path).partial(sha256_hex(data), len(data), CHUNK)
    _write_all(part, data, corrupt=1)
    assert not part.verified()
    assert part.corrupt_chunks() == [1]
    part.forget([1])
    assert part.missing() == [1]
    part.write(1, _chunks(data)[1], sha256_hex(_chunks(data)[1]))
    assert part.verified() and part.commit() == data


def test_a_blob_that_is_not_what_it_claims_has_no_corrupt_chunk(tmp_path):
    data, claimed = _data(48), sha256_hex(b"something else")
    part = BlobStore(tmp_path).partial(claimed, len(data), CHUNK)
    _write_all(part, data)
    assert not part.verified() and part.corrupt_chunks() == []  # every chunk is as declared


def test_commit_durable(tmp_path):
    data = _data(40)
    part = BlobStore(tmp_path).partial(sha256_hex(data), len(data), CHUNK)
    _write_all(part, data)
    assert part.commit(durable=True) == data


def test_empty_partial_blob(tmp_path):
    part = BlobStore(tmp_path).partial(sha256_hex(b""), 0, CHUNK)
    assert part.count == 1 and part.missing() == [0]
    part.write(0, b"", sha256_hex(b""))
    assert part.verified() and part.commit() == b""


def test_discard_removes_parts(tmp_path):
    data = _data(40)
    part = BlobStore(tmp_path).partial(sha256_hex(data), len(data), CHUNK)
    part.write(0, data[:CHUNK], sha256_hex(data[:CHUNK]))
    part.discard()
    assert not part.data_path.exists() and not part.have_path.exists()
