"""Train-mode BatchNorm of the fused kernel set: libfedsdk_kernels' forward and backward against
torch autograd of the ATen lowering (``export.decompositions.batch_norm_train``, float64), with
padded samples masked out, the ``fedsdk::batch_norm_nhwc`` op's registrations, and two fused
programs with BatchNorm (tracked and static; the multi-exit VGG; a small ResNet) against torch
on the torch-free runtime."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from export import decompositions, fused_batch_norm
from export.parity import eval_parity, gradient_parity, training_parity
from fedcore.recipe import Recipe
from sdk_device.runtimes import fused_kernels
from sdk_device.runtimes.executorch_native_runtime import NativeExecutorchRuntime

from .pte_cache import cached_programs  # noqa: F401 - provides the program_for fixture
from .test_export_parity import BATCH, CE, EVAL_TOL, GRAD_TOL, LOSS_TOL, MODELS, STEP_TOL, _data, _weights

P = ctypes.c_void_p
MOMENTUM, EPS = decompositions.BN_MOMENTUM, decompositions.BN_EPS
# (batch, height, width, channels, padded samples, tracked): channel counts off the 8-float
# vectors, spatial sizes off the kernels' 16-row chunks, 1x1 maps (a ResNet's last stage).
SHAPES = [(4, 5, 3, 5, 1, True), (3, 6, 6, 19, 0, True), (5, 1, 1, 16, 2, False), (2, 9, 7, 8, 0, False)]


def _ptr(a: np.ndarray | None):
    return None if a is None else a.ctypes.data_as(P)


def _f32(t: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(t.detach().float().numpy())


def _reference(x, weight, bias, mask, running):
    """Autograd of the ATen lowering in float64: (y, new running stats, grad_y, grads)."""
    x, weight, bias = (t.detach().double().requires_grad_() for t in (x, weight, bias))
    running = None if running is None else tuple(r.double() for r in running)
    y, updated = decompositions.batch_norm_train(x, weight, bias, mask.double(), running)
    grad_y = torch.randn(y.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    grad_y = grad_y * mask.double().reshape(-1, 1, 1, 1)  # padding gets no gradient (the loss masks it)
    y.backward(grad_y)
    return y, updated, grad_y, (x.grad, weight.grad, bias.grad)


def _close(got: np.ndarray, want: torch.Tensor, tol: float = 1e-5) -> bool:
    want = want.detach().numpy()
    return float(np.abs(got - want).max() / max(1.0, np.abs(want).max())) <= tol


def _run_kernels(x, weight, bias, mask, running, grad_y):
    b, h, w, c = x.shape
    lib = fused_kernels.load()
    xf, wf, bf, mf, gf = (_f32(t) for t in (x, weight, bias, mask, grad_y))
    rm, rv = (None, None) if running is None else (_f32(running[0]), _f32(running[1]))
    y = np.full(xf.shape, np.nan, np.float32)  # the kernels must write every element
    mean, invstd, new_mean, new_var = (np.full(c, np.nan, np.float32) for _ in range(4))
    lib.fk_batch_norm(_ptr(xf), _ptr(wf), _ptr(bf), _ptr(mf), _ptr(rm), _ptr(rv), ctypes.c_double(MOMENTUM),
                      ctypes.c_double(EPS), b, h * w, c, _ptr(y), _ptr(mean), _ptr(invstd), _ptr(new_mean),
                      _ptr(new_var))
    gx, gw, gb = (np.full(shape, np.nan, np.float32) for shape in (xf.shape, c, c))
    lib.fk_batch_norm_backward(_ptr(gf), _ptr(xf), _ptr(wf), _ptr(mf), _ptr(mean), _ptr(invstd), b, h * w, c,
                               _ptr(gx), _ptr(gw), _ptr(gb))
    return y, (new_mean, new_var), (gx, gw, gb)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_batch_norm_kernels_match_autograd_of_the_masked_lowering(shape):
    b, h, w, c, padded, tracked = shape
    gen = torch.Generator().manual_seed(b * c)
    x = torch.randn(b, h, w, c, generator=gen) * 2 + 0.5
    weight, bias = torch.rand(c, generator=gen) + 0.5, torch.randn(c, generator=gen)
    mask = torch.ones(b)
    mask[b - padded:] = 0.0
    x[b - padded:] = 50.0  # padding far from the data: counted, it would move every statistic
    running = (torch.randn(c, generator=gen), torch.rand(c, generator=gen) + 0.5) if tracked else None
    y_ref, updated, grad_y, grads = _reference(x, weight, bias, mask, running)
    y, new_running, kernel_grads = _run_kernels(x, weight, bias, mask, running, grad_y)
    assert _close(y, y_ref)
    assert all(_close(got, want) for got, want in zip(kernel_grads, grads, strict=True))
    if tracked:
        assert all(_close(got, want) for got, want in zip(new_running, updated, strict=True))


@pytest.mark.parametrize("mean_and_spread", [(300.0, 0.01), (30.0, 0.1)])
def test_batch_norm_kernels_are_closer_to_float64_than_torch_float32_when_the_mean_dwarfs_the_spread(
        mean_and_spread):
    """Where a one-pass float variance would lose every digit; torch's float32 BatchNorm is the bar."""
    mean, spread = mean_and_spread
    x = (mean + spread * torch.randn(8, 4, 4, 6, generator=torch.Generator().manual_seed(7))).float()
    weight, bias, mask = torch.ones(6), torch.zeros(6), torch.ones(8)
    y_ref, _, grad_y, grads = _reference(x, weight, bias, mask, None)
    y, _, kernel_grads = _run_kernels(x, weight, bias, mask, None, grad_y)
    x_nchw, weight_t = x.permute(0, 3, 1, 2).clone().requires_grad_(), weight.clone().requires_grad_()
    y_torch = F.batch_norm(x_nchw, None, None, weight_t, bias, training=True, eps=EPS)
    y_torch.backward(grad_y.float().permute(0, 3, 1, 2))
    torch_results = (y_torch.permute(0, 2, 3, 1), x_nchw.grad.permute(0, 2, 3, 1), weight_t.grad)

    def error(got, want):
        return float(np.abs(np.asarray(got.detach() if isinstance(got, torch.Tensor) else got)
                            - want.detach().numpy()).max())

    for ours, theirs, want in zip((y, *kernel_grads[:2]), torch_results, (y_ref, *grads[:2]), strict=True):
        assert error(ours, want) < error(theirs, want)


def test_batch_norm_op_autograd_equals_autograd_of_the_lowering_and_out_variants_agree():
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(3, 4, 5, 6, dtype=torch.float64, generator=gen, requires_grad=True)
    weight = (torch.rand(6, dtype=torch.float64, generator=gen) + 0.5).requires_grad_()
    bias = torch.randn(6, dtype=torch.float64, generator=gen, requires_grad=True)
    mask = torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64)
    running = (torch.zeros(6, dtype=torch.float64), torch.ones(6, dtype=torch.float64))
    y, updated = fused_batch_norm.batch_norm_train(x, weight, bias, mask, running, MOMENTUM, EPS)
    (y * y.detach().cos()).sum().backward()
    fused = [t.grad.clone() for t in (x, weight, bias)]
    for t in (x, weight, bias):
        t.grad = None
    y_ref, updated_ref = decompositions.batch_norm_train(x, weight, bias, mask, running)
    (y_ref * y_ref.detach().cos()).sum().backward()
    assert torch.allclose(y, y_ref)
    assert all(torch.allclose(a, b) for a, b in zip(updated, updated_ref, strict=True))
    assert all(torch.allclose(a, t.grad) for a, t in zip(fused, (x, weight, bias), strict=True))
    results = torch.ops.fedsdk.batch_norm_nhwc(x.detach(), weight.detach(), bias.detach(), mask, *running,
                                               MOMENTUM, EPS)
    outs = [torch.empty_like(t) for t in results]
    names = ("y", "mean", "invstd", "new_running_mean", "new_running_var")
    torch.ops.fedsdk.batch_norm_nhwc.out(x.detach(), weight.detach(), bias.detach(), mask, *running, MOMENTUM,
                                         EPS, **dict(zip(names, outs, strict=True)))
    assert all(torch.equal(a, b) for a, b in zip(outs, results, strict=True))


def test_batch_norm_op_fake_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x, weight, mask = torch.empty(2, 3, 3, 7), torch.empty(7), torch.empty(2)
        outs = torch.ops.fedsdk.batch_norm_nhwc(x, weight, weight, mask, None, None, MOMENTUM, EPS)
        grads = torch.ops.fedsdk.batch_norm_nhwc_backward(x, x, weight, mask, weight, weight)
    assert [tuple(t.shape) for t in outs] == [(2, 3, 3, 7)] + [(7,)] * 4
    assert [tuple(t.shape) for t in grads] == [(2, 3, 3, 7), (7,), (7,)]


# "residual": the ResNet layout (stride-2 convolutions, 1x1 stride-2 shortcuts, padded 3x3 on 8x8 / 4x4 maps)
@pytest.mark.parametrize("name", ["cnn_batchnorm", "vgg_multi_exit", "residual"])
def test_fused_programs_with_batch_norm_match_torch_gradients_running_stats_steps_and_eval(name, program_for):
    spec = MODELS[name]
    program = program_for(spec, CE, BATCH, kernels="fused")
    backward = b"fedsdk::batch_norm_nhwc_backward"  # operator names (the overload "out" is stored apart)
    assert backward in program and b"fedsdk::batch_norm_nhwc" in program.replace(backward, b"")
    x, y = _data(spec, BATCH, seed=1)
    native = NativeExecutorchRuntime
    result = gradient_parity(program, spec, _weights(spec, 2), x, y, CE, runtime_class=native)
    assert result.loss_error <= LOSS_TOL and result.grad_error <= GRAD_TOL, result
    assert result.running_error <= 1e-5, result
    x, y = _data(spec, 2 * BATCH + BATCH // 2, seed=3)  # the last batch is short: padded and masked
    recipe = Recipe(epochs=1, batch_size=BATCH, optimizer="sgd", lr=0.05, momentum=0.9, weight_decay=1e-3)
    steps = training_parity(program, spec, _weights(spec, 4), x, y, recipe, CE, runtime_class=native)
    assert steps <= STEP_TOL
    x, _ = _data(spec, BATCH - 3, seed=5)
    assert eval_parity(program, spec, _weights(spec, 6), x, runtime_class=native) <= EVAL_TOL
