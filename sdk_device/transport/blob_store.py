"""Content-addressed blobs on disk, and partially received blobs that survive restarts.

Layout under ``root``::

    <sha[:2]>/<sha>                      complete, verified blobs
    partial/<sha>-<chunk_bytes>.part     a blob being received, chunks at their offsets
    partial/<sha>-<chunk_bytes>.have     indices of the chunks received (verified) so far
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from ..protocol.blobs import chunk_count, sha256_hex


def atomic_write(path: Path, data: bytes, durable: bool = True) -> None:
    """Write via a temporary file and rename; ``durable`` also fsyncs before the rename. The
    file is readable by its owner only (mode 0600, from ``mkstemp``), at every moment."""
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
            atomic_write(self.path(blob_id), data)
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

    Chunks are kept in memory and written through, at their offsets, to
    ``partial/<sha>-<chunk_bytes>.part``; each received index and the sha256 its sender
    declared for it go to a ``.have`` file beside it (a line ``<index> <sha256>``,
    appended after the bytes are written). The whole blob's sha256 is computed as the
    chunks arrive (over the in-order prefix), so it is ready when the last one lands.
    Only when it fails are the chunks checked one by one, to fetch the corrupt ones again.
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
        self.have: dict[int, str] = {}  # chunk index -> sha256 declared by its sender
        self.buffer = bytearray(size)
        self._fd = -1
        self._have_file = None
        if self.data_path.is_file() and self.have_path.is_file():  # resume
            for line in self.have_path.read_text().splitlines():
                index, _, sha = line.partition(" ")
                if index.isdigit() and int(index) < self.count and len(sha) == 64:
                    self.have[int(index)] = sha
            with open(self.data_path, "rb") as f:
                f.readinto(self.buffer)
        self._restart_hash()

    def _restart_hash(self) -> None:
        self._hasher = hashlib.sha256()
        self._hashed = 0  # chunks [0, _hashed) are in the hasher
        self._advance_hash()

    def _advance_hash(self) -> None:
        cb = self.chunk_bytes
        while self._hashed < self.count and self._hashed in self.have:
            self._hasher.update(memoryview(self.buffer)[self._hashed * cb:(self._hashed + 1) * cb])
            self._hashed += 1

    def _open(self) -> None:
        if self._fd < 0:
            self.data_path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.data_path, os.O_WRONLY | os.O_CREAT, 0o600)
            self._have_file = open(self.have_path, "a")  # noqa: SIM115 - closed in close()

    def missing(self) -> list[int]:
        """Indices of the chunks not yet received, ascending."""
        return [i for i in range(self.count) if i not in self.have]

    def write(self, index: int, data: bytes, declared_sha: str) -> None:
        # Not fsynced: a chunk lost in a power cut shows up as a checksum mismatch and is
        # fetched again, which is cheaper than an fsync per chunk.
        offset = index * self.chunk_bytes
        self.buffer[offset:offset + len(data)] = data
        self._open()
        os.pwrite(self._fd, data, offset)
        self._have_file.write(f"{index} {declared_sha}\n")
        self._have_file.flush()
        self.have[index] = declared_sha
        self._advance_hash()

    def verified(self) -> bool:
        """True when every chunk is here and the bytes hash to ``blob_id``."""
        return self._hashed == self.count and self._hasher.hexdigest() == self.blob_id

    def read(self) -> bytes:
        """The bytes received so far (the whole blob once nothing is missing)."""
        return bytes(self.buffer)

    def corrupt_chunks(self) -> list[int]:
        """Indices whose bytes do not match the sha256 declared for them."""
        cb = self.chunk_bytes
        view = memoryview(self.buffer)
        return [i for i, sha in sorted(self.have.items()) if sha256_hex(view[i * cb:(i + 1) * cb]) != sha]

    def forget(self, indices: list[int]) -> None:
        """Drop chunks (to fetch them again)."""
        for i in indices:
            self.have.pop(i, None)
        if self._have_file is not None:
            self._have_file.close()
            self._have_file = None
            os.close(self._fd)
            self._fd = -1
        self.have_path.write_text("".join(f"{i} {sha}\n" for i, sha in sorted(self.have.items())))
        self._restart_hash()

    def commit(self, durable: bool = False) -> bytes:
        """Move the verified blob into the store and return its bytes (``durable``: fsync)."""
        if not self.verified():
            raise ValueError("commit() before the blob is complete and verified")
        self._open()  # (an empty blob has no chunk write that opened it)
        if durable:
            os.fsync(self._fd)
        self.close()
        final = self.store.path(self.blob_id)
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self.data_path, final)
        self.have_path.unlink(missing_ok=True)
        return bytes(self.buffer)

    def close(self) -> None:
        """Stop writing; what was received stays on disk for a later resume."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._have_file is not None:
            self._have_file.close()
            self._have_file = None

    def discard(self) -> None:
        self.close()
        self.data_path.unlink(missing_ok=True)
        self.have_path.unlink(missing_ok=True)
