"""Import a ``bench/`` script as a module in a test (bench/ is not a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH_DIR = Path(__file__).resolve().parents[1] / "bench"


def load_bench(script: str) -> ModuleType:
    """``bench/<script>.py`` as module ``bench_<script>``, registered in ``sys.modules`` before it
    runs (a dataclass looks its module up while its class is built); a fresh copy each call."""
    name = f"bench_{script}"
    spec = importlib.util.spec_from_file_location(name, BENCH_DIR / f"{script}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
