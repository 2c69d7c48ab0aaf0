"""The ``fedsdk::`` custom training ops of the fused kernel set (``--kernels fused``).

Each op is one ``torch.library`` operator with a functional schema (what the model and
autograd call), an ``.out`` schema (what ExecuTorch's memory planning turns it into), a
fake implementation (shapes, for ``torch.export``), a torch implementation (eager
reference: the op must mean exactly what the C++ kernel computes) and an autograd formula
that calls the op's backward op. The C++ kernels are in
``sdk_device/runtimes/native/fedsdk_kernels.cpp`` (library ``libfedsdk_kernels``), registered
with ExecuTorch under the same names.

Ops (activations channels-last, as everywhere in ``export.decompositions``):

``fedsdk::conv2d_nhwc(x (B,H,W,C), weight (O,C,k,k), bias (O,)?, stride, pad) -> (B,Ho,Wo,O)``
    groups == 1 convolution; the weight keeps torch's layout so parameter shapes do not change.
``fedsdk::conv2d_nhwc_backward(grad_out, x, weight, stride, pad, input_grad)
    -> (grad_input (B,H,W,C), grad_weight (O,C,k,k), grad_bias (O,))``
    ``input_grad`` False (the program's input needs no gradient): grad_input is zeros.
``fedsdk::rectify(x) -> max(x, 0)``; ``fedsdk::rectify_backward(grad_out, y) -> grad_out * (y > 0)``
    ReLU (the backward reads the output, as torch's threshold backward does).
``fedsdk::max_pool_nhwc(x (B,H,W,C), k) -> (B, H//k, W//k, C)``; ``..._backward(grad_out, x, k)``
    k x k max-pool with stride k (a ragged edge is dropped); the gradient goes to the first
    maximum of each window in row-major order (torch's rule), recomputed from ``x``.

Train-mode BatchNorm (``fedsdk::batch_norm_nhwc``) is defined in ``export.fused_batch_norm``,
a fragment of the same namespace.

Decision: ops live in their own ``fedsdk`` namespace and none is named after an ATen op
(XNNPACK's partitioner claims a ``relu`` of any namespace).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

KERNEL_SET = "fused"  # the program metadata's "kernels" value when these ops are used
NAMESPACE = "fedsdk"

_lib = torch.library.Library(NAMESPACE, "DEF")  # noqa: TOR901 - the namespace's one definition
_lib.define("conv2d_nhwc(Tensor x, Tensor weight, Tensor? bias, int stride, int pad) -> Tensor")
_lib.define("conv2d_nhwc.out(Tensor x, Tensor weight, Tensor? bias, int stride, int pad, *, "
            "Tensor(a!) out) -> Tensor(a!)")
_lib.define("conv2d_nhwc_backward(Tensor grad_out, Tensor x, Tensor weight, int stride, int pad, "
            "bool input_grad) -> (Tensor, Tensor, Tensor)")
_lib.define("conv2d_nhwc_backward.out(Tensor grad_out, Tensor x, Tensor weight, int stride, int pad, "
            "bool input_grad, *, Tensor(a!) grad_input, Tensor(b!) grad_weight, Tensor(c!) grad_bias) "
            "-> (Tensor(a!), Tensor(b!), Tensor(c!))")


for _schema in (
        "rectify(Tensor x) -> Tensor",
        "rectify.out(Tensor x, *, Tensor(a!) out) -> Tensor(a!)",
        "rectify_backward(Tensor grad_out, Tensor y) -> Tensor",
        "rectify_backward.out(Tensor grad_out, Tensor y, *, Tensor(a!) out) -> Tensor(a!)",
        "max_pool_nhwc(Tensor x, int k) -> Tensor",
        "max_pool_nhwc.out(Tensor x, int k, *, Tensor(a!) out) -> Tensor(a!)",
        "max_pool_nhwc_backward(Tensor grad_out, Tensor x, int k) -> Tensor",
        "max_pool_nhwc_backward.out(Tensor grad_out, Tensor x, int k, *, Tensor(a!) out) -> Tensor(a!)"):
    _lib.define(_schema)


def _out_size(size: int, k: int, stride: int, pad: int) -> int:
    return (size + 2 * pad - k) // stride + 1


def _conv_reference(x, weight, bias, stride, pad):
    """torch's convolution on channels-last tensors (the ops' eager meaning)."""
    y = F.conv2d(x.permute(0, 3, 1, 2), weight, bias, stride=stride, padding=pad)
    return y.permute(0, 2, 3, 1).contiguous()


def _conv_backward_reference(grad_out, x, weight, stride, pad, input_grad):
    x_nchw = x.permute(0, 3, 1, 2).contiguous()
    g_nchw = grad_out.permute(0, 3, 1, 2).contiguous()
    grad_x, grad_w, grad_b = torch.ops.aten.convolution_backward(
        g_nchw, x_nchw, weight, [weight.shape[0]], [stride, stride], [pad, pad], [1, 1], False, [0, 0],
        1, [input_grad, True, True])
    gx = grad_x.permute(0, 2, 3, 1).contiguous() if input_grad else torch.zeros_like(x)
    return gx, grad_w, grad_b


@torch.library.impl(_lib, "conv2d_nhwc", "CompositeExplicitAutograd")
def _conv(x, weight, bias, stride, pad):
    return _conv_reference(x, weight, bias, stride, pad)


@torch.library.impl(_lib, "conv2d_nhwc.out", "CompositeExplicitAutograd")
def _conv_out(x, weight, bias, stride, pad, *, out):
    out.copy_(_conv_reference(x, weight, bias, stride, pad))
    return out


@torch.library.register_fake(f"{NAMESPACE}::conv2d_nhwc")
def _conv_fake(x, weight, bias, stride, pad):
    b, h, w, _ = x.shape
    k = weight.shape[2]
    return x.new_empty(b, _out_size(h, k, stride, pad), _out_size(w, k, stride, pad), weight.shape[0])


@torch.library.impl(_lib, "conv2d_nhwc_backward", "CompositeExplicitAutograd")
def _conv_backward(grad_out, x, weight, stride, pad, input_grad):
    return _conv_backward_reference(grad_out, x, weight, stride, pad, input_grad)


@torch.library.impl(_lib, "conv2d_nhwc_backward.out", "CompositeExplicitAutograd")
def _conv_backward_out(grad_out, x, weight, stride, pad, input_grad, *, grad_input, grad_weight, grad_bias):
    gx, gw, gb = _conv_backward_reference(grad_out, x, weight, stride, pad, input_grad)
    grad_input.copy_(gx)
    grad_weight.copy_(gw)
    grad_bias.copy_(gb)
    return grad_input, grad_weight, grad_bias


@torch.library.register_fake(f"{NAMESPACE}::conv2d_nhwc_backward")
def _conv_backward_fake(grad_out, x, weight, stride, pad, input_grad):
    return torch.empty_like(x), torch.empty_like(weight), weight.new_empty(weight.shape[0])


def _conv_setup(ctx, inputs, output) -> None:
    x, weight, bias, stride, pad = inputs
    ctx.save_for_backward(x, weight)
    ctx.stride, ctx.pad, ctx.has_bias = stride, pad, bias is not None


def _conv_grad(ctx, grad_out):
    x, weight = ctx.saved_tensors
    gx, gw, gb = torch.ops.fedsdk.conv2d_nhwc_backward(grad_out.contiguous(), x, weight, ctx.stride, ctx.pad,
                                                       ctx.needs_input_grad[0])
    return (gx if ctx.needs_input_grad[0] else None), gw, (gb if ctx.has_bias else None), None, None


torch.library.register_autograd(f"{NAMESPACE}::conv2d_nhwc", _conv_grad, setup_context=_conv_setup)


def conv2d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: int,
           pad: int) -> torch.Tensor:
    """groups == 1 convolution of (B, H, W, C) by a torch-layout weight -> (B, Ho, Wo, O)."""
    return torch.ops.fedsdk.conv2d_nhwc(x.contiguous(), weight, bias, stride, pad)


# -- ReLU and max-pool ------------------------------------------------------------------------------
def _pool_reference(x, k):
    return F.max_pool2d(x.permute(0, 3, 1, 2), k, k).permute(0, 2, 3, 1).contiguous()


def _pool_backward_reference(grad_out, x, k):
    b, h, w, c = x.shape
    _, index = F.max_pool2d(x.permute(0, 3, 1, 2), k, k, return_indices=True)  # into H*W per channel
    grad = grad_out.permute(0, 3, 1, 2).reshape(b, c, -1)
    flat = grad.new_zeros(b, c, h * w).scatter_add_(2, index.reshape(b, c, -1), grad)
    return flat.reshape(b, c, h, w).permute(0, 2, 3, 1).contiguous()


_REFERENCES = {
    "rectify": lambda x: torch.relu(x),
    "rectify_backward": lambda grad_out, y: grad_out * (y > 0).to(grad_out.dtype),
    "max_pool_nhwc": _pool_reference,
    "max_pool_nhwc_backward": _pool_backward_reference,
}


def _register(name, reference) -> None:
    def functional(*args):
        return reference(*args)

    def out_variant(*args, out):
        out.copy_(reference(*args))
        return out

    torch.library.impl(_lib, name, "CompositeExplicitAutograd")(functional)
    torch.library.impl(_lib, f"{name}.out", "CompositeExplicitAutograd")(out_variant)


for _name, _reference in _REFERENCES.items():
    _register(_name, _reference)


@torch.library.register_fake(f"{NAMESPACE}::rectify")
def _rectify_fake(x):
    return torch.empty_like(x)


@torch.library.register_fake(f"{NAMESPACE}::rectify_backward")
def _rectify_backward_fake(grad_out, y):
    return torch.empty_like(grad_out)


@torch.library.register_fake(f"{NAMESPACE}::max_pool_nhwc")
def _pool_fake(x, k):
    b, h, w, c = x.shape
    return x.new_empty(b, h // k, w // k, c)


@torch.library.register_fake(f"{NAMESPACE}::max_pool_nhwc_backward")
def _pool_backward_fake(grad_out, x, k):
    return torch.empty_like(x)


def _rectify_setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(output)


def _rectify_grad(ctx, grad_out):
    (y,) = ctx.saved_tensors
    return torch.ops.fedsdk.rectify_backward(grad_out.contiguous(), y)


def _pool_setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(inputs[0])
    ctx.k = inputs[1]


def _pool_grad(ctx, grad_out):
    (x,) = ctx.saved_tensors
    return torch.ops.fedsdk.max_pool_nhwc_backward(grad_out.contiguous(), x, ctx.k), None


torch.library.register_autograd(f"{NAMESPACE}::rectify", _rectify_grad, setup_context=_rectify_setup)
torch.library.register_autograd(f"{NAMESPACE}::max_pool_nhwc", _pool_grad, setup_context=_pool_setup)


def rectify(x: torch.Tensor) -> torch.Tensor:
    """ReLU of any tensor (named so that XNNPACK's partitioner does not claim it)."""
    return torch.ops.fedsdk.rectify(x.contiguous())


def max_pool2d(x: torch.Tensor, k: int) -> torch.Tensor:
    """k x k max-pool with stride k of (B, H, W, C), torch's first-maximum gradient."""
    return torch.ops.fedsdk.max_pool_nhwc(x.contiguous(), k)
