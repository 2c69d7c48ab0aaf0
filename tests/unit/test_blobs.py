"""Unit tests of blob chunk frames and tensor payloads (sdk_device.protocol.blobs)."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from sdk_device.protocol import blobs
from sdk_device.protocol.errors import ProtocolError


def _blob(size: int) -> bytes:
    return bytes((i * 7 + 3) % 256 for i in range(size))


def _split(data: bytes, chunk_bytes: int) -> list[bytes]:
    n = blobs.chunk_count(len(data), chunk_bytes)
    return [data[i * chunk_bytes:(i + 1) * chunk_bytes] for i in range(n)]


def _frame(header: dict | str | bytes, data: bytes = b"") -> bytes:
    if isinstance(header, dict):
        header = json.dumps(header)
    if isinstance(header, str):
        header = header.encode()
    return blobs.CHUNK_MAGIC + struct.pack(">I", len(header)) + header + data


def _header(**over) -> dict:
    h = {"blob": "b" * 64, "index": 0, "count": 1, "size": 3, "chunk_bytes": 10,
         "sha256": blobs.sha256_hex(b"abc")}
    h.update(over)
    return h


def _malformed(payload: bytes) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        blobs.decode_chunk(payload)
    assert info.value.code == "malformed"
    return info.value


# ---- chunk_count ----------------------------------------------------------------------------

@pytest.mark.parametrize("size,chunk,expected", [
    (0, 10, 1),     # an empty blob still has one (empty) chunk
    (1, 10, 1),
    (9, 10, 1),
    (10, 10, 1),    # exact multiple: no empty trailing chunk
    (11, 10, 2),
    (20, 10, 2),
    (21, 10, 3),
    (100, 1, 100),
    (blobs.DEFAULT_CHUNK_BYTES * 4, blobs.DEFAULT_CHUNK_BYTES, 4),
    (blobs.DEFAULT_CHUNK_BYTES * 4 + 1, blobs.DEFAULT_CHUNK_BYTES, 5),
])
def test_chunk_count(size, chunk, expected):
    assert blobs.chunk_count(size, chunk) == expected


def test_sha256_hex():
    assert blobs.sha256_hex(b"") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert len(blobs.sha256_hex(b"x")) == 64


# ---- chunk frames ----------------------------------------------------------------------------

@pytest.mark.parametrize("size", [25, 30])  # last chunk short / last chunk full
def test_chunk_round_trip_first_middle_last(size):
    data = _blob(size)
    blob_id = blobs.sha256_hex(data)
    parts = _split(data, 10)
    assert len(parts) == 3
    decoded = []
    for i, part in enumerate(parts):
        chunk = blobs.decode_chunk(blobs.encode_chunk(blob_id, i, size, 10, part))
        geometry = (chunk.blob, chunk.index, chunk.count, chunk.size, chunk.chunk_bytes)
        assert geometry == (blob_id, i, 3, size, 10)
        assert chunk.data == part
        assert chunk.sha256 == blobs.sha256_hex(part)
        assert chunk.intact
        decoded.append(chunk.data)
    assert b"".join(decoded) == data
    assert len(decoded[-1]) == size - 20


def test_empty_blob_single_empty_chunk():
    frame = blobs.encode_chunk(blobs.sha256_hex(b""), 0, 0, 10, b"")
    chunk = blobs.decode_chunk(frame)
    assert chunk.count == 1 and chunk.data == b"" and chunk.intact


def test_frame_layout():
    frame = blobs.encode_chunk("c" * 64, 0, 3, 10, b"abc")
    assert frame[:4] == b"FSC1"
    (hlen,) = struct.unpack(">I", frame[4:8])
    header = json.loads(frame[8:8 + hlen])
    assert header["count"] == 1 and header["size"] == 3
    assert frame[8 + hlen:] == b"abc"


def test_flipped_data_byte_is_not_intact():
    data = _blob(30)
    frame = bytearray(blobs.encode_chunk(blobs.sha256_hex(data), 1, 30, 10, data[10:20]))
    frame[-3] ^= 0x01
    chunk = blobs.decode_chunk(bytes(frame))  # still a valid frame ...
    assert chunk.index == 1
    assert not chunk.intact                   # ... but the data does not match its sha256


def test_valid_hand_built_frame_decodes():
    chunk = blobs.decode_chunk(_frame(_header(), b"abc"))
    assert chunk.data == b"abc" and chunk.intact


@pytest.mark.parametrize("payload", [
    b"",
    b"FSC",
    b"FSC1\x00\x00",                       # truncated length field
    b"XXXX" + _frame(_header(), b"abc")[4:],  # bad magic
    b"fsc1" + _frame(_header(), b"abc")[4:],
])
def test_bad_magic_or_truncated(payload):
    _malformed(payload)


def test_header_length_beyond_payload():
    frame = _frame(_header(), b"abc")
    header_len = len(frame) - 8 - 3
    truncated = frame[:8 + header_len - 5]  # header cut short
    _malformed(truncated)
    too_long = blobs.CHUNK_MAGIC + struct.pack(">I", len(frame)) + frame[8:]
    _malformed(too_long)


def test_header_length_above_limit():
    big = _frame(b" " * (blobs.MAX_HEADER_BYTES + 1))
    err = _malformed(big)
    assert "header length" in err.detail


@pytest.mark.parametrize("header", [
    b"not json",
    b"\xff\xfe",
    b"[1, 2]",
    b'"s"',
    b"7",
    json.dumps({k: v for k, v in _header().items() if k != "sha256"}).encode(),
    json.dumps(_header(index="one")).encode(),
    json.dumps(_header(size=None)).encode(),
])
def test_bad_header_content(header):
    _malformed(_frame(header, b"abc"))


@pytest.mark.parametrize("over", [
    {"index": 1},                # == count
    {"index": -1},
    {"index": 5},
    {"count": 2},                # inconsistent with size/chunk_bytes
    {"count": 0},
    {"chunk_bytes": 0},
    {"chunk_bytes": -10},
    {"chunk_bytes": blobs.MAX_CHUNK_BYTES + 1, "count": 1},
])
def test_index_and_geometry_out_of_range(over):
    _malformed(_frame(_header(**over), b"abc"))


@pytest.mark.parametrize("data", [b"ab", b"abcd", b""])
def test_wrong_data_length(data):
    _malformed(_frame(_header(), data))


def test_wrong_data_length_middle_and_last_chunk():
    # size 25, chunk 10: chunk 1 must be 10 bytes, chunk 2 must be 5 bytes
    h = _header(size=25, count=3, index=1)
    blobs.decode_chunk(_frame(h, b"x" * 10))
    _malformed(_frame(h, b"x" * 5))
    h = _header(size=25, count=3, index=2)
    blobs.decode_chunk(_frame(h, b"x" * 5))
    _malformed(_frame(h, b"x" * 10))


def test_infinite_size_in_header_is_malformed():
    _malformed(_frame('{"blob":"x","index":0,"count":1,"size":Infinity,"chunk_bytes":10,"sha256":"x"}'))


def test_deeply_nested_header_is_malformed():
    _malformed(_frame(b"[" * (blobs.MAX_HEADER_BYTES - 4)))


# ---- tensors ---------------------------------------------------------------------------------

def test_tensors_round_trip():
    rng = np.random.default_rng(0)
    tensors = {
        "layers.0.weight": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
        "layers.0.bias": rng.standard_normal(4).astype(np.float32),
        "counter": np.arange(6, dtype=np.int64).reshape(2, 3),
        "single": np.asarray([2.5], dtype=np.float32),
    }
    out = blobs.decode_tensors(blobs.encode_tensors(tensors))
    assert set(out) == set(tensors)
    for name, arr in tensors.items():
        assert out[name].dtype == arr.dtype
        assert out[name].shape == arr.shape
        np.testing.assert_array_equal(out[name], arr)


def test_scalar_tensor_keeps_its_shape():
    out = blobs.decode_tensors(blobs.encode_tensors({"s": np.asarray(2.5, np.float32)}))
    assert out["s"].shape == ()


def test_non_contiguous_tensor_is_encoded():
    arr = np.arange(12, dtype=np.float32).reshape(3, 4).T  # a transposed view
    out = blobs.decode_tensors(blobs.encode_tensors({"t": arr}))
    np.testing.assert_array_equal(out["t"], arr)


def test_encoding_is_deterministic():
    t = {"b": np.ones(3, np.float32), "a": np.zeros(2, np.int64)}
    assert blobs.encode_tensors(t) == blobs.encode_tensors(dict(reversed(list(t.items()))))


@pytest.mark.parametrize("data", [b"", b"garbage bytes", b"\x08\x00\x00\x00\x00\x00\x00\x00{}",
                                  b"\xff" * 64])
def test_decode_tensors_garbage(data):
    with pytest.raises(ProtocolError) as info:
        blobs.decode_tensors(data)
    assert info.value.code == "malformed"


def test_decode_tensors_truncated():
    data = blobs.encode_tensors({"w": np.ones((10, 10), np.float32)})
    with pytest.raises(ProtocolError, match="malformed"):
        blobs.decode_tensors(data[:-8])


# ---- check_update ------------------------------------------------------------------------------

REF = {"w": ((2, 3), "float32"), "b": ((3,), "float32"), "n": ((), "int64")}


def _update(**over) -> dict:
    t = {"w": np.zeros((2, 3), np.float32), "b": np.ones(3, np.float32), "n": np.asarray(4, np.int64)}
    t.update(over)
    return t


def _check_code(tensors) -> str:
    with pytest.raises(ProtocolError) as info:
        blobs.check_update(tensors, REF)
    return info.value.code


def test_valid_update_passes():
    assert blobs.check_update(_update(), REF) is None
    # also after a safetensors round trip, as the server sees it (0-d tensors keep their shape)
    ref = {"w": ((2, 3), "float32"), "b": ((3,), "float32")}
    sent = {"w": np.zeros((2, 3), np.float32), "b": np.ones(3, np.float32)}
    assert blobs.check_update(blobs.decode_tensors(blobs.encode_tensors(sent)), ref) is None


def test_missing_tensor():
    t = _update()
    del t["b"]
    assert _check_code(t) == "missing_tensor"


def test_unexpected_tensor():
    assert _check_code(_update(extra=np.zeros(1, np.float32))) == "unexpected_tensor"


@pytest.mark.parametrize("over", [
    {"w": np.zeros((3, 2), np.float32)},     # transposed shape
    {"w": np.zeros((2, 3, 1), np.float32)},  # extra dim
    {"b": np.ones(4, np.float32)},
    {"w": np.zeros((2, 3), np.float64)},     # dtype
    {"n": np.asarray(4, np.int32)},
    {"n": np.asarray([4], np.int64)},        # scalar vs 1-element
])
def test_shape_or_dtype_mismatch(over):
    assert _check_code(_update(**over)) == "shape_mismatch"


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite(value):
    w = np.zeros((2, 3), np.float32)
    w[1, 2] = value
    assert _check_code(_update(w=w)) == "non_finite"


def test_reference_shape_as_list_is_accepted():
    ref = {"w": ([2, 3], "float32")}
    blobs.check_update({"w": np.zeros((2, 3), np.float32)}, ref)
