"""Which runtimes exist, which are installed here, and how the agent picks one.

One table of ``RuntimeEntry`` by name: the built-in runtimes (``BUILT_IN``) and those other
packages register in the ``fedsdk.runtimes`` entry-point group (docs/byo.md). Runtimes are
imported lazily: ``import sdk_device`` never imports torch.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable
from dataclasses import dataclass

from .base import Runtime
from .pte_contract import FORMAT as PTE_FORMAT

log = logging.getLogger(__name__)


def _torch() -> Runtime:
    from .torch_runtime import TorchRuntime

    return TorchRuntime(threads=1)


def _executorch() -> Runtime:
    from .executorch_runtime import ExecutorchRuntime

    return ExecutorchRuntime(threads=1)


def _executorch_native() -> Runtime:
    from .executorch_native_runtime import NativeExecutorchRuntime

    return NativeExecutorchRuntime(threads=1)


def _native_usable() -> bool:
    from .native_build import can_build_or_load

    return can_build_or_load()


def _onnxruntime() -> Runtime:
    from .onnxruntime_runtime import OrtTrainingRuntime

    return OrtTrainingRuntime(threads=1)


def _onnx() -> Runtime:
    from .onnxruntime_runtime import OnnxEvalRuntime

    return OnnxEvalRuntime(threads=1)


def _litert() -> Runtime:
    from .litert_runtime import LiteRTRuntime

    return LiteRTRuntime(threads=1)


Check = str | tuple[str, ...] | Callable[[], bool]


@dataclass(frozen=True)
class RuntimeEntry:
    """One runtime a device can use. ``formats``: the program formats it executes, best first;
    ``requires``: the Python module(s) that must be importable here, or a check returning
    whether it can run; ``create``: a factory (no arguments) - the only place that imports its
    engine, so listing runtimes imports none; ``trains``: False for an evaluation-only runtime."""

    formats: tuple[str, ...]
    requires: Check
    create: Callable[[], Runtime]
    trains: bool = True


# The built-in runtimes, in preference order. The executorch wheel installs without torch
# (--no-deps), so its Python-bindings runtime also needs torch; executorch-native needs the
# wheel's native files and the shim.
BUILT_IN: dict[str, RuntimeEntry] = {
    "torch": RuntimeEntry(("torchspec/1",), "torch", _torch),
    "executorch": RuntimeEntry((PTE_FORMAT,), ("torch", "executorch"), _executorch),
    "executorch-native": RuntimeEntry((PTE_FORMAT,), _native_usable, _executorch_native),
    "onnxruntime": RuntimeEntry(("ort-training/1",), "onnxruntime.training", _onnxruntime),  # training build
    "onnx": RuntimeEntry(("onnx/1",), "onnxruntime", _onnx, trains=False),
    "litert": RuntimeEntry(("tflite/1",), "ai_edge_litert", _litert, trains=False),
}
ENTRY_POINT_GROUP = "fedsdk.runtimes"
_RUNTIMES: dict[str, RuntimeEntry] = {}


def runtimes() -> dict[str, RuntimeEntry]:
    """Every known runtime by name, in preference order: the built-in ones, then those other
    packages register in the ``fedsdk.runtimes`` entry-point group (``name =
    "package.module:ENTRY"``, ENTRY a ``RuntimeEntry``), by name. Read once; an entry that fails
    to load, is no ``RuntimeEntry`` or reuses a built-in name is logged and left out."""
    if not _RUNTIMES:
        _RUNTIMES.update(BUILT_IN)
        _RUNTIMES.update(_entry_point_runtimes())
    return _RUNTIMES


def _entry_point_runtimes() -> dict[str, RuntimeEntry]:
    from importlib.metadata import entry_points

    found = {}
    for entry in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        try:
            loaded = entry.load()
        except Exception as exc:  # noqa: BLE001 - another package's bug must not stop the others
            log.warning("runtime entry point %s (%s) is unavailable: %s", entry.name, entry.value, exc)
            continue
        if not isinstance(loaded, RuntimeEntry) or entry.name in BUILT_IN:
            log.warning("runtime entry point %s (%s) is left out: it must be a RuntimeEntry under a "
                        "name of its own", entry.name, entry.value)
            continue
        found[entry.name] = loaded
    return found


def formats_of(name: str) -> tuple[str, ...]:
    """The program formats runtime ``name`` executes, best first (ValueError: unknown runtime)."""
    return _entry(name).formats


def available_runtimes() -> list[str]:
    """Names of the runtimes whose engine is installed on this machine, in preference order."""
    return [name for name, entry in runtimes().items() if _installed(entry.requires)]


def evaluation_only() -> tuple[str, ...]:
    """The runtimes that evaluate but cannot train."""
    return tuple(name for name, entry in runtimes().items() if not entry.trains)


def _installed(module: Check) -> bool:
    if callable(module):
        return module()
    if isinstance(module, tuple):
        return all(_installed(m) for m in module)
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # the parent package of a dotted name is missing
        return False


def pick_runtime(offered_formats: list[str], allowed: list[str] | None = None) -> tuple[str, str]:
    """Choose (runtime, format) for a task offering programs in ``offered_formats``.

    Takes the first runtime in preference order that is installed (and in ``allowed``
    when given) and can run one of the offered formats. ValueError says why none fits.
    """
    names = [n for n in available_runtimes() if allowed is None or n in allowed]
    for name in names:
        for fmt in formats_of(name):
            if fmt in offered_formats:
                return name, fmt
    raise ValueError(
        f"no runtime here runs any of {offered_formats}: installed runtimes {names or 'none'}"
    )


def create_runtime(name: str) -> Runtime:
    """A fresh runtime called ``name`` (ValueError listing the known ones otherwise)."""
    return _entry(name).create()


def _entry(name: str) -> RuntimeEntry:
    known = runtimes()
    if name not in known:
        raise ValueError(f"unknown runtime {name!r}; known: {', '.join(known)}")
    return known[name]
