"""Which runtimes exist, which are installed here, and how the agent picks one.

Runtimes are imported lazily: ``import sdk_device`` never imports torch.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

from .base import Runtime


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


# name -> (python module(s) that must be importable, or a check, factory); preference order =
# dict order. The executorch wheel installs without torch (--no-deps), so its Python-bindings
# runtime also needs torch; executorch-native needs the wheel's native files and the shim.
Check = str | tuple[str, ...] | Callable[[], bool]
RUNTIMES: dict[str, tuple[Check, Callable[[], Runtime]]] = {
    "torch": ("torch", _torch),
    "executorch": (("torch", "executorch"), _executorch),
    "executorch-native": (_native_usable, _executorch_native),
    "onnxruntime": ("onnxruntime.training", _onnxruntime),  # the onnxruntime-training build
    "onnx": ("onnxruntime", _onnx),  # evaluation only
    "litert": ("ai_edge_litert", _litert),  # evaluation only
}
FORMATS: dict[str, tuple[str, ...]] = {"torch": ("torchspec/1",), "executorch": ("pte/1",),
                                       "executorch-native": ("pte/1",),
                                       "onnxruntime": ("ort-training/1",), "onnx": ("onnx/1",),
                                       "litert": ("tflite/1",)}


def available_runtimes() -> list[str]:
    """Names of the runtimes whose engine is installed on this machine."""
    return [name for name, (module, _) in RUNTIMES.items() if _installed(module)]


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
        for fmt in FORMATS[name]:
            if fmt in offered_formats:
                return name, fmt
    raise ValueError(
        f"no runtime here runs any of {offered_formats}: installed runtimes {names or 'none'}"
    )


def create_runtime(name: str) -> Runtime:
    if name not in RUNTIMES:
        raise ValueError(f"unknown runtime {name!r}; known: {', '.join(RUNTIMES)}")
    return RUNTIMES[name][1]()
