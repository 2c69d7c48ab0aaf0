"""Content-addressed blobs on disk, and partially received blobs that survive restarts.

Layout under ``root``::

    <sha[:2]>/<sha>                      complete, verified blobs
    partial/<sha>-<chunk_bytes>.part     a blob being received, chunks at their offsets
    partial/<sha>-<chunk_bytes>.have     indices of the chunks received (verified) so far
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ..protocol.blobs import chunk_count, sha256_hex
from ..protocol.errors import ProtocolError


def _atomic_write(path: Path, data: bytes, durable: bool = True) -> None:
    """Write via a temporary file and rename; ``durable`` also fsyncs before the rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class BlobStore:
    """Immutable blobs named by sha256."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, blob_id: str) -> Path:
        return self.root / blob_id[:2] / blob_id

    def has(self, blob_id: str) -> bool:
        return self.path(blob_id).is_file()

    def put(self, data: bytes) -> str:
        """Store ``data``; returns its id (sha256 hex). Idempotent."""
        blob_id = sha256_hex(data)
        if not self.has(blob_id):
            _atomic_write(self.path(blob_id), data)
        return blob_id

    def get(self, blob_id: str) -> bytes:
        return self.path(blob_id).read_bytes()

    def size(self, blob_id: str) -> int:
        return self.path(blob_id).stat().st_size

    def read_range(self, blob_id: str, offset: int, length: int) -> bytes:
        with open(self.path(blob_id), "rb") as f:
            f.seek(offset)
            return f.read(length)

    def partial(self, blob_id: str, size: int, chunk_bytes: int) -> PartialBlob:
        return PartialBlob(self, blob_id, size, chunk_bytes)


class PartialBlob:
    """The chunks of one blob received so far, resumable across restarts.

    Chunks are written at their offsets into ``partial/<sha>-<chunk_bytes>.part``; the
    indices received are recorded in a ``.have`` file beside it (a line per index,
    appended after the chunk's bytes are written).
    """

    def __init__(self, store: BlobStore, blob_id: str, size: int, chunk_bytes: int) -> None:
        self.store = store
        self.blob_id = blob_id
        self.size = size
        self.chunk_bytes = chunk_bytes
        self.count = chunk_count(size, chunk_bytes)
        base = store.root / "partial" / f"{blob_id}-{chunk_bytes}"
        self.data_path = base.with_suffix(".part")
        self.have_path = base.with_suffix(".have")
        self.have: set[int] = set()
        if self.data_path.is_file() and self.have_path.is_file():
            lines = self.have_path.read_text().split()
            self.have = {int(x) for x in lines if x.isdigit() and int(x) < self.count}
        else:
            self.data_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.data_path, "wb") as f:
                f.truncate(size)
            self.have_path.write_text("")
        self._fd = os.open(self.data_path, os.O_WRONLY)
        self._have_file = open(self.have_path, "a")  # noqa: SIM115 - closed in complete/close

    def missing(self) -> list[int]:
        """Indices of the chunks not yet received, ascending."""
        return [i for i in range(self.count) if i not in self.have]

    def write(self, index: int, data: bytes) -> None:
        # Not fsynced: a chunk lost in a power cut shows up as a whole-blob checksum
        # mismatch and is fetched again, which is cheaper than an fsync per chunk.
        os.pwrite(self._fd, data, index * self.chunk_bytes)
        self._have_file.write(f"{index}\n")
        self._have_file.flush()
        self.have.add(index)

    def close(self) -> None:
        """Stop writing; what was received stays on disk for a later resume."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            self._have_file.close()

    def complete(self, durable: bool = False) -> bytes:
        """Check the whole blob's sha256 and move it into the store.

        ``durable`` fsyncs first (the server does, before acknowledging an update).
        Raises ProtocolError("checksum_mismatch") and drops the parts when the bytes
        are not the blob they claim to be.
        """
        if durable:
            os.fsync(self._fd)
        self.close()
        data = self.data_path.read_bytes()
        if len(data) != self.size or sha256_hex(data) != self.blob_id:
            self.discard()
            raise ProtocolError(
                "checksum_mismatch",
                f"blob {self.blob_id[:12]}: received {len(data)} bytes hash to "
                f"{sha256_hex(data)[:12]}",
            )
        final = self.store.path(self.blob_id)
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self.data_path, final)
        self.have_path.unlink(missing_ok=True)
        return data

    def discard(self) -> None:
        self.close()
        self.data_path.unlink(missing_ok=True)
        self.have_path.unlink(missing_ok=True)
