"""A pytest fixture that exports ExecuTorch programs once and keeps them across test runs.

Exporting takes seconds per program, so programs are cached in pytest's cache directory,
keyed by the spec, loss, batch and the exporter's source code and versions (a change to
the exporter re-exports). ``pytest --cache-clear`` forces fresh exports. To use it,
import ``cached_programs`` into a test module and ask for the ``program_for`` fixture.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
from pathlib import Path

import pytest

import export
import fedcore.losses
from export.executorch import export_training_program
from fedcore import modelspec

EXPORTER_SOURCES = tuple(Path(export.__file__).parent / f"{name}.py"
                         for name in ("executorch", "program_model", "decompositions", "fused_ops"))
LOSS_SOURCE = Path(fedcore.losses.__file__)  # the loss maths every program embeds


def exporter_version() -> str:
    digest = hashlib.sha256(b"".join(path.read_bytes() for path in (*EXPORTER_SOURCES, LOSS_SOURCE)))
    for package in ("torch", "executorch"):
        digest.update(importlib.metadata.version(package).encode())
    return digest.hexdigest()


@pytest.fixture(scope="session", name="program_for")
def cached_programs(request):
    """program_for(spec, loss, batch, kernels="portable") -> .pte bytes (exported once, then
    read from disk)."""
    cache_dir = Path(request.config.cache.mkdir("fedsdk-pte"))
    version = exporter_version()

    def get(spec: dict, loss: dict, batch: int, kernels: str = "portable") -> bytes:
        tag = f"{batch}:{version}" + ("" if kernels == "portable" else f":{kernels}")
        key = hashlib.sha256(modelspec.dumps(spec) + json.dumps(loss, sort_keys=True).encode()
                             + tag.encode()).hexdigest()
        path = cache_dir / f"{key}.pte"
        if not path.exists():  # written under another name, then renamed: parallel test
            partial = path.with_suffix(f".{os.getpid()}.part")  # processes never read half a file
            partial.write_bytes(export_training_program(spec, loss, batch, kernels=kernels))
            partial.replace(path)
        return path.read_bytes()

    return get
