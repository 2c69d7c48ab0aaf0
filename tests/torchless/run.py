"""Run Python code with torch made unimportable, then report what the process loaded.

Usage: ``python -m tests.torchless.run REPORT.json MODULE [ARGS...]`` runs ``MODULE`` as
``python -m MODULE ARGS`` would, with a meta-path finder that refuses ``torch`` (and its
companions) the way a machine without torch would (ModuleNotFoundError, also for
``importlib.util.find_spec``). At exit it writes REPORT.json: the torch-like modules in
``sys.modules``, the ``libtorch*`` / ``libc10*`` mappings and the ExecuTorch libraries in
``/proc/self/maps``, and the exit code of MODULE.
"""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

BLOCKED = ("torch", "torchvision", "torchaudio", "torchao", "functorch")


class _NoTorch:
    """A meta-path finder that makes the BLOCKED packages missing."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked: torch-free test)", name=name)
        return None


def loaded_report() -> dict:
    maps = Path("/proc/self/maps").read_text().splitlines()
    libraries = sorted({line.split()[-1] for line in maps if line.endswith(".so") or ".so." in line})
    return {
        "torch_modules": sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED),
        "libtorch": [lib for lib in libraries if Path(lib).name.startswith(("libtorch", "libc10"))],
        "executorch_libraries": [Path(lib).name for lib in libraries if "executorch" in Path(lib).name],
    }


def main() -> int:
    report_path, module, args = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
    sys.meta_path.insert(0, _NoTorch())
    sys.argv = [module, *args]
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    report_path.write_text(json.dumps({**loaded_report(), "exit_code": code}))
    return code


if __name__ == "__main__":
    sys.exit(main())
