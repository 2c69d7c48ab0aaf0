"""Train-mode BatchNorm as one ``fedsdk::`` op of the fused kernel set (``--kernels fused``).

``fedsdk::batch_norm_nhwc(x (B,H,W,C), weight (C,), bias (C,), sample_mask (B,),
running_mean (C,)?, running_var (C,)?, momentum, eps)
-> (y (B,H,W,C), mean (C,), invstd (C,), new_running_mean (C,), new_running_var (C,))``
    Statistics over the real samples only: each row of sample b counts with weight
    ``sample_mask[b]`` (0 for padding), as ``export.decompositions.batch_stats``.
    ``y = (x - mean) * invstd * weight + bias`` for every row, padding included;
    ``invstd = 1 / sqrt(biased var + eps)``. The new running statistics follow torch:
    ``(1 - momentum) * running + momentum * batch`` with the unbiased variance
    (var * n / (n - 1), n = rows counted). Without running statistics (static BN) the last
    two outputs are the batch mean and unbiased variance (the program ignores them).
``fedsdk::batch_norm_nhwc_backward(grad_out, x, weight, sample_mask, mean, invstd)
-> (grad_input, grad_weight, grad_bias)``
    With ``S1 = sum(grad_out)``, ``S2 = sum(grad_out * xhat)`` over all rows: grad_bias = S1,
    grad_weight = S2, ``grad_input = weight * invstd * (grad_out - m * (S1 + xhat * S2) / n)``
    where ``m`` is the row's mask weight (the exact gradient of the masked statistics).

Sums are in double precision, in the C++ kernels (``native/fused_norm.h``) and in the eager
reference here. Decisions: momentum and eps are arguments (torch's defaults are passed by
``export.program_model``); the running update is inside the op (one kernel instead of six
small element-wise ops per layer); the eval program keeps today's running-stat lowering.
"""

from __future__ import annotations

import torch

from .fused_ops import NAMESPACE

_lib = torch.library.Library(NAMESPACE, "FRAGMENT")  # noqa: TOR901 - adds to fused_ops' namespace
_FORWARD_ARGS = ("Tensor x, Tensor weight, Tensor bias, Tensor sample_mask, Tensor? running_mean, "
                 "Tensor? running_var, float momentum, float eps")
_BACKWARD_ARGS = "Tensor grad_out, Tensor x, Tensor weight, Tensor sample_mask, Tensor mean, Tensor invstd"
_lib.define(f"batch_norm_nhwc({_FORWARD_ARGS}) -> (Tensor, Tensor, Tensor, Tensor, Tensor)")
_lib.define(f"batch_norm_nhwc.out({_FORWARD_ARGS}, *, Tensor(a!) y, Tensor(b!) mean, Tensor(c!) invstd, "
            "Tensor(d!) new_running_mean, Tensor(e!) new_running_var) "
            "-> (Tensor(a!), Tensor(b!), Tensor(c!), Tensor(d!), Tensor(e!))")
_lib.define(f"batch_norm_nhwc_backward({_BACKWARD_ARGS}) -> (Tensor, Tensor, Tensor)")
_lib.define(f"batch_norm_nhwc_backward.out({_BACKWARD_ARGS}, *, Tensor(a!) grad_input, "
            "Tensor(b!) grad_weight, Tensor(c!) grad_bias) -> (Tensor(a!), Tensor(b!), Tensor(c!))")


def _rows(x: torch.Tensor, sample_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rows (B*H*W, C) in double, row weights (B*H*W, 1) in double, n = total weight)."""
    b, h, w, c = x.shape
    rows = x.reshape(b * h * w, c).double()
    m = sample_mask.double().repeat_interleave(h * w).reshape(-1, 1)
    return rows, m, m.sum()


def _forward_reference(x, weight, bias, sample_mask, running_mean, running_var, momentum, eps):
    rows, m, n = _rows(x, sample_mask)
    mean = (rows * m).sum(0) / n
    var = ((rows - mean) ** 2 * m).sum(0) / n
    invstd = (var + eps).rsqrt()
    y = ((rows - mean) * (invstd * weight.double()) + bias.double()).to(x.dtype).reshape(x.shape)
    unbiased = var * (n / (n - 1))
    if running_mean is None:
        new_mean, new_var = mean, unbiased
    else:
        new_mean = running_mean.double() * (1 - momentum) + mean * momentum
        new_var = running_var.double() * (1 - momentum) + unbiased * momentum
    return y, *(t.to(x.dtype) for t in (mean, invstd, new_mean, new_var))


def _backward_reference(grad_out, x, weight, sample_mask, mean, invstd):
    rows, m, n = _rows(x, sample_mask)
    g = grad_out.reshape(rows.shape).double()
    xhat = (rows - mean.double()) * invstd.double()
    s1, s2 = g.sum(0), (g * xhat).sum(0)
    gx = weight.double() * invstd.double() * (g - m * (s1 + xhat * s2) / n)
    return gx.to(x.dtype).reshape(x.shape), s2.to(x.dtype), s1.to(x.dtype)


@torch.library.impl(_lib, "batch_norm_nhwc", "CompositeExplicitAutograd")
def _forward(x, weight, bias, sample_mask, running_mean, running_var, momentum, eps):
    return _forward_reference(x, weight, bias, sample_mask, running_mean, running_var, momentum, eps)


@torch.library.impl(_lib, "batch_norm_nhwc.out", "CompositeExplicitAutograd")
def _forward_out(x, weight, bias, sample_mask, running_mean, running_var, momentum, eps, *, y, mean, invstd,
                 new_running_mean, new_running_var):
    results = _forward_reference(x, weight, bias, sample_mask, running_mean, running_var, momentum, eps)
    outs = (y, mean, invstd, new_running_mean, new_running_var)
    for out, value in zip(outs, results, strict=True):
        out.copy_(value)
    return outs


@torch.library.register_fake(f"{NAMESPACE}::batch_norm_nhwc")
def _forward_fake(x, weight, bias, sample_mask, running_mean, running_var, momentum, eps):
    c = x.shape[3]
    return torch.empty_like(x), *(x.new_empty(c) for _ in range(4))


@torch.library.impl(_lib, "batch_norm_nhwc_backward", "CompositeExplicitAutograd")
def _backward(grad_out, x, weight, sample_mask, mean, invstd):
    return _backward_reference(grad_out, x, weight, sample_mask, mean, invstd)


@torch.library.impl(_lib, "batch_norm_nhwc_backward.out", "CompositeExplicitAutograd")
def _backward_out(grad_out, x, weight, sample_mask, mean, invstd, *, grad_input, grad_weight, grad_bias):
    outs = (grad_input, grad_weight, grad_bias)
    results = _backward_reference(grad_out, x, weight, sample_mask, mean, invstd)
    for out, value in zip(outs, results, strict=True):
        out.copy_(value)
    return outs


@torch.library.register_fake(f"{NAMESPACE}::batch_norm_nhwc_backward")
def _backward_fake(grad_out, x, weight, sample_mask, mean, invstd):
    return torch.empty_like(x), torch.empty_like(weight), torch.empty_like(weight)


def _setup(ctx, inputs, output) -> None:
    x, weight, _, sample_mask = inputs[:4]
    _, mean, invstd, new_mean, new_var = output
    ctx.mark_non_differentiable(mean, invstd, new_mean, new_var)
    ctx.save_for_backward(x, weight, sample_mask, mean, invstd)


def _grad(ctx, grad_y, *_unused):
    x, weight, sample_mask, mean, invstd = ctx.saved_tensors
    gx, gw, gb = torch.ops.fedsdk.batch_norm_nhwc_backward(grad_y.contiguous(), x, weight, sample_mask, mean,
                                                           invstd)
    return gx, gw, gb, None, None, None, None, None


torch.library.register_autograd(f"{NAMESPACE}::batch_norm_nhwc", _grad, setup_context=_setup)


def batch_norm_train(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, sample_mask: torch.Tensor,
                     running: tuple[torch.Tensor, torch.Tensor] | None, momentum: float, eps: float
                     ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """Train-mode BatchNorm of (B, H, W, C) over the real samples; the signature and results of
    ``export.decompositions.batch_norm_train`` (normalised x, updated running stats or None)."""
    mean, var = running if running is not None else (None, None)
    y, _, _, new_mean, new_var = torch.ops.fedsdk.batch_norm_nhwc(x.contiguous(), weight, bias, sample_mask,
                                                                  mean, var, momentum, eps)
    return y, (None if running is None else (new_mean, new_var))
