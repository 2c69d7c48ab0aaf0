"""Build and start the C++ device client (``device_cpp/``) for integration tests.

The build (CMake, Release, ``-j2``) goes to ``device_cpp/build`` (git-ignored), so a session
builds it once and later sessions only relink what changed. Its training data is a directory
with ``x.npy`` (float32 (N, C, H, W)) and ``y.npy`` (int64 (N,)), docs/device_cpp.md.
"""

from __future__ import annotations

import contextlib
import fcntl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "device_cpp"
BUILD = SOURCE / "build"
BINARY = BUILD / "fedsdk-device"


def executorch_root() -> Path:
    """The ``executorch`` package directory of this interpreter (headers, libraries, CMake config)."""
    import importlib.util

    spec = importlib.util.find_spec("executorch")
    return Path(spec.submodule_search_locations[0])


@contextlib.contextmanager
def build_lock() -> Iterator[None]:
    """Hold ``device_cpp/build.lock`` (an flock): test processes run in parallel (pytest -n)
    build into the same directory one at a time."""
    BUILD.parent.mkdir(parents=True, exist_ok=True)
    with open(SOURCE / "build.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build_client() -> Path:
    """Configure (once) and build the client; returns the binary. Raises with the build log."""
    with build_lock():
        return _build_client()


def _build_client() -> Path:
    if not (BUILD / "CMakeCache.txt").exists():
        _run(
            [
                "cmake",
                "-S",
                str(SOURCE),
                "-B",
                str(BUILD),
                "-DCMAKE_BUILD_TYPE=Release",
                f"-DEXECUTORCH_ROOT={executorch_root()}",
            ]
        )
    _run(["cmake", "--build", str(BUILD), "-j2"])
    return BINARY


def _run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def write_data(directory: Path, x: np.ndarray, y: np.ndarray) -> Path:
    """The client's data directory: x.npy float32 (N, C, H, W), y.npy int64 (N,)."""
    directory.mkdir(parents=True, exist_ok=True)
    np.save(directory / "x.npy", np.ascontiguousarray(x, dtype=np.float32))
    np.save(directory / "y.npy", np.ascontiguousarray(y, dtype=np.int64))
    return directory


def start_client(
    binary: Path,
    broker_url: str,
    fleet: str,
    device_id: str,
    data_dir: Path,
    work_dir: Path,
    log_path: Path,
    *extra: str,
    env: dict | None = None,
) -> subprocess.Popen:
    """Start ``fedsdk-device run`` as a process logging to ``log_path``; ``env``: its environment
    (None: this process's)."""
    cmd = [
        str(binary),
        "run",
        "--broker",
        broker_url,
        "--fleet",
        fleet,
        "--device-id",
        device_id,
        "--data",
        str(data_dir),
        "--work-dir",
        str(work_dir),
        *extra,
    ]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log_file:
        return subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env)


if __name__ == "__main__":  # python -m tests.integration.cpp_client: build and print the path
    print(build_client())
    sys.exit(0)
