"""The fused training kernels (``kernels="fused"``): the C++ kernels of libfedsdk_kernels
against torch (convolution forward and both gradients, max-pool, ReLU), the ``fedsdk::`` ops'
registrations, gradient parity of a fused small CNN program on the torch-free runtime and the
Python bindings, 5 SGD-momentum / Adam steps on both equal to torch.optim's, and the refusal of
runtimes that lack the kernel set."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from export import fused_ops
from export.parity import gradient_parity, training_parity
from fedcore import modelspec
from fedcore.recipe import Recipe
from sdk_device.runtimes import fused_kernels
from sdk_device.runtimes.executorch_native_runtime import NativeExecutorchRuntime
from sdk_device.runtimes.executorch_runtime import ExecutorchRuntime
from sdk_device.runtimes.pte_contract import UnsupportedKernels
from server_toolkit.models.zoo import model_spec

from .pte_cache import cached_programs  # noqa: F401 - provides the program_for fixture
from .test_export_parity import BATCH, CE, GRAD_TOL, LOSS_TOL, MODELS, STEP_TOL, _data, _weights

ROOT = Path(__file__).resolve().parents[2]
SMALL_CNN = model_spec("small_cnn", (3, 8, 8), 5, width=8)
# (batch, height, width, in channels, out channels, k, stride, pad): odd sizes, channel counts
# off the kernels' blocks of 4 and 16, strides 1 and 2, 1x1 and 5x5 kernels.
GEOMETRIES = [(2, 7, 6, 3, 5, 3, 1, 1), (3, 8, 8, 4, 16, 3, 2, 1), (2, 9, 9, 17, 33, 5, 2, 2),
              (2, 6, 6, 8, 32, 1, 1, 0), (1, 5, 7, 6, 18, 3, 1, 0)]
P = ctypes.c_void_p


def _ptr(a: np.ndarray | None):
    return None if a is None else a.ctypes.data_as(P)


def _relative(got: np.ndarray, want: torch.Tensor) -> float:
    want = want.detach().numpy()
    return float(np.abs(got - want).max() / max(1.0, np.abs(want).max()))


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: "x".join(map(str, g)))
def test_conv_kernels_match_torch_forward_and_both_gradients(geometry):
    b, h, w, c, o, k, stride, pad = geometry
    lib = fused_kernels.load()
    gen = torch.Generator().manual_seed(sum(geometry))
    x = torch.randn(b, h, w, c, dtype=torch.float64, generator=gen, requires_grad=True)
    weight = torch.randn(o, c, k, k, dtype=torch.float64, generator=gen, requires_grad=True)
    bias = torch.randn(o, dtype=torch.float64, generator=gen, requires_grad=True)
    y = F.conv2d(x.permute(0, 3, 1, 2), weight, bias, stride=stride, padding=pad).permute(0, 2, 3, 1)
    grad_y = torch.randn(y.shape, dtype=torch.float64, generator=gen)
    y.backward(grad_y)
    xf, wf, bf, gyf = (np.ascontiguousarray(t.detach().float().numpy()) for t in (x, weight, bias, grad_y))
    out = np.full(y.shape, np.nan, np.float32)  # the kernels must write every element
    gx, gw, gb = (np.full(a.shape, np.nan, np.float32) for a in (xf, wf, bf))
    lib.fk_conv2d(_ptr(xf), _ptr(wf), _ptr(bf), _ptr(out), b, h, w, c, o, k, stride, pad)
    lib.fk_conv2d_backward(_ptr(gyf), _ptr(xf), _ptr(wf), _ptr(gx), _ptr(gw), _ptr(gb),
                           b, h, w, c, o, k, stride, pad)
    for got, want in ((out, y), (gx, x.grad), (gw, weight.grad), (gb, bias.grad)):
        assert _relative(got, want) <= 1e-5


def _conv_geometries(layers: list, shape: tuple, found: list) -> tuple:
    """Appends (h, w, in, out, k, stride, pad) of every groups-1 conv2d in ``layers`` (residual
    bodies and shortcuts too) and returns the shape after them."""
    for layer in layers:
        if layer["op"] == "residual":
            _conv_geometries(layer.get("shortcut", []), shape, found)
            shape = _conv_geometries(layer["body"], shape, found)
            continue
        if layer["op"] == "conv2d" and layer.get("groups", 1) == 1:
            found.append((shape[1], shape[2], layer["in"], layer["out"], layer["k"], layer.get("stride", 1),
                          layer.get("pad", 0)))
        shape = modelspec.infer_shapes([layer], shape, "layer")[0]
    return shape


RESNET_TIER = model_spec("resnet_small", (3, 32, 32), 10, widths=(16, 32, 64, 128), blocks_per_stage=2)
_found: list = []
_conv_geometries(RESNET_TIER["layers"], tuple(RESNET_TIER["input_shape"]), _found)
# The ResNet tier's distinct conv geometries (bench/runtimes.py's resnet18_tier: 32x32 down to
# 4x4 maps, 3x3 stride 1 and 2, 1x1 stride-2 shortcuts), then odd ones: output rows that are
# not a multiple of the 4-pixel blocks, channel counts off the blocks of 16.
TIER_GEOMETRIES = sorted(set(_found)) + [
    (7, 7, 5, 18, 3, 1, 1), (9, 9, 17, 33, 3, 1, 1), (9, 9, 6, 20, 3, 2, 1), (11, 11, 17, 33, 1, 2, 0),
    (10, 10, 3, 16, 5, 1, 2), (10, 6, 8, 16, 3, 1, 0)]


@pytest.mark.parametrize("geometry", TIER_GEOMETRIES, ids=lambda g: "x".join(map(str, g)))
def test_conv_kernels_match_float64_torch_on_every_resnet_tier_geometry_and_odd_row_ends(geometry):
    """Two samples (the kernels slice per row, so the batch adds nothing); forward and both
    gradients within 1e-5 of float64 torch, relative to the largest value."""
    h, w, c, o, k, stride, pad = geometry
    test_conv_kernels_match_torch_forward_and_both_gradients((2, h, w, c, o, k, stride, pad))


def test_the_resnet_tier_sweep_covers_its_real_layers():
    assert {(32, 32, 16, 32, 3, 2, 1), (32, 32, 16, 32, 1, 2, 0), (4, 4, 128, 128, 3, 1, 1)} <= set(_found)
    assert len(set(_found)) == 11


@pytest.mark.parametrize("shape", [(2, 8, 8, 5, 2), (3, 7, 9, 16, 2), (2, 9, 9, 3, 3)])
def test_max_pool_kernels_equal_torch_including_the_first_maximum_of_ties(shape):
    b, h, w, c, k = shape
    lib = fused_kernels.load()
    x = torch.randn(b, h, w, c, generator=torch.Generator().manual_seed(h * w)).round(decimals=1)  # ties
    x[:, :, 1::k] = x[:, :, ::k][:, :, :x[:, :, 1::k].shape[2]]  # whole tied windows along W
    xt = x.clone().requires_grad_()
    y = F.max_pool2d(xt.permute(0, 3, 1, 2), k, k).permute(0, 2, 3, 1)
    grad_y = torch.randn(y.shape)
    y.backward(grad_y)
    xn, gn = x.numpy().copy(), grad_y.numpy().copy()
    out, gx = np.full(y.shape, np.nan, np.float32), np.full(x.shape, np.nan, np.float32)
    lib.fk_max_pool(_ptr(xn), _ptr(out), b, h, w, c, k)
    lib.fk_max_pool_backward(_ptr(gn), _ptr(xn), _ptr(gx), b, h, w, c, k)
    assert np.array_equal(out, y.detach().numpy()) and np.array_equal(gx, xt.grad.numpy())


def test_rectify_kernels_equal_torch_relu_and_its_gradient():
    lib = fused_kernels.load()
    x = torch.randn(1000).round(decimals=1)  # exact zeros included: no gradient there, as torch
    xt = x.clone().requires_grad_()
    grad = torch.randn(1000)
    torch.relu(xt).backward(grad)
    y, gx = np.full(1000, np.nan, np.float32), np.full(1000, np.nan, np.float32)
    lib.fk_rectify(_ptr(x.numpy()), _ptr(y), ctypes.c_size_t(1000))
    lib.fk_rectify_backward(_ptr(grad.numpy()), _ptr(y), _ptr(gx), ctypes.c_size_t(1000))
    assert np.array_equal(y, torch.relu(x).numpy()) and np.array_equal(gx, xt.grad.numpy())


def test_fedsdk_conv_ops_fake_shapes_and_out_variants_agree_with_their_eager_results():
    from torch._subclasses.fake_tensor import FakeTensorMode

    ops = torch.ops.fedsdk
    x, weight, bias = torch.randn(2, 6, 5, 3), torch.randn(4, 3, 3, 3), torch.randn(4)
    y = ops.conv2d_nhwc(x, weight, bias, 2, 1)
    grads = ops.conv2d_nhwc_backward(torch.ones_like(y), x, weight, 2, 1, True)
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(t) for t in (x, weight, bias)]
        fake_y = ops.conv2d_nhwc(*fake, 2, 1)
        fake_grads = ops.conv2d_nhwc_backward(mode.from_tensor(y), fake[0], fake[1], 2, 1, True)
    assert fake_y.shape == y.shape == (2, 3, 3, 4)
    assert [g.shape for g in fake_grads] == [g.shape for g in grads] == [x.shape, weight.shape, bias.shape]
    out = torch.empty_like(y)
    ops.conv2d_nhwc.out(x, weight, bias, 2, 1, out=out)
    outs = [torch.empty_like(g) for g in grads]
    ops.conv2d_nhwc_backward.out(torch.ones_like(y), x, weight, 2, 1, True, grad_input=outs[0],
                                 grad_weight=outs[1], grad_bias=outs[2])
    assert torch.equal(out, y) and all(torch.equal(a, b) for a, b in zip(outs, grads, strict=True))


def test_fedsdk_conv_op_autograd_equals_torch_conv2d_autograd():
    x = torch.randn(2, 7, 7, 3, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(5, 3, 3, 3, dtype=torch.float64, requires_grad=True)
    y = fused_ops.conv2d(x, weight, None, 1, 1)
    y.square().sum().backward()
    grads = x.grad.clone(), weight.grad.clone()
    x.grad = weight.grad = None
    F.conv2d(x.permute(0, 3, 1, 2), weight, padding=1).square().sum().backward()
    assert torch.allclose(grads[0], x.grad) and torch.allclose(grads[1], weight.grad)


def test_fused_small_cnn_program_matches_autograd_on_the_native_runtime(program_for):
    program = program_for(SMALL_CNN, CE, BATCH, kernels="fused")
    x, y = _data(SMALL_CNN, BATCH, seed=1)
    result = gradient_parity(program, SMALL_CNN, _weights(SMALL_CNN, 2), x, y, CE,
                             runtime_class=NativeExecutorchRuntime)
    assert result.loss_error <= LOSS_TOL, result
    assert result.grad_error <= GRAD_TOL, result
    runtime = NativeExecutorchRuntime()
    runtime.load_program(program, "pte/1")
    assert runtime.meta["kernels"] == "fused"


def test_the_bindings_runtime_loads_the_kernels_and_computes_what_the_native_runtime_computes(program_for):
    """The bindings and the shim share the wheel's libexecutorch, so the kernels serve both."""
    program = program_for(SMALL_CNN, CE, BATCH, kernels="fused")
    x, y = _data(SMALL_CNN, BATCH, seed=1)
    results = []
    for runtime_class in (NativeExecutorchRuntime, ExecutorchRuntime):
        runtime = runtime_class()
        runtime.load_program(program, "pte/1")
        runtime.set_weights(_weights(SMALL_CNN, 2))
        results.append(runtime.gradients(x, y))
    (loss_a, grads_a, _), (loss_b, grads_b, _) = results
    assert loss_a == loss_b and all(np.array_equal(grads_a[k], grads_b[k]) for k in grads_b)


@pytest.mark.parametrize("runtime_class", [NativeExecutorchRuntime, ExecutorchRuntime],
                         ids=["native", "bindings"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_five_fused_steps_with_momentum_or_adam_equal_torch_optim(runtime_class, optimizer, program_for):
    """cnn_batchnorm runs every fused op (conv, BatchNorm, ReLU, max-pool); 5 steps, the last
    on half a batch (padded and masked), from weights with non-trivial running statistics."""
    spec = MODELS["cnn_batchnorm"]
    x, y = _data(spec, 4 * BATCH + BATCH // 2, seed=3)
    recipe = (Recipe(epochs=1, batch_size=BATCH, optimizer="sgd", lr=0.05, momentum=0.9, weight_decay=1e-3)
              if optimizer == "sgd" else
              Recipe(epochs=1, batch_size=BATCH, optimizer="adam", lr=0.01, weight_decay=1e-3))
    program = program_for(spec, CE, BATCH, kernels="fused")
    assert training_parity(program, spec, _weights(spec, 4), x, y, recipe, CE, runtime_class=runtime_class
                           ) <= STEP_TOL


def test_a_native_runtime_without_the_kernels_library_refuses_a_fused_program(program_for, tmp_path):
    """In a fresh process (the library loads once per process) whose kernels path is missing."""
    program_path = tmp_path / "fused.pte"
    program_path.write_bytes(program_for(SMALL_CNN, CE, BATCH, kernels="fused"))
    script = ("import sys, json\n"
              "from sdk_device.runtimes.executorch_native_runtime import NativeExecutorchRuntime\n"
              "from sdk_device.runtimes.pte_contract import UnsupportedKernels\n"
              "try:\n"
              f"    program = open({str(program_path)!r}, 'rb').read()\n"
              "    NativeExecutorchRuntime().load_program(program, 'pte/1')\n"
              "except UnsupportedKernels as exc:\n"
              "    print(json.dumps([exc.code, str(exc)]))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FEDSDK_KERNELS_LIB": str(tmp_path / "missing.so")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    code, message = json.loads(done.stdout.strip().splitlines()[-1])
    assert code == "unsupported_kernels" and "not available" in message


def test_an_unknown_kernel_set_is_refused():
    with pytest.raises(UnsupportedKernels, match="no kernel set 'turbo'"):
        fused_kernels.require("turbo")


THREADS_SCRIPT = """
import ctypes, hashlib, json
import numpy as np
from sdk_device.runtimes import fused_kernels
lib = fused_kernels.load()
P = ctypes.c_void_p
F = ctypes.POINTER(ctypes.c_float)
rng = np.random.default_rng(0)
p = lambda a: a.ctypes.data_as(P)
# (b, h, w, c, o, k, stride, pad): a channel tail, stride 2, a 1x1 stride-2 shortcut, and a 4x4 map
# wide enough for the reduction passes and the grad-weight pixel lists.
GEOMETRIES = [(3, 9, 9, 17, 33, 3, 1, 1), (4, 10, 10, 16, 32, 3, 2, 1), (4, 10, 10, 16, 48, 1, 2, 0),
              (32, 4, 4, 256, 48, 3, 1, 1)]
data = []
for b, h, w, c, o, k, stride, pad in GEOMETRIES:
    ho = (h + 2 * pad - k) // stride + 1
    shapes = ((b, h, w, c), (o, c, k, k), (o,), (b, ho, ho, o))
    data.append([rng.standard_normal(s).astype(np.float32) for s in shapes])
big = rng.standard_normal((8, 32, 32, 40)).astype(np.float32)  # over the 128K-float threading threshold
big_g = rng.standard_normal(big.shape).astype(np.float32)
pool_g = np.ascontiguousarray(big_g[:, :16, :16])
mask = np.array([1, 1, 1, 1, 1, 1, 1, 0], np.float32)
bn_w, bn_b = rng.random(40).astype(np.float32) + 0.5, rng.standard_normal(40).astype(np.float32)
lib.fk_batch_norm.argtypes = [P] * 6 + [ctypes.c_double] * 2 + [ctypes.c_int] * 3 + [P] * 5
lib.fk_rectify.argtypes = [P, P, ctypes.c_size_t]
lib.fk_rectify_backward.argtypes = [P, P, P, ctypes.c_size_t]
runs = []
for threads in (1, 2):
    assert lib.fk_set_threads(threads) == threads
    digest = hashlib.sha256()
    for (b, h, w, c, o, k, stride, pad), (x, weight, bias, gy) in zip(GEOMETRIES, data):
        out, gx, gw, gb = (np.zeros(s, np.float32) for s in (gy.shape, x.shape, weight.shape, (o,)))
        lib.fk_conv2d(p(x), p(weight), p(bias), p(out), b, h, w, c, o, k, stride, pad)
        lib.fk_conv2d_backward(p(gy), p(x), p(weight), p(gx), p(gw), p(gb), b, h, w, c, o, k, stride, pad)
        for a in (out, gx, gw, gb):
            digest.update(a.tobytes())
    y, gx = np.zeros_like(big), np.zeros_like(big)
    stats = [np.zeros(40, np.float32) for _ in range(6)]
    lib.fk_batch_norm(p(big), p(bn_w), p(bn_b), p(mask), None, None, 0.1, 1e-5, 8, 32 * 32, 40, p(y),
                      p(stats[0]), p(stats[1]), p(stats[2]), p(stats[3]))
    lib.fk_batch_norm_backward(p(big_g), p(big), p(bn_w), p(mask), p(stats[0]), p(stats[1]), 8, 32 * 32, 40,
                               p(gx), p(stats[4]), p(stats[5]))
    pooled = np.zeros((8, 16, 16, 40), np.float32)
    pool_gx, relu_y, relu_gx = (np.zeros_like(big) for _ in range(3))
    lib.fk_max_pool(p(big), p(pooled), 8, 32, 32, 40, 2)
    lib.fk_max_pool_backward(p(pool_g), p(big), p(pool_gx), 8, 32, 32, 40, 2)
    lib.fk_rectify(p(big), p(relu_y), big.size)
    lib.fk_rectify_backward(p(big_g), p(relu_y), p(relu_gx), big.size)
    for a in (y, gx, *stats, pooled, pool_gx, relu_y, relu_gx):
        digest.update(a.tobytes())
    runs.append(digest.hexdigest())
print(json.dumps({"same": runs[0] == runs[1], "threads": lib.fk_thread_count()}))
"""


def test_the_kernels_give_the_same_bits_on_one_and_two_threads():
    """Convolutions (stride 1 and 2, 1x1, a wide 4x4 map), BatchNorm, max-pool and ReLU over the
    threading threshold. In a fresh process: resizing ExecuTorch's shared pool would strand loaded
    XNNPACK programs."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", THREADS_SCRIPT], capture_output=True, text=True, env=env,
                          timeout=60)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"same": True, "threads": 2}, done.stderr[-2000:]


def test_the_loaded_library_passes_its_own_self_test_against_a_double_precision_reference():
    error = fused_kernels.check_self_test(fused_kernels.load())
    assert 0.0 <= error <= 1e-5  # float32 kernels against double: ~1e-7 on a sound build


class _FakeLibrary:
    """Stands in for a built library whose self-test reports ``error``."""

    def __init__(self, error: float) -> None:
        self.fk_self_test = lambda: error


@pytest.mark.parametrize("error", [1e-2, float("nan"), float("inf")])
def test_a_library_that_fails_its_self_test_is_refused_as_unsupported_kernels(error):
    with pytest.raises(UnsupportedKernels, match="failed its self-test"):
        fused_kernels.check_self_test(_FakeLibrary(error))
