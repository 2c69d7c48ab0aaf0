"""The second Python environment the ONNX Runtime training tests run in (.venv-ort).

onnxruntime-training cannot share the main venv (it replaces ``onnxruntime``), so tests
run its side in ``.venv-ort``'s python as a subprocess. A missing environment fails the
test with the command that creates it; ``make test`` runs that command first.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from export.onnx import REPO_ROOT, ort_python_path


def ort_python() -> str:
    """Path of the ORT environment's python; fails the calling test if it is missing."""
    python = ort_python_path()
    if not Path(python).exists():
        pytest.fail(f"the ONNX Runtime training environment is missing ({python}): run "
                    "`sh scripts/setup-ort-env.sh` (make test does) or set FEDSDK_ORT_PYTHON")
    return python


def run_ort(args: list[str], timeout_s: float = 120) -> subprocess.CompletedProcess:
    """Run ``python <args>`` in the ORT environment from the repo root; fails on error."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([ort_python(), *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout_s)
    if done.returncode != 0:
        pytest.fail(f"ORT environment command {args} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    return done
