"""Program blobs that hold several files: an uncompressed zip with a JSON index.

Used by the ``ort-training/1`` and ``tflite/1`` formats. ``index.json`` carries the
format name, whatever the format needs to describe its files, and
``"files": {path: {"sha256": ..., "size": ...}}``; every file is checked against it when
read. Entries have a fixed timestamp, so equal programs are equal bytes (equal blob ids),
and are stored uncompressed, so a device needs no codec. JSON and model files only:
never pickle.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile

INDEX = "index.json"


class ProgramError(ValueError):
    """A blob that is not a valid program of the expected format."""


def pack(fmt: str, index: dict, files: dict[str, bytes]) -> bytes:
    """The blob of format ``fmt``: ``index`` plus ``{archive path: bytes}``."""
    listed = {path: {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
              for path, data in files.items()}
    full_index = {**index, "format": fmt, "files": listed}
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        archive.writestr(_entry(INDEX), json.dumps(full_index, sort_keys=True, indent=1))
        for path in sorted(files):
            archive.writestr(_entry(path), files[path])
    return buffer.getvalue()


def read(blob: bytes, fmt: str) -> tuple[dict, dict[str, bytes]]:
    """(index, {path: bytes}) of a blob of format ``fmt``; ProgramError if it is not one
    or a file does not match the sha256 and size its index lists."""
    try:
        with zipfile.ZipFile(io.BytesIO(blob)) as archive:
            index = json.loads(archive.read(INDEX))
            if not isinstance(index, dict) or index.get("format") != fmt:
                found = index.get("format") if isinstance(index, dict) else None
                raise ProgramError(f"program format is {found!r}, expected {fmt}")
            files = {path: archive.read(path) for path in index.get("files", {})}
    except (zipfile.BadZipFile, KeyError, json.JSONDecodeError) as exc:
        raise ProgramError(f"not a {fmt} program: {exc}") from None
    for path, data in files.items():
        expected = index["files"][path]
        if len(data) != expected["size"] or hashlib.sha256(data).hexdigest() != expected["sha256"]:
            raise ProgramError(f"{path} does not match its sha256 in the index")
    return index, files


def _entry(name: str) -> zipfile.ZipInfo:
    return zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
