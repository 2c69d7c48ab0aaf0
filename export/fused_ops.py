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
