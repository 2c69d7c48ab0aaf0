"""Loads ``libfedsdk_kernels`` (the "fused" kernel set) into this process, once.

The library's static initialiser registers its kernels with ExecuTorch's registry in
``libexecutorch.so`` (the one the native shim uses), so a program whose metadata says
``"kernels": "fused"`` can then load its ``fedsdk::`` operators. ExecuTorch aborts the
process when a kernel is registered twice, so the library is loaded at most once per
process, whatever path a later caller would give. No torch.

Before a library is used, its self-test (``fk_self_test``: convolution forward and both
gradients at four geometries, max-pool and ReLU, against a double-precision reference in the
library) must come within ``SELF_TEST_TOLERANCE``: a miscompiled or mis-targeted build is
refused like a missing one (``unsupported_kernels``, so the server falls back to the portable
program) instead of training wrong weights. It takes about a millisecond.
"""

from __future__ import annotations

import ctypes
import threading

from .native_build import NativeBuildError, find_or_build_kernels
from .pte_contract import UnsupportedKernels

KERNEL_SET = "fused"
SELF_TEST_TOLERANCE = 1e-4  # relative to the largest reference value; a sound build gives ~1e-7

_lib: ctypes.CDLL | None = None
_lock = threading.Lock()


def load() -> ctypes.CDLL:
    """The loaded kernels library (built on first use if needed); UnsupportedKernels
    (one line) when it cannot be built, loaded or registered."""
    global _lib
    with _lock:
        if _lib is None:
            try:
                lib = ctypes.CDLL(str(find_or_build_kernels()), mode=ctypes.RTLD_GLOBAL)
            except (NativeBuildError, OSError) as exc:
                raise UnsupportedKernels(f"the {KERNEL_SET!r} kernels are not available here: {exc}"
                                         ) from None
            lib.fk_kernel_set.restype = ctypes.c_char_p
            if lib.fk_kernel_set().decode() != KERNEL_SET or lib.fk_registered() != 1:
                raise UnsupportedKernels(f"libfedsdk_kernels did not register the {KERNEL_SET!r} kernels")
            check_self_test(lib)
            _lib = lib
        return _lib


def require(kernel_set: str) -> None:
    """Make ``kernel_set`` runnable in this process or raise UnsupportedKernels."""
    if kernel_set != KERNEL_SET:
        raise UnsupportedKernels(f"this runtime has no kernel set {kernel_set!r} (it knows {KERNEL_SET!r})")
    load()


def check_self_test(lib: ctypes.CDLL) -> float:
    """The library's self-test error (relative); UnsupportedKernels (one line) past the tolerance."""
    lib.fk_self_test.restype = ctypes.c_double
    error = float(lib.fk_self_test())
    if not error <= SELF_TEST_TOLERANCE:  # NaN fails too
        raise UnsupportedKernels(f"libfedsdk_kernels failed its self-test: relative error {error:.2e} "
                                 f"> {SELF_TEST_TOLERANCE:g} (rebuild it: fedsdk runtime build --kernels)")
    return error
