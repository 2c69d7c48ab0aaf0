"""Blob encoding of the wire protocol: content ids, chunk frames and tensor payloads.

A blob is an immutable byte string named by its sha256 (lowercase hex). It travels in
chunks of ``chunk_bytes`` (default 256 KiB); chunk ``i`` holds bytes
``[i*chunk_bytes, min(size, (i+1)*chunk_bytes))``. Each chunk is one binary MQTT payload::

    b"FSC1" | uint32 big-endian header length | header JSON (utf-8) | chunk bytes

header = {"blob": <sha256>, "index": i, "count": n, "size": <blob bytes>,
          "chunk_bytes": <chunk size>, "sha256": <sha256 of these chunk bytes>}

Tensors (weights, updates) are safetensors files: never pickle.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass

import numpy as np

from . import wire_json
from .errors import ProtocolError

CHUNK_MAGIC = b"FSC1"
DEFAULT_CHUNK_BYTES = 256 * 1024
MAX_CHUNK_BYTES = 4 * 1024 * 1024
MAX_HEADER_BYTES = 1024


def sha256_hex(data: bytes) -> str:
    """The content id of ``data``."""
    return hashlib.sha256(data).hexdigest()


def _is_sha(value: object) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def chunk_count(size: int, chunk_bytes: int) -> int:
    """Number of chunks for a blob of ``size`` bytes (an empty blob still has one)."""
    return max(1, -(-size // chunk_bytes))


@dataclass(frozen=True)
class Chunk:
    """One decoded chunk frame."""

    blob: str
    index: int
    count: int
    size: int
    chunk_bytes: int
    sha256: str
    data: bytes

    @property
    def intact(self) -> bool:
        """True when ``data`` matches the sha256 the sender declared for it."""
        return sha256_hex(self.data) == self.sha256


def encode_chunk(blob: str, index: int, size: int, chunk_bytes: int, data: bytes,
                 sha: str | None = None) -> bytes:
    """Frame chunk ``index`` of blob ``blob`` (``data`` = that chunk's bytes; ``sha`` = its
    sha256 if already known)."""
    header = json.dumps(
        {
            "blob": blob,
            "index": index,
            "count": chunk_count(size, chunk_bytes),
            "size": size,
            "chunk_bytes": chunk_bytes,
            "sha256": sha or sha256_hex(data),
        },
        separators=(",", ":"),
    ).encode()
    return CHUNK_MAGIC + struct.pack(">I", len(header)) + header + data


def decode_chunk(payload: bytes) -> Chunk:
    """Parse one chunk frame; ProtocolError("malformed") if it is not a valid frame.

    The chunk's sha256 is not checked here: the receiver checks the whole blob, and the
    chunks one by one only when that fails (see PartialBlob), off the network thread.
    """
    if len(payload) < 8 or payload[:4] != CHUNK_MAGIC:
        raise ProtocolError("malformed", "not a fedsdk chunk frame (bad magic)")
    (header_len,) = struct.unpack(">I", payload[4:8])
    if header_len > MAX_HEADER_BYTES or 8 + header_len > len(payload):
        raise ProtocolError("malformed", f"chunk header length {header_len} is invalid")
    try:
        header = wire_json.loads(payload[8 : 8 + header_len])
        blob, declared_sha = header["blob"], header["sha256"]
        index, count, size, chunk_bytes = (header[k] for k in ("index", "count", "size", "chunk_bytes"))
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, RecursionError) as exc:
        raise ProtocolError("malformed", f"bad chunk header: {exc}") from None
    if not (_is_sha(blob) and _is_sha(declared_sha)
            and all(type(v) is int for v in (index, count, size, chunk_bytes))):
        raise ProtocolError("malformed", "chunk header fields have the wrong types")
    data = payload[8 + header_len :]
    if not 0 < chunk_bytes <= MAX_CHUNK_BYTES:
        raise ProtocolError("malformed", f"chunk_bytes {chunk_bytes} out of range")
    if count != chunk_count(size, chunk_bytes) or not 0 <= index < count:
        raise ProtocolError("malformed", f"chunk {index}/{count} inconsistent with size {size}")
    expected_len = min(chunk_bytes, size - index * chunk_bytes)
    if len(data) != expected_len:
        raise ProtocolError("malformed", f"chunk {index} has {len(data)} bytes, expected {expected_len}")
    return Chunk(blob, index, count, size, chunk_bytes, declared_sha, data)


# ---- tensors ---------------------------------------------------------------------------

def encode_tensors(tensors: dict[str, np.ndarray]) -> bytes:
    """Serialise named numpy arrays as a safetensors file (bytes)."""
    from safetensors.numpy import save

    return save({name: np.require(arr, requirements="C") for name, arr in tensors.items()})


def decode_tensors(data: bytes) -> dict[str, np.ndarray]:
    """Parse a safetensors file; ProtocolError("malformed") if it is not one."""
    from safetensors.numpy import load

    try:
        return dict(load(data))
    except Exception as exc:  # safetensors raises its own error types
        raise ProtocolError("malformed", f"not a safetensors file: {exc}") from None


def first_non_finite(tensors: dict[str, np.ndarray]) -> str | None:
    """The first (by name) floating-point tensor holding NaN or Inf, or None."""
    for name, arr in sorted(tensors.items()):
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            return name
    return None


def check_update(
    tensors: dict[str, np.ndarray], reference: dict[str, tuple[tuple[int, ...], str]]
) -> None:
    """Validate returned weights against the (shape, dtype) each name must have.

    Raises ProtocolError: ``missing_tensor``, ``unexpected_tensor``, ``shape_mismatch``
    or ``non_finite`` (NaN/Inf anywhere in a floating-point tensor).
    """
    missing = sorted(set(reference) - set(tensors))
    extra = sorted(set(tensors) - set(reference))
    if missing:
        raise ProtocolError("missing_tensor", f"update lacks {missing[:5]}")
    if extra:
        raise ProtocolError("unexpected_tensor", f"update has unknown tensors {extra[:5]}")
    for name, (shape, dtype) in reference.items():
        arr = tensors[name]
        if tuple(arr.shape) != tuple(shape) or str(arr.dtype) != dtype:
            raise ProtocolError(
                "shape_mismatch",
                f"{name}: got {arr.dtype}{list(arr.shape)}, expected {dtype}{list(shape)}",
            )
    bad = first_non_finite(tensors)
    if bad is not None:
        raise ProtocolError("non_finite", f"{bad} contains NaN or Inf")
