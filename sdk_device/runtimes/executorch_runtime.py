"""ExecuTorch runtime through ExecuTorch's Python bindings (imports torch).

The training loop, weight handling and data order are those of
``executorch_native_runtime.NativeExecutorchRuntime`` (read its docstring); only how a
program is loaded and run differs: here ``executorch.extension.pybindings.portable_lib``
runs it and its torch tensors are viewed as numpy arrays (no copies), there a small native
shim does, without torch. Kept for machines that have torch anyway (and as the exporter's
parity reference); a torch-free device uses ``executorch-native``.

A program of the fused kernel set loads ``libfedsdk_kernels`` as on ``executorch-native``
(``_require_kernels``): the bindings link the wheel's ``libexecutorch.so`` (not a copy), whose
kernel registry the library joins, so one load per process serves both runtimes.

The parts of a program exported with the XNNPACK backend (the default) run in XNNPACK,
which shares ExecuTorch's threadpool (``threads``). The registry imports this module only
when asked.
"""

from __future__ import annotations

import numpy as np
import torch

from .executorch_native_runtime import FORMAT, META_METHOD, SCHEMA, NativeExecutorchRuntime

__all__ = ["FORMAT", "META_METHOD", "SCHEMA", "ExecutorchRuntime"]


class _BindingsProgram:
    """A program loaded by the Python bindings, with ``NativeProgram``'s numpy interface."""

    def __init__(self, lib, program: bytes) -> None:
        self.module = lib._load_for_executorch_from_buffer(program)
        self.program = program  # the module reads (and its parameters live in) these bytes

    def method_names(self) -> set[str]:
        return set(self.module.method_names())

    def run(self, method: str, inputs: list[np.ndarray]) -> list:
        outputs = self.module.run_method(method, [torch.from_numpy(a) for a in inputs], clone_outputs=False)
        return [o.numpy() if isinstance(o, torch.Tensor) else o for o in outputs]


class ExecutorchRuntime(NativeExecutorchRuntime):
    """Runs pte/1 training programs with the ExecuTorch C++ runtime (Python bindings)."""

    name = "executorch"

    def __init__(self, threads: int | None = None) -> None:  # noqa: D107 - no native shim here
        from executorch.extension.pybindings import portable_lib

        self._lib = portable_lib
        if threads:
            portable_lib._unsafe_reset_threadpool(threads)
            torch.set_num_threads(threads)
        self._init_state()

    @property
    def module(self):
        """The bindings' program object (None before load_program)."""
        return None if self.program is None else self.program.module

    def _open(self, program: bytes) -> _BindingsProgram:
        return _BindingsProgram(self._lib, program)
