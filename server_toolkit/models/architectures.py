"""Tier -> architecture: what a hypernetwork server needs to know of a device's model.

A device's *tier* names its architecture (``--tiers lenet,vgg8,resnet10,resnet12,mlp`` or
the registry's tier): any model of ``models.zoo`` (the heterogeneous-fleet architectures
of ``hetero_zoo`` first), optionally ``NAME@R`` (width ratio R). ``architecture(tier,
input_shape, num_classes)`` gives its torchspec/1 spec, the parameter tensors a
hypernetwork must generate (names and shapes, in the model's ``named_parameters`` order),
the state that stays on the device (BatchNorm running statistics) and K, the number of
generated values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from fedcore.modelspec import Shape

from .hetero_zoo import ARCHITECTURES
from .zoo import model_names, model_spec

__all__ = ["ARCHITECTURES", "Architecture", "architecture", "architecture_names", "from_spec"]


@dataclass(frozen=True)
class Architecture:
    """One device architecture as a hypernetwork server sees it.

    ``parameters``: (name, shape) of every generated tensor, in ``named_parameters`` order
    (the order a flat generated vector is unpacked in); ``buffers``: the state the device
    keeps (BatchNorm running statistics), never generated nor sent.
    """

    name: str
    spec: dict
    parameters: tuple[tuple[str, tuple[int, ...]], ...]
    buffers: tuple[str, ...]

    @property
    def num_params(self) -> int:
        """K: how many values a hypernetwork generates for this architecture."""
        return sum(math.prod(shape) for _, shape in self.parameters)

    def chunks(self, chunk: int) -> int:
        """tau = ceil(K / chunk): the number of length-``chunk`` pieces covering K."""
        return math.ceil(self.num_params / chunk)

    def unpack(self, flat):
        """A flat vector of K values (numpy or torch) -> {name: tensor of its shape}, views."""
        if len(flat) != self.num_params:
            raise ValueError(f"{self.name}: expected {self.num_params} values, got {len(flat)}")
        out, start = {}, 0
        for name, shape in self.parameters:
            n = math.prod(shape)
            out[name] = flat[start:start + n].reshape(shape)
            start += n
        return out

    def flatten(self, weights: dict[str, np.ndarray]) -> np.ndarray:
        """{name: array} (at least every generated tensor) -> the flat (K,) float32 vector."""
        missing = [name for name, _ in self.parameters if name not in weights]
        if missing:
            raise KeyError(f"{self.name}: weights lack {missing[:5]}")
        wrong = [(n, tuple(weights[n].shape), s) for n, s in self.parameters if tuple(weights[n].shape) != s]
        if wrong:
            raise ValueError(f"{self.name}: wrong shapes (name, got, expected) {wrong[:3]}")
        return np.concatenate([np.asarray(weights[n], np.float32).reshape(-1) for n, _ in self.parameters])


def from_spec(name: str, spec: dict) -> Architecture:
    """The ``Architecture`` of a torchspec/1 spec (builds the model once to list its tensors)."""
    from fedcore.torch_model import build_model

    model = build_model(spec, seed=0)
    params = tuple((n, tuple(p.shape)) for n, p in model.named_parameters())
    buffers = tuple(n for n, _ in model.named_buffers() if not n.endswith("num_batches_tracked"))
    return Architecture(name, spec, params, buffers)


def architecture_names() -> list[str]:
    """Every valid tier name: the heterogeneous-fleet architectures, then the rest of the zoo."""
    return [*ARCHITECTURES, *(n for n in model_names() if n not in ARCHITECTURES)]


@lru_cache(maxsize=64)
def _cached(tier: str, input_shape: Shape, num_classes: int) -> Architecture:
    if tier.partition("@")[0] not in architecture_names():
        raise ValueError(f"tier {tier!r} names no architecture; known: {', '.join(architecture_names())} "
                         f"(NAME@R: NAME at width ratio R)")
    return from_spec(tier, model_spec(tier, input_shape, num_classes))


def architecture(tier: str, input_shape: Shape, num_classes: int) -> Architecture:
    """The architecture a tier names, for this input shape and class count (cached);
    ValueError listing the known names for an unknown tier."""
    return _cached(str(tier).strip().lower(), tuple(int(d) for d in input_shape), int(num_classes))
