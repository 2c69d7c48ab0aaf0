"""Exported programs kept on disk, so a restarted server or a new run of a fleet does not
export them again (an ExecuTorch export takes 20 s for a small CNN, minutes for a VGG).

One file per program: ``<directory>/<key>.<format>``, where ``key`` hashes the spec, the loss,
the batch size, the format and ``exporter_version()`` (the source of every exporter module,
the loss maths and the versions of torch, executorch and onnx): a change to any of them makes
a new key, and the stale file is never read again. The directory is ``$FEDSDK_CACHE_DIR/programs``
or ``~/.cache/fedsdk/programs``; deleting it only costs exports. A file is written under another
name and renamed, and one process exports a given program while others wait for it (a file
lock), so parallel servers and test processes share the store safely.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import logging
import os
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import fedcore.losses
import fedcore.modelspec

try:
    import fcntl
except ImportError:  # not POSIX: no lock; two processes may export the same program once each
    fcntl = None

log = logging.getLogger(__name__)

EXPORT_PACKAGE = Path(__file__).parent
VERSIONED_PACKAGES = ("torch", "executorch", "onnx")


def default_directory() -> Path:
    """``$FEDSDK_CACHE_DIR/programs``, else ``~/.cache/fedsdk/programs``."""
    root = os.environ.get("FEDSDK_CACHE_DIR") or Path.home() / ".cache" / "fedsdk"
    return Path(root) / "programs"


@functools.cache
def exporter_version() -> str:
    """A hash of what an exported program depends on besides its spec, loss and batch."""
    digest = hashlib.sha256()
    sources = sorted(EXPORT_PACKAGE.glob("*.py")) + [Path(fedcore.losses.__file__),
                                                     Path(fedcore.modelspec.__file__)]
    for path in sources:
        digest.update(path.name.encode() + path.read_bytes())
    for package in VERSIONED_PACKAGES:
        try:
            digest.update(f"{package}=={importlib.metadata.version(package)}".encode())
        except importlib.metadata.PackageNotFoundError:
            digest.update(f"{package} absent".encode())
    return digest.hexdigest()


class ProgramStore:
    """Programs on disk in ``directory`` (see the module docstring)."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = Path(directory) if directory is not None else default_directory()

    def path(self, key: str, fmt: str) -> Path:
        name = hashlib.sha256(f"{key}:{exporter_version()}".encode()).hexdigest()
        return self.directory / f"{name}.{fmt.replace('/', '-')}"

    def get_or_make(self, key: str, fmt: str, make: Callable[[], bytes]) -> tuple[bytes, bool]:
        """(the program of ``key`` in ``fmt``, whether it was read from disk); ``make()``
        exports it when it is not stored yet."""
        path = self.path(key, fmt)
        if path.is_file():
            return path.read_bytes(), True
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            log.warning("cannot keep exported programs in %s (%s); exporting without keeping them",
                        self.directory, exc)
            return make(), False
        with _locked(path.with_suffix(path.suffix + ".lock")):
            if path.is_file():  # another process exported it while this one waited
                return path.read_bytes(), True
            data = make()
            partial = path.with_name(f"{path.name}.{os.getpid()}.part")
            try:
                partial.write_bytes(data)
                partial.replace(path)
            except OSError as exc:
                log.warning("could not keep the exported program in %s: %s", path, exc)
                partial.unlink(missing_ok=True)
        return data, False


@contextmanager
def _locked(path: Path):
    with open(path, "w") as handle:
        if fcntl is not None:
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield
