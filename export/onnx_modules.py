"""Torch modules rewritten so their ONNX graphs train like torch (see ``export/onnx.py``).

* ``ExportBatchNorm2d``: BatchNorm in train mode as mean/variance arithmetic, returning the
  new running statistics (ONNX's own node updates them with the biased variance, and ORT
  never writes them back);
* ``ExportAvgPool2d``: average pooling as a depthwise convolution with constant weights
  (ORT 1.19's AveragePool gradient kernel dies with SIGFPE);
* ``TrainingForward``: a model plus its loss, outputs = loss, final logits, new running
  statistics: what the training graph computes.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from fedcore.losses import Loss


class ExportBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm2d whose train-mode forward is plain arithmetic that exports exactly.

    In train mode it normalises with the batch mean and biased variance (as torch does)
    and, instead of mutating its buffers, keeps the new running statistics in
    ``new_running_stats`` (running mean, running var with the unbiased variance) for the
    enclosing graph to return. In eval mode it is an ordinary BatchNorm2d.
    """

    new_running_stats: tuple[torch.Tensor, torch.Tensor] | None = None

    @classmethod
    def replacing(cls, bn: nn.BatchNorm2d) -> ExportBatchNorm2d:
        if bn.momentum is None:
            raise ValueError("BatchNorm with a cumulative average (momentum=None) is not exportable")
        twin = cls(bn.num_features, eps=bn.eps, momentum=bn.momentum, affine=bn.affine,
                   track_running_stats=bn.track_running_stats)
        twin.load_state_dict(bn.state_dict())
        return twin.train(bn.training)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        use_batch_stats = self.training or not self.track_running_stats
        if not use_batch_stats:
            return super().forward(x)
        dims = (0, 2, 3)
        mean = x.mean(dim=dims, keepdim=True)
        centered = x - mean
        var = (centered * centered).mean(dim=dims, keepdim=True)
        y = centered * torch.rsqrt(var + self.eps)
        if self.affine:
            y = y * self.weight[None, :, None, None] + self.bias[None, :, None, None]
        if self.training and self.track_running_stats:
            # samples per channel (B * H * W) as a float computed in the graph: integer shape
            # arithmetic would freeze the example batch size or crash ORT's gradient builder
            count = torch.ones_like(x[:, 0]).sum()
            unbiased = var.flatten() * count / (count - 1)
            m = self.momentum
            self.new_running_stats = ((1 - m) * self.running_mean + m * mean.flatten(),
                                      (1 - m) * self.running_var + m * unbiased)
        return y


def _pair(value: int | tuple) -> tuple:
    """A pooling size as (height, width)."""
    return (value, value) if isinstance(value, int) or value is None else tuple(value)


class ExportAvgPool2d(nn.Module):
    """Average pooling as a depthwise convolution with constant 1/(k*k) weights.

    ONNX Runtime 1.19's AveragePool gradient kernel crashes (SIGFPE) on CPU, while its
    convolution gradient is sound; the two compute the same averages (zero padding
    counted, as torch's default ``count_include_pad=True``). Global pooling to 1x1 keeps
    ONNX's GlobalAveragePool, whose gradient works."""

    def __init__(self, pool: nn.AvgPool2d | nn.AdaptiveAvgPool2d) -> None:
        super().__init__()
        self.pool = pool
        if isinstance(pool, nn.AvgPool2d) and (pool.ceil_mode or pool.divisor_override or (
                not pool.count_include_pad and pool.padding)):
            raise ValueError(f"{pool}: only floor mode with zero padding counted is exportable")

    def _geometry(self, height: int, width: int) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
        """(kernel, stride, padding) of the pool on an input of height x width."""
        pool = self.pool
        if isinstance(pool, nn.AvgPool2d):
            return _pair(pool.kernel_size), _pair(pool.stride or pool.kernel_size), _pair(pool.padding)
        out_h, out_w = _pair(pool.output_size)
        out_h, out_w = out_h or height, out_w or width
        if height % out_h or width % out_w:
            raise ValueError(f"{pool}: input {height}x{width} is not a multiple of the output size")
        kernel = (height // out_h, width // out_w)
        return kernel, kernel, (0, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        channels, height, width = (int(d) for d in x.shape[1:])  # fixed per program; batch varies
        if isinstance(self.pool, nn.AdaptiveAvgPool2d) and _pair(self.pool.output_size) == (1, 1):
            return self.pool(x)
        kernel, stride, padding = self._geometry(height, width)
        weight = torch.full((channels, 1, *kernel), 1.0 / (kernel[0] * kernel[1]), dtype=x.dtype)
        return torch.nn.functional.conv2d(x, weight, stride=stride, padding=padding, groups=channels)


def with_export_batchnorm(model: nn.Module) -> tuple[nn.Module, list[tuple[str, ExportBatchNorm2d]]]:
    """A deep copy of ``model`` made exportable with exact gradients: every BatchNorm2d
    becomes an ExportBatchNorm2d (same names, same weights) and every average pool an
    ExportAvgPool2d; returns it and its ``(module path, batchnorm)`` list."""
    model = copy.deepcopy(model)
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.BatchNorm2d) and not isinstance(child, ExportBatchNorm2d):
                setattr(module, child_name, ExportBatchNorm2d.replacing(child))
            elif isinstance(child, nn.AvgPool2d | nn.AdaptiveAvgPool2d):
                setattr(module, child_name, ExportAvgPool2d(child))
    found = [(path, m) for path, m in model.named_modules() if isinstance(m, ExportBatchNorm2d)]
    return model, found


def last_linear(model: nn.Module) -> nn.Linear | None:
    """The model's final layer when it is linear (its input is the 'features' of a loss)."""
    layers = getattr(model, "layers", None)
    return layers[-1] if layers is not None and isinstance(layers[-1], nn.Linear) else None


class TrainingForward(nn.Module):
    """forward(input, labels, *extra loss inputs) -> (loss, final logits, *new running stats).

    The loss is ``fedcore.losses.Loss``, the same definition every exported program uses.
    The batch axis is dynamic, so every row is a real sample: the sample mask is all ones."""

    def __init__(self, model: nn.Module, loss: Loss, num_classes: int) -> None:
        super().__init__()
        self.model, self.batchnorms = with_export_batchnorm(model)
        self.model.train()
        self.loss = loss
        self.features: torch.Tensor | None = None
        linear = last_linear(self.model)
        if linear is not None:
            linear.register_forward_pre_hook(self._keep_features)
        self.extras = loss.extra_inputs(num_classes, linear.in_features if linear is not None else 0)

    def _keep_features(self, module: nn.Module, args: tuple) -> None:
        self.features = args[0]

    def running_stat_names(self) -> list[str]:
        return [f"{path}.{buf}" for path, bn in self.batchnorms if bn.track_running_stats
                for buf in ("running_mean", "running_var")]

    def forward(self, x: torch.Tensor, labels: torch.Tensor, *extras: torch.Tensor) -> tuple:
        outputs = self.model(x)
        sample_mask = torch.ones_like(labels, dtype=x.dtype)
        named = dict(zip([name for name, _ in self.extras], extras, strict=True))
        loss = self.loss(outputs, self.features, labels, sample_mask, named)
        stats = [t for _, bn in self.batchnorms if bn.track_running_stats for t in bn.new_running_stats]
        return (loss, outputs[-1], *stats)
