"""Test helpers for dataset files: IDX bytes, a tiny catalogue entry with its mirror
directory, tampered copies of real files, and a local HTTP server."""

from __future__ import annotations

import functools
import gzip
import hashlib
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np

from server_toolkit.data.catalogue import IdxFile, KnownDataset
from server_toolkit.data.idx import read_content


def idx_bytes(array: np.ndarray) -> bytes:
    """The IDX encoding of a uint8 array."""
    assert array.dtype == np.uint8
    return (struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
            + array.tobytes())


def tiny_dataset(mirror: Path, seed: int = 0) -> KnownDataset:
    """A 4-file MNIST-style catalogue entry (6 train, 3 test images) whose canonical .gz files
    are written to ``mirror``; its digests are those of these files."""
    rng = np.random.default_rng(seed)
    arrays = {"x_train": rng.integers(0, 256, (6, 28, 28), dtype=np.uint8),
              "y_train": np.arange(6, dtype=np.uint8),
              "x_test": rng.integers(0, 256, (3, 28, 28), dtype=np.uint8),
              "y_test": np.arange(3, dtype=np.uint8)}
    names = {"x_train": "train-images-idx3-ubyte", "y_train": "train-labels-idx1-ubyte",
             "x_test": "t10k-images-idx3-ubyte", "y_test": "t10k-labels-idx1-ubyte"}
    mirror.mkdir(parents=True, exist_ok=True)
    files = []
    for key, name in names.items():
        content = idx_bytes(arrays[key])
        packed = gzip.compress(content, mtime=0)
        (mirror / f"{name}.gz").write_bytes(packed)
        files.append(IdxFile(key, name, hashlib.md5(packed).hexdigest(), len(packed),
                             hashlib.sha256(content).hexdigest(), len(content)))
    return KnownDataset(name="tiny", title="tiny test set", licence="-", homepage="-",
                        files=tuple(files), npz_name="tiny.npz")


def write_tampered_gz(source: Path, target: Path) -> None:
    """A valid gzip of ``source``'s content with its last byte changed (a label or a pixel)."""
    content = bytearray(read_content(source))
    content[-1] = (content[-1] + 1) % 10
    target.write_bytes(gzip.compress(bytes(content)))


def mirror_with_one_tampered_file(real_dir: Path, mirror: Path, tampered: str) -> Path:
    """``mirror``: symlinks to ``real_dir``'s files, but ``tampered`` altered."""
    mirror.mkdir(parents=True, exist_ok=True)
    for path in real_dir.iterdir():
        if path.name == tampered:
            write_tampered_gz(path, mirror / path.name)
        else:
            (mirror / path.name).symlink_to(path)
    return mirror


class _Handler(SimpleHTTPRequestHandler):
    requests: list[str]

    def log_message(self, *args) -> None:  # keep the test output clean
        pass

    def do_GET(self) -> None:
        self.requests.append(self.path)
        super().do_GET()


@contextmanager
def http_server(directory: Path) -> Iterator[tuple[str, list[str]]]:
    """Serve ``directory`` on 127.0.0.1 (a free port) in a thread; yields (base URL, the list of
    request paths it receives)."""
    requests: list[str] = []
    handler = type("Handler", (_Handler,), {"requests": requests})
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(directory)))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", requests
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
