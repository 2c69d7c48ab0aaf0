"""The wire formats a device client needs, written only from docs/protocol.md (for
``doc_client.py``): chunk frames (§6.3), JSON without NaN (§2), tensor names of a torchspec/1
program (§13.2)."""

from __future__ import annotations

import hashlib
import json
import re
import struct

# =============================================================================================
# The client: docs/protocol.md only
# =============================================================================================

SCHEMA = 2  # §5.1
MAX_CHUNK = 4 * 1024 * 1024  # §6.2
NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")  # §2, §5.5
HEX64 = re.compile(r"^[0-9a-f]{64}$")
TYPES = {"hello", "task", "result", "ack", "error", "heartbeat", "blob_request"}  # §5.1


class Refusal(Exception):
    """A task refusal (§9.3): sent as ``error`` with ``ref`` = task id."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code, self.detail = code, detail


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not allowed in a control message")  # §2: no NaN/Infinity


def parse_frame(payload: bytes) -> dict | None:
    """A chunk frame (§6.3), or None when it must be dropped."""
    if len(payload) < 8 or payload[:4] != b"FSC1":
        return None
    (h,) = struct.unpack(">I", payload[4:8])
    if h > 1024 or 8 + h > len(payload):
        return None
    try:
        header = json.loads(payload[8:8 + h].decode("utf-8"))
        blob, sha, index, count, size, cb = (header[k] for k in
                                             ("blob", "sha256", "index", "count", "size", "chunk_bytes"))
    except (ValueError, KeyError, TypeError):
        return None
    if not (isinstance(blob, str) and HEX64.match(blob) and isinstance(sha, str) and HEX64.match(sha)):
        return None
    if not all(type(v) is int for v in (index, count, size, cb)) or not 1 <= cb <= MAX_CHUNK:
        return None
    if count != max(1, -(-size // cb)) or not 0 <= index < count:
        return None
    data = payload[8 + h:]
    if len(data) != min(cb, size - index * cb):
        return None
    return {"blob": blob, "index": index, "size": size, "chunk_bytes": cb, "sha256": sha, "data": data}


def frame(blob_id: str, index: int, size: int, chunk_bytes: int, data: bytes) -> bytes:
    """One chunk frame (§6.3)."""
    header = json.dumps({"blob": blob_id, "index": index, "count": max(1, -(-size // chunk_bytes)),
                         "size": size, "chunk_bytes": chunk_bytes,
                         "sha256": hashlib.sha256(data).hexdigest()}, separators=(",", ":")).encode()
    return b"FSC1" + struct.pack(">I", len(header)) + header + data


def spec_tensors(spec: dict) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes of a torchspec/1 model (§12.2 parameters, §13.2 names)."""
    out: dict[str, tuple[int, ...]] = {}

    def walk(layers: list, prefix: str) -> None:
        for i, layer in enumerate(layers):
            p, op = f"{prefix}{i}.", layer["op"]
            if op == "conv2d":
                g = layer.get("groups", 1)
                out[p + "weight"] = (layer["out"], layer["in"] // g, layer["k"], layer["k"])
                if layer.get("bias", True):
                    out[p + "bias"] = (layer["out"],)
            elif op == "linear":
                out[p + "weight"] = (layer["out"], layer["in"])
                if layer.get("bias", True):
                    out[p + "bias"] = (layer["out"],)
            elif op == "batchnorm2d":
                tracked = ("running_mean", "running_var") if layer.get("track", True) else ()
                names = ("weight", "bias", *tracked)
                out.update({p + n: (layer["c"],) for n in names})
            elif op == "residual":
                walk(layer["body"], p + "body.")
                walk(layer.get("shortcut", []), p + "shortcut.")
            elif op == "exit":
                walk(layer["head"], p + "head.")

    walk(spec["layers"], "layers.")
    return out
