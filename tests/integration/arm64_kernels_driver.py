"""Runs libfedsdk_kernels' C entry points on arrays from files: the arm64 half of the per-op
kernel tests (tests/integration/test_arm64_device.py). Needs only numpy and ctypes, so it runs
in the torch-free arm64 root under qemu; the torch references are computed on the host.

Usage: python arm64_kernels_driver.py LIB DIR. DIR holds ``cases.json`` (a list of
{"op": conv|batch_norm|relu|max_pool, "name": str, "dims": [int, ...]}) and ``inputs.npz``
(float32 arrays named ``<name>.<input>``); the outputs go to ``DIR/outputs.npz``
(``<name>.<output>``), each buffer pre-filled with NaN so an element the kernels skip shows.
"""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path

import numpy as np

P = ctypes.c_void_p


def ptr(a: np.ndarray | None):
    return None if a is None else a.ctypes.data_as(P)


def empty(shape) -> np.ndarray:
    return np.full(shape, np.nan, np.float32)


def conv(lib, get, dims):
    """dims: batch, height, width, in channels, out channels, kernel, stride, pad (NHWC)."""
    b, h, w, c, o, k, stride, pad = dims
    x, weight, bias, gy = get("x"), get("weight"), get("bias"), get("gy")
    y, gx, gw, gb = empty(gy.shape), empty(x.shape), empty(weight.shape), empty(bias.shape)
    lib.fk_conv2d(ptr(x), ptr(weight), ptr(bias), ptr(y), b, h, w, c, o, k, stride, pad)
    lib.fk_conv2d_backward(ptr(gy), ptr(x), ptr(weight), ptr(gx), ptr(gw), ptr(gb),
                           b, h, w, c, o, k, stride, pad)
    return {"y": y, "gx": gx, "gw": gw, "gb": gb}


def batch_norm(lib, get, dims):
    """dims: batch, height x width, channels; inputs x, weight, bias, mask, running mean/var, gy,
    and ``momentum_eps`` (2 values)."""
    b, hw, c = dims
    x, weight, bias, mask, gy = get("x"), get("weight"), get("bias"), get("mask"), get("gy")
    rm, rv = get("running_mean"), get("running_var")
    momentum, eps = (float(v) for v in get("momentum_eps"))
    y, gx = empty(x.shape), empty(x.shape)
    mean, invstd, new_mean, new_var, gw, gb = (empty(c) for _ in range(6))
    lib.fk_batch_norm(ptr(x), ptr(weight), ptr(bias), ptr(mask), ptr(rm), ptr(rv),
                      ctypes.c_double(momentum), ctypes.c_double(eps), b, hw, c,
                      ptr(y), ptr(mean), ptr(invstd), ptr(new_mean), ptr(new_var))
    lib.fk_batch_norm_backward(ptr(gy), ptr(x), ptr(weight), ptr(mask), ptr(mean), ptr(invstd), b, hw, c,
                               ptr(gx), ptr(gw), ptr(gb))
    return {"y": y, "new_mean": new_mean, "new_var": new_var, "gx": gx, "gw": gw, "gb": gb}


def relu(lib, get, dims):
    """dims: element count."""
    (n,) = dims
    x, g = get("x"), get("g")
    y, gx = empty(n), empty(n)
    lib.fk_rectify(ptr(x), ptr(y), ctypes.c_size_t(n))
    lib.fk_rectify_backward(ptr(g), ptr(y), ptr(gx), ctypes.c_size_t(n))
    return {"y": y, "gx": gx}


def max_pool(lib, get, dims):
    """dims: batch, height, width, channels, window (= stride)."""
    b, h, w, c, k = dims
    x, gy = get("x"), get("gy")
    y, gx = empty(gy.shape), empty(x.shape)
    lib.fk_max_pool(ptr(x), ptr(y), b, h, w, c, k)
    lib.fk_max_pool_backward(ptr(gy), ptr(x), ptr(gx), b, h, w, c, k)
    return {"y": y, "gx": gx}


OPS = {"conv": conv, "batch_norm": batch_norm, "relu": relu, "max_pool": max_pool}


def main(lib_path: str, directory: str) -> None:
    lib = ctypes.CDLL(lib_path, mode=ctypes.RTLD_GLOBAL)
    folder = Path(directory)
    cases = json.loads((folder / "cases.json").read_text())
    outputs = {}
    with np.load(folder / "inputs.npz") as inputs:  # allow_pickle stays False
        for case in cases:
            def get(key, name=case["name"]):
                return np.ascontiguousarray(inputs[f"{name}.{key}"], dtype=np.float32)
            for key, value in OPS[case["op"]](lib, get, case["dims"]).items():
                outputs[f"{case['name']}.{key}"] = value
    np.savez(folder / "outputs.npz", **outputs)
    print(f"{len(cases)} cases, {len(outputs)} outputs")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
