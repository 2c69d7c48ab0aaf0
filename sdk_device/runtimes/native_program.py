"""ctypes binding of the native ExecuTorch shim: load a ``.pte``, run a method on numpy arrays.

No torch, no pybind: the shim (``native/fedsdk_executorch.cpp``, built by ``native_build``)
exports a small C ABI. Inputs are contiguous float32 / int64 numpy arrays, read during the
call. Outputs are numpy arrays that *view* the method's memory: valid until the next
``run`` on the same program; copy what must outlive it. The shim library is loaded once per
process.
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

from .native_build import find_or_build

# ExecuTorch ScalarType codes <-> numpy dtypes (the ones our programs use).
DTYPES = {6: np.float32, 4: np.int64, 3: np.int32, 7: np.float64, 11: np.bool_, 0: np.uint8}
CODES = {np.dtype(v): k for k, v in DTYPES.items()}
MAX_RANK = 16
INFO_COLUMNS = 5 + MAX_RANK  # fx_outputs: kind, dtype, ndim, address, nbytes, shape

_lib: ctypes.CDLL | None = None
_lock = threading.Lock()


def load_library() -> ctypes.CDLL:
    """The shim, built on first use if needed (NativeBuildError says why it cannot be)."""
    global _lib
    with _lock:
        if _lib is None:
            lib = ctypes.CDLL(str(find_or_build()))
            p, i, u32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32
            lib.fx_error.argtypes, lib.fx_error.restype = [p], ctypes.c_char_p
            lib.fx_set_threads.argtypes, lib.fx_set_threads.restype = [u32], i
            lib.fx_open.argtypes, lib.fx_open.restype = [p, ctypes.c_size_t, ctypes.POINTER(p)], i
            lib.fx_close.argtypes, lib.fx_close.restype = [p], None
            lib.fx_method_names.argtypes, lib.fx_method_names.restype = [p], ctypes.c_char_p
            lib.fx_run.argtypes = [p, ctypes.c_char_p, i, p, p, p, p]
            lib.fx_run.restype = i
            lib.fx_num_outputs.argtypes, lib.fx_num_outputs.restype = [p], i
            lib.fx_output.argtypes = [p, i, *(ctypes.POINTER(t) for t in (
                ctypes.c_int32, ctypes.c_int32, ctypes.c_int32)), p, ctypes.POINTER(p),
                ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_double)]
            lib.fx_output.restype = i
            lib.fx_outputs.argtypes, lib.fx_outputs.restype = [p, i, p], i
            _lib = lib
        return _lib


def set_threads(threads: int) -> int:
    """Resize ExecuTorch's shared threadpool; returns the thread count."""
    return load_library().fx_set_threads(threads)


class NativeProgram:
    """One loaded ExecuTorch program (its own copy of the bytes and planned memory)."""

    def __init__(self, program: bytes) -> None:
        self._lib = load_library()
        handle = ctypes.c_void_p()
        if self._lib.fx_open(program, len(program), ctypes.byref(handle)) != 0:
            raise ValueError(self._lib.fx_error(None).decode())
        self._handle = handle
        self._kind, self._dtype, self._ndim = ctypes.c_int32(), ctypes.c_int32(), ctypes.c_int32()
        self._shape = (ctypes.c_int64 * MAX_RANK)()
        self._data, self._nbytes, self._scalar = ctypes.c_void_p(), ctypes.c_size_t(), ctypes.c_double()
        # Output views are rebuilt only when an output's (kind, dtype, address, shape) changes:
        # planned memory stays put from run to run, so the same views are handed out again.
        self._info = np.zeros((0, INFO_COLUMNS), np.int64)
        self._views: dict[str, tuple[np.ndarray, list]] = {}  # method -> (info, outputs)

    def __del__(self) -> None:
        handle = getattr(self, "_handle", None)
        if handle is not None and handle.value:
            self._lib.fx_close(handle)
            self._handle = None

    def method_names(self) -> set[str]:
        return set(self._lib.fx_method_names(self._handle).decode().split())

    def run(self, method: str, inputs: list[np.ndarray]) -> list:
        """Run ``method``; returns its outputs (numpy views of program memory, str, or numbers).
        Inputs must be C-contiguous arrays of a dtype in ``CODES``; RuntimeError on failure."""
        n = len(inputs)
        dtypes = np.array([CODES[a.dtype] for a in inputs], np.int32)
        ndims = np.array([a.ndim for a in inputs], np.int32)
        shapes = np.array([d for a in inputs for d in a.shape] or [0], np.int64)
        datas = (ctypes.c_void_p * max(n, 1))(*(a.ctypes.data for a in inputs))
        for a in inputs:
            if not a.flags.c_contiguous:
                raise ValueError("inputs must be C-contiguous")
        code = self._lib.fx_run(self._handle, method.encode(), n, dtypes.ctypes.data, ndims.ctypes.data,
                                shapes.ctypes.data, datas)
        if code != 0:
            raise RuntimeError(self._lib.fx_error(self._handle).decode())
        return self._outputs(method)

    def _outputs(self, method: str) -> list:
        count = self._lib.fx_num_outputs(self._handle)
        if len(self._info) < count:
            self._info = np.zeros((count, INFO_COLUMNS), np.int64)
        if self._lib.fx_outputs(self._handle, len(self._info), self._info.ctypes.data) != count:
            raise RuntimeError(self._lib.fx_error(self._handle).decode())
        info = self._info[:count]
        cached = self._views.get(method)
        if cached is not None and np.array_equal(cached[0], info):
            return list(cached[1])
        outputs = [self._view(row) if row[0] == 0 else self._output(i) for i, row in enumerate(info)]
        if (info[:, 0] == 0).all():  # only tensors: reusable views
            self._views[method] = (info.copy(), outputs)
        return list(outputs)

    @staticmethod
    def _view(row: np.ndarray) -> np.ndarray:
        """A numpy view of one tensor output (row of fx_outputs)."""
        dtype = np.dtype(DTYPES[int(row[1])])
        shape = tuple(int(d) for d in row[5:5 + int(row[2])])
        if row[4] == 0:
            return np.zeros(shape, dtype)
        buffer = (ctypes.c_char * int(row[4])).from_address(int(row[3]))
        return np.frombuffer(buffer, dtype).reshape(shape)

    def _output(self, i: int):
        ref = ctypes.byref
        code = self._lib.fx_output(self._handle, i, ref(self._kind), ref(self._dtype), ref(self._ndim),
                                   self._shape, ref(self._data), ref(self._nbytes), ref(self._scalar))
        if code != 0:
            raise RuntimeError(self._lib.fx_error(self._handle).decode())
        kind = self._kind.value
        if kind == 0:
            dtype = np.dtype(DTYPES[self._dtype.value])
            shape = tuple(self._shape[:self._ndim.value])
            if self._nbytes.value == 0:
                return np.zeros(shape, dtype)
            buffer = (ctypes.c_char * self._nbytes.value).from_address(self._data.value)
            return np.frombuffer(buffer, dtype).reshape(shape)
        if kind == 1:
            return ctypes.string_at(self._data.value, self._nbytes.value).decode()
        if kind == 2:
            return int(self._scalar.value)
        if kind in (3, 4):
            return float(self._scalar.value) if kind == 3 else bool(self._scalar.value)
        raise RuntimeError(f"output {i} has a type this runtime does not read")
