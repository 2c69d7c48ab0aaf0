"""``ort-training/1``: the ONNX Runtime training program as one blob.

A ``program_archive`` (uncompressed zip + ``index.json``) holding the files ONNX
Runtime's training API loads from disk::

    training_model.onnx   forward + loss + backward; inputs: the batch, outputs: loss, final
                          logits, then the new BatchNorm running statistics
    eval_model.onnx       forward only, eval mode; inputs: the batch and every weight
                          (so evaluation always sees the current weights), outputs: logits
    optimizer_model.onnx  ONNX Runtime's AdamW graph (for devices that only have ORT)
    checkpoint            the initial parameter values (ORT checkpoint format)

index.json (besides ``format`` and ``files``)::

    {"loss": {...}, "num_outputs": n,
     "inputs": [{"name": "input", "shape": [null, C, H, W], "dtype": "float32"},
                {"name": "labels", "shape": [null], "dtype": "int64"}, ...extra loss inputs],
     "outputs": ["loss", "logits", "new:<running statistic>", ...],
     "parameters": [{"name": ..., "shape": [...]}, ...],   trainable, in model order
     "buffers": [{"name": ..., "shape": [...]}, ...],      BatchNorm running statistics
     "eval_inputs": ["input", <every weight name>...]}

A null dimension is the batch: any size, so the last, smaller batch of an epoch trains
exactly like the others.
"""

from __future__ import annotations

from pathlib import Path

from . import program_archive
from .program_archive import ProgramError

FORMAT = "ort-training/1"
FILES = {"training_model": "training_model.onnx", "eval_model": "eval_model.onnx",
         "optimizer_model": "optimizer_model.onnx", "checkpoint": "checkpoint"}

__all__ = ["FORMAT", "FILES", "ProgramError", "pack", "read_index", "unpack"]


def pack(index: dict, files: dict[str, bytes]) -> bytes:
    """The blob from ``index`` (without format/files) and ``{role: bytes}`` for every
    role in ``FILES``."""
    missing = [role for role in FILES if role not in files]
    if missing:
        raise ProgramError(f"an {FORMAT} program needs {missing}")
    return program_archive.pack(FORMAT, index, {FILES[role]: files[role] for role in FILES})


def read_index(blob: bytes) -> dict:
    """The index of a program blob (files verified); ProgramError if it is not one."""
    return program_archive.read(blob, FORMAT)[0]


def unpack(blob: bytes, directory: Path) -> tuple[dict, dict[str, Path]]:
    """Write the program's files into ``directory``; returns (index, {role: path})."""
    index, files = program_archive.read(blob, FORMAT)
    missing = [role for role, name in FILES.items() if name not in files]
    if missing:
        raise ProgramError(f"program has no {missing}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    for role, name in FILES.items():
        paths[role] = directory / name  # our fixed names, never paths taken from the blob
        paths[role].write_bytes(files[name])
    return index, paths
