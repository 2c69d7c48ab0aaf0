"""The model of a torchspec/1 spec, written for export: same parameters, safe operations.

``ProgramModel`` has exactly the parameters of ``fedcore.torch_model.SpecModel``
(same names, shapes and order), but its forward pass uses ``export.decompositions`` (which
ExecuTorch trains correctly) and takes as explicit inputs everything that is state or
randomness in torch:

* ``sample_mask`` (B,): 1 for a real sample, 0 for padding of a short last batch;
* ``dropout_masks``: one tensor per dropout layer in spec order, shaped like that layer's
  input in torch's layout (B, F) or (B, C, H, W), holding 0 or 1/(1-p). The device
  draws them, so a parity check can give torch the same masks;
* ``running``: BatchNorm running statistics (mean, var) of every tracked BN layer in spec
  order; the training forward returns their updated values instead of mutating buffers
  (ExecuTorch loads mutable buffers as zeros and a second method would not share them).

BatchNorm layers use batch statistics in training mode; in eval mode tracked layers use
the running statistics and static ones (``track: false``) use batch statistics, as torch
does. Dropout is the identity in eval mode. The input ``x`` is channels-last (B, H, W, C).
"""

from __future__ import annotations

import torch
from torch import nn

from fedcore import modelspec

from . import decompositions as ops
from . import fused_batch_norm, fused_ops


def _holder(layer: dict) -> nn.Module:
    """A module holding the parameters of one spec layer (none for parameter-free ops)."""
    holder = nn.Module()
    op = layer["op"]
    if op == "conv2d":
        k, groups = layer["k"], layer.get("groups", 1)
        holder.weight = nn.Parameter(torch.zeros(layer["out"], layer["in"] // groups, k, k))
        if layer.get("bias", True):
            holder.bias = nn.Parameter(torch.zeros(layer["out"]))
    elif op == "batchnorm2d":
        holder.weight = nn.Parameter(torch.ones(layer["c"]))
        holder.bias = nn.Parameter(torch.zeros(layer["c"]))
    elif op == "linear":
        holder.weight = nn.Parameter(torch.zeros(layer["out"], layer["in"]))
        if layer.get("bias", True):
            holder.bias = nn.Parameter(torch.zeros(layer["out"]))
    elif op == "residual":
        holder.body = nn.ModuleList(_holder(sub) for sub in layer["body"])
        holder.shortcut = nn.ModuleList(_holder(sub) for sub in layer.get("shortcut", []))
    elif op == "exit":
        holder.head = nn.ModuleList(_holder(sub) for sub in layer["head"])
    return holder


def _walk(layers: list[dict], prefix: str, shape: tuple[int, ...]):
    """Yield (name prefix, layer, per-sample input shape) for every leaf layer, in order."""
    for i, layer in enumerate(layers):
        name = f"{prefix}.{i}"
        if layer["op"] == "residual":
            yield from _walk(layer["body"], f"{name}.body", shape)
            yield from _walk(layer.get("shortcut", []), f"{name}.shortcut", shape)
        elif layer["op"] == "exit":
            yield from _walk(layer["head"], f"{name}.head", shape)
        else:
            yield name, layer, shape
        shape = modelspec.infer_shapes([layer], shape, name)[0]  # an exit leaves the trunk shape as is


def fused_layers(spec: dict) -> list[str]:
    """The names of ``spec``'s layers the fused kernel set runs (``_run``: groups == 1
    convolutions, BatchNorm, ReLU, max-pool); none: a "fused" export needs no fedsdk:: op."""
    covered = {"batchnorm2d", "relu", "maxpool2d"}
    return [name for name, layer, _ in _walk(spec["layers"], "layers", tuple(spec["input_shape"]))
            if layer["op"] in covered or (layer["op"] == "conv2d" and layer.get("groups", 1) == 1)]


class ProgramModel(nn.Module):
    """A spec's model as an export-friendly module. ``forward`` returns
    (outputs: tuple of (B, K) logits, exits then final; features (B, F): the input of the
    last linear layer; updated running statistics, flat [mean, var, mean, var, ...])."""

    def __init__(self, spec: dict, training: bool = True, kernels: str = "portable") -> None:
        super().__init__()
        modelspec.validate(spec)
        self.spec = spec
        self.train_mode = training
        # "fused": groups == 1 convolutions, batch-statistics BatchNorm, ReLU and max-pool use
        # export.fused_ops / export.fused_batch_norm
        self.kernels = kernels
        self.layers = nn.ModuleList(_holder(layer) for layer in spec["layers"])
        leaves = list(_walk(spec["layers"], "layers", tuple(spec["input_shape"])))
        self.dropout_shapes = [(name, layer.get("p", 0.5), shape) for name, layer, shape in leaves
                               if layer["op"] == "dropout"]
        self.running_names = [f"{name}.{stat}" for name, layer, _ in leaves
                              if layer["op"] == "batchnorm2d" and layer.get("track", True)
                              for stat in ("running_mean", "running_var")]
        self.running_shapes = [(layer["c"],) for _, layer, _ in leaves
                               if layer["op"] == "batchnorm2d" and layer.get("track", True)
                               for _ in range(2)]
        last = spec["layers"][-1]
        self.feature_size = last["in"] if last["op"] == "linear" else spec["num_classes"]

    def forward(self, x: torch.Tensor, sample_mask: torch.Tensor, dropout_masks: list[torch.Tensor],
                running: list[torch.Tensor]
                ) -> tuple[tuple[torch.Tensor, ...], torch.Tensor, list[torch.Tensor]]:
        state = _State(sample_mask, list(dropout_masks), list(running), self.train_mode)
        state.fused = self.kernels == "fused"
        h = x  # channels-last already: (B, H, W, C)
        outputs: list[torch.Tensor] = []
        features = None
        for i, (layer, params) in enumerate(zip(self.spec["layers"], self.layers, strict=True)):
            if layer["op"] == "exit":
                outputs.append(_run_seq(layer["head"], params.head, h, state))
                continue
            if i == len(self.layers) - 1 and layer["op"] == "linear":
                features = h
            h = _run(layer, params, h, state)
        outputs.append(h)
        return tuple(outputs), (h if features is None else features), state.new_running


class _State:
    """What one forward pass consumes (masks, running stats) and produces (new stats)."""

    def __init__(self, sample_mask, dropout_masks, running, training) -> None:
        self.sample_mask = sample_mask
        self.dropout_masks = dropout_masks
        self.running = running
        self.training = training
        self.new_running: list[torch.Tensor] = []
        self.fused = False  # use the fedsdk:: fused ops where they apply


def _run_seq(layers: list[dict], holders: nn.ModuleList, h: torch.Tensor, state: _State) -> torch.Tensor:
    for layer, params in zip(layers, holders, strict=True):
        h = _run(layer, params, h, state)
    return h


def _run(layer: dict, params: nn.Module, h: torch.Tensor, state: _State) -> torch.Tensor:
    op = layer["op"]
    if op == "conv2d":
        if state.fused and layer.get("groups", 1) == 1:  # grouped/depthwise: today's lowering
            return fused_ops.conv2d(h, params.weight, getattr(params, "bias", None), layer.get("stride", 1),
                                    layer.get("pad", 0))
        return ops.conv2d(h, params.weight, getattr(params, "bias", None), layer.get("stride", 1),
                          layer.get("pad", 0), layer.get("groups", 1))
    if op == "batchnorm2d":
        tracked = layer.get("track", True)
        if state.training or not tracked:
            running = (state.running.pop(0), state.running.pop(0)) if tracked else None
            if state.fused:
                y, updated = fused_batch_norm.batch_norm_train(
                    h, params.weight, params.bias, state.sample_mask, running, ops.BN_MOMENTUM, ops.BN_EPS)
            else:
                y, updated = ops.batch_norm_train(h, params.weight, params.bias, state.sample_mask, running)
            if updated is not None:
                state.new_running.extend(updated)
            return y
        mean, var = state.running.pop(0), state.running.pop(0)
        return ops.batch_norm_eval(h, params.weight, params.bias, mean, var)
    if op == "relu":
        return fused_ops.rectify(h) if state.fused else ops.relu(h)
    if op == "maxpool2d":
        return fused_ops.max_pool2d(h, layer["k"]) if state.fused else ops.max_pool2d(h, layer["k"])
    if op == "avgpool2d":
        return ops.avg_pool2d(h, layer["k"])
    if op == "gap":
        return ops.global_avg_pool(h)
    if op == "flatten":
        return ops.flatten(h)
    if op == "dropout":
        if not state.training:
            return h
        return h * ops.to_channels_last(state.dropout_masks.pop(0))
    if op == "linear":
        return ops.linear(h, params.weight, getattr(params, "bias", None))
    if op == "residual":
        return _run_seq(layer["body"], params.body, h, state) + _run_seq(layer.get("shortcut", []),
                                                                          params.shortcut, h, state)
    raise modelspec.SpecError(f"unknown op {op!r}")
