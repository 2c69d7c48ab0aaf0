"""``ort-training/1``: the ONNX Runtime training program as one blob.

The blob is an uncompressed zip (so a device can unpack it without a codec) holding an
``index.json`` and the files ONNX Runtime's training API loads from disk::

    index.json            what is inside (below)
    training_model.onnx   forward + loss + backward; inputs: the batch, outputs: loss, final
                          logits, then the new BatchNorm running statistics
    eval_model.onnx       forward only, eval mode; inputs: the batch and every weight
                          (so evaluation always sees the current weights), outputs: logits
    optimizer_model.onnx  ONNX Runtime's AdamW graph (for devices that only have ORT)
    checkpoint            the initial parameter values (ORT checkpoint format)

index.json::

    {"format": "ort-training/1", "loss": {...}, "num_outputs": n,
     "inputs": [{"name": "input", "shape": [null, C, H, W], "dtype": "float32"},
                {"name": "labels", "shape": [null], "dtype": "int64"}, ...extra loss inputs],
     "outputs": ["loss", "logits", <running statistic names>...],
     "parameters": [{"name": ..., "shape": [...]}, ...],   trainable, in model order
     "buffers": [{"name": ..., "shape": [...]}, ...],      BatchNorm running statistics
     "files": {"training_model": {"path": ..., "sha256": ..., "size": ...}, ...}}

A null dimension is the batch: any size up to the recipe's batch size, so the last,
smaller batch of an epoch trains exactly like the others. Never pickle: JSON + ONNX.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from pathlib import Path

FORMAT = "ort-training/1"
ROLES = ("training_model", "eval_model", "optimizer_model", "checkpoint")


class ProgramError(ValueError):
    """A blob that is not a valid ort-training/1 program."""


def pack(index: dict, files: dict[str, bytes]) -> bytes:
    """Build the blob from ``index`` (without "files") and ``{role: file bytes}``."""
    missing = [role for role in ROLES if role not in files]
    if missing:
        raise ProgramError(f"an ort-training program needs {missing}")
    entries = {role: {"path": _file_name(role), "sha256": hashlib.sha256(data).hexdigest(),
                      "size": len(data)} for role, data in files.items()}
    full_index = {**index, "format": FORMAT, "files": entries}
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        archive.writestr(_fixed_time("index.json"), json.dumps(full_index, sort_keys=True, indent=1))
        for role in sorted(files):
            archive.writestr(_fixed_time(entries[role]["path"]), files[role])
    return buffer.getvalue()


def read_index(blob: bytes) -> dict:
    """The index of a program blob; ProgramError if it is not one."""
    try:
        with zipfile.ZipFile(io.BytesIO(blob)) as archive:
            index = json.loads(archive.read("index.json"))
    except (zipfile.BadZipFile, KeyError, json.JSONDecodeError) as exc:
        raise ProgramError(f"not an {FORMAT} program: {exc}") from None
    if index.get("format") != FORMAT:
        raise ProgramError(f"program format is {index.get('format')!r}, expected {FORMAT}")
    return index


def unpack(blob: bytes, directory: Path) -> tuple[dict, dict[str, Path]]:
    """Write the program's files into ``directory``; returns (index, {role: path}).
    Every file is checked against the sha256 and size the index lists."""
    index = read_index(blob)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    with zipfile.ZipFile(io.BytesIO(blob)) as archive:
        for role in ROLES:
            entry = index["files"].get(role)
            if entry is None:
                raise ProgramError(f"program has no {role}")
            data = archive.read(entry["path"])
            if len(data) != entry["size"] or hashlib.sha256(data).hexdigest() != entry["sha256"]:
                raise ProgramError(f"{role} does not match its sha256 in the index")
            paths[role] = directory / _file_name(role)  # our names, never the blob's paths
            paths[role].write_bytes(data)
    return index, paths


def _file_name(role: str) -> str:
    return "checkpoint" if role == "checkpoint" else f"{role}.onnx"


def _fixed_time(name: str) -> zipfile.ZipInfo:
    """A zip entry with a fixed timestamp, so equal programs are equal bytes (equal blob ids)."""
    return zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
