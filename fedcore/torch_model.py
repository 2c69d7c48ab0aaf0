"""Build a ``torch.nn.Module`` from a torchspec/1 model spec (imports torch)."""

from __future__ import annotations

import torch
from torch import nn

from . import modelspec


class SpecModel(nn.Module):
    """The model a spec describes; ``forward`` returns a tuple of logits (exits, final)."""

    def __init__(self, spec: dict) -> None:
        super().__init__()
        modelspec.validate(spec)
        self.spec = spec
        self.layers = nn.ModuleList(_build_layer(layer) for layer in spec["layers"])

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.forward_with_features(x)[0]

    def forward_with_features(self, x: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        """``(outputs, features)``: the logits (exits, final) and the (B, F) input of the last
        layer when it is linear (the "last hidden features" of distillation losses), else the
        final logits themselves."""
        outputs = []
        features = None
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            if isinstance(layer, Exit):
                outputs.append(layer(x))
                continue
            if i == last and isinstance(layer, nn.Linear):
                features = x
            x = layer(x)
        outputs.append(x)
        return tuple(outputs), (x if features is None else features)


class Residual(nn.Module):
    """``body(x) + shortcut(x)``; an empty shortcut is the identity."""

    def __init__(self, body: list[dict], shortcut: list[dict]) -> None:
        super().__init__()
        self.body = nn.Sequential(*(_build_layer(layer) for layer in body))
        self.shortcut = nn.Sequential(*(_build_layer(layer) for layer in shortcut))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) + self.shortcut(x)


class Exit(nn.Module):
    """An early-exit head; its output is collected, the trunk input passes on unchanged."""

    def __init__(self, head: list[dict]) -> None:
        super().__init__()
        self.head = nn.Sequential(*(_build_layer(layer) for layer in head))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x)


def _build_layer(layer: dict) -> nn.Module:
    op = layer["op"]
    if op == "conv2d":
        return nn.Conv2d(layer["in"], layer["out"], layer["k"], stride=layer.get("stride", 1),
                         padding=layer.get("pad", 0), bias=layer.get("bias", True),
                         groups=layer.get("groups", 1))
    if op == "batchnorm2d":
        return nn.BatchNorm2d(layer["c"], track_running_stats=layer.get("track", True))
    if op == "relu":
        return nn.ReLU()
    if op == "maxpool2d":
        return nn.MaxPool2d(layer["k"])
    if op == "avgpool2d":
        return nn.AvgPool2d(layer["k"])
    if op == "gap":
        return nn.AdaptiveAvgPool2d(1)
    if op == "flatten":
        return nn.Flatten()
    if op == "dropout":
        return nn.Dropout(layer.get("p", 0.5))
    if op == "linear":
        return nn.Linear(layer["in"], layer["out"], bias=layer.get("bias", True))
    if op == "residual":
        return Residual(layer["body"], layer.get("shortcut", []))
    if op == "exit":
        return Exit(layer["head"])
    raise modelspec.SpecError(f"unknown op {op!r}")


def build_model(spec: dict, seed: int | None = None) -> SpecModel:
    """Instantiate ``spec``; ``seed`` makes the initial weights reproducible."""
    if seed is None:
        return SpecModel(spec)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return SpecModel(spec)


def state_numpy(model: nn.Module) -> dict:
    """The model's weights and buffers as numpy arrays (``num_batches_tracked`` dropped:
    BatchNorm uses a fixed momentum, so the counter is not used)."""
    return {name: t.detach().cpu().numpy().copy() for name, t in model.state_dict().items()
            if not name.endswith("num_batches_tracked")}


def load_numpy(model: nn.Module, weights: dict) -> None:
    """Load numpy weights into ``model``; KeyError/ValueError on a mismatch."""
    own = {k for k in model.state_dict() if not k.endswith("num_batches_tracked")}
    if set(weights) != own:
        missing, extra = sorted(own - set(weights)), sorted(set(weights) - own)
        raise KeyError(f"weights do not fit the model: missing {missing[:5]}, unexpected {extra[:5]}")
    tensors = {k: torch.from_numpy(v.copy()) for k, v in weights.items()}
    model.load_state_dict(tensors, strict=False)
