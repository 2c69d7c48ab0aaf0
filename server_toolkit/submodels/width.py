"""Width-shared sub-models (HeteroFL, FedRolex, FedDM): a tier with ratio r trains every
hidden layer with a window of ``ceil(r * C)`` of its C channels, full kernels.

Channel spaces. Each conv/linear output opens a *channel space*: the set of channels
that keep one meaning from the layer that writes them to every layer that reads them
(BatchNorm, ReLU, pooling and dropout pass a space through unchanged). A window is chosen
once per space, so layer l+1's input window is always layer l's output window. A residual
block's body and shortcut outputs are added, so their two spaces are merged into one (an
identity shortcut merges the body's output into the block's input space). A flatten turns
a (C, H, W) map into C*H*W features, feature index ``c*H*W + p``: a linear layer reading
it keeps the H*W features of every kept channel. The input channels and every output's
class logits (final layer and exit heads) are *fixed* spaces: never cut.

Windows. A window is given by an offset o: channels ``(o + 0 .. n-1) mod C``, sorted.
Offset 0 is HeteroFL's top-left block; a window wraps around the channel axis (as in
FedRolex) so that every channel can sit in it equally often. The indices are sorted so the
sub-model keeps the global channel order: at r = 1 every window is ``arange(C)`` and the
sub-model is the global model, bit for bit.

Decisions (the papers leave these open):
* Normalisation: static BatchNorm, i.e. ``batchnorm2d`` with ``track: false`` (batch
  statistics in training *and* evaluation, no running buffers), as HeteroFL's sBN;
  ``static_bn`` converts a spec. HeteroFL's output "scaler" (1/r during training) is not
  used: the spec format has no such op and the runtime must stay generic.
* Window size ``ceil(r * C)`` (at least 1 channel), as HeteroFL's code rounds up.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import numpy as np

from fedcore import modelspec

Weights = dict[str, np.ndarray]
IndexMap = dict[str, tuple[np.ndarray, ...]]  # tensor name -> global indices of axis 0 (and 1)


@dataclass(frozen=True)
class Axis:
    """A tensor axis in channel-space terms: ``repeat`` consecutive features per channel of
    ``space`` (1 for conv channels, H*W for a flattened map)."""

    space: int
    repeat: int = 1


@dataclass(frozen=True)
class WidthPlan:
    """One tier's sub-model: its spec and where each of its tensors sits in the global one.

    ``channels[space]`` holds the kept global channel indices (sorted); ``index_map[name]``
    the global indices of the tensor's axis 0 (and axis 1 for conv/linear weights); the
    kernel axes are always whole.
    """

    spec: dict
    ratio: float
    offsets: dict[int, int]
    channels: dict[int, np.ndarray]
    index_map: IndexMap

    def context(self) -> dict:
        """The ``TrainInstruction.context`` of this plan (JSON): ratio and window offsets as
        ``[[space, offset], ...]``; ``WidthLayout.plan(*plan_args(context))`` rebuilds the plan."""
        return {"ratio": self.ratio, "offsets": sorted([int(s), int(o)] for s, o in self.offsets.items())}


def plan_args(context: dict) -> tuple[float, dict[int, int]]:
    """(ratio, offsets) of a width plan's ``context()``."""
    return float(context["ratio"]), {int(s): int(o) for s, o in context.get("offsets", [])}


@dataclass(frozen=True)
class WidthLayout:
    """How a spec's tensors hang on channel spaces (build it with ``width_layout``).

    ``sizes[space]``: channels in the global model; ``fixed``: spaces never cut;
    ``tensors[name]``: the axes of each parameter tensor; ``units``: the conv/linear layer
    names in depth order (``unit_of[name]`` says which unit a tensor belongs to, BN going
    with the conv before it); ``fields``: (path in ``spec["layers"]``, field, axis) of every
    width field to rewrite in a sub-model spec.
    """

    spec: dict
    sizes: dict[int, int]
    fixed: frozenset[int]
    tensors: dict[str, tuple[Axis, ...]]
    units: list[str]
    unit_of: dict[str, int]
    fields: list[tuple[tuple, str, Axis]] = field(repr=False)

    @property
    def hidden_spaces(self) -> list[int]:
        """The spaces a ratio cuts, in order of first appearance in the model."""
        return [s for s in sorted(self.sizes) if s not in self.fixed]

    def window_size(self, space: int, ratio: float) -> int:
        """Channels a tier of ``ratio`` keeps in ``space``."""
        size = self.sizes[space]
        return size if space in self.fixed else window_size(size, ratio)

    def plan(self, ratio: float, offsets: dict[int, int] | None = None) -> WidthPlan:
        """The sub-model of ``ratio`` with window offsets ``offsets[space]`` (missing: 0)."""
        if not 0 < ratio <= 1:
            raise ValueError(f"a width ratio must be in (0, 1], got {ratio}")
        offsets = {s: int((offsets or {}).get(s, 0)) % self.sizes[s] for s in self.hidden_spaces}
        channels = {s: window(self.sizes[s], self.window_size(s, ratio), offsets.get(s, 0))
                    for s in self.sizes}
        index_map = {name: tuple(_axis_indices(channels, axis) for axis in axes)
                     for name, axes in self.tensors.items()}
        sub_spec = copy.deepcopy(self.spec)
        for path, key, axis in self.fields:
            _layer_at(sub_spec, path)[key] = len(channels[axis.space]) * axis.repeat
        modelspec.validate(sub_spec)
        return WidthPlan(sub_spec, float(ratio), offsets, channels, index_map)


def window_size(size: int, ratio: float) -> int:
    """``ceil(ratio * size)``, at least 1 (rounded first so 0.75 * 16 is 12, not 13)."""
    return max(1, math.ceil(round(ratio * size, 9)))


def window(size: int, count: int, offset: int) -> np.ndarray:
    """Sorted indices of ``count`` consecutive channels from ``offset``, wrapping past ``size``."""
    return np.sort((offset + np.arange(count)) % size)


def static_bn(spec: dict) -> dict:
    """A copy of ``spec`` whose BatchNorm layers keep no running statistics (``track: false``)."""
    out = copy.deepcopy(spec)

    def convert(layers: list[dict]) -> None:
        for layer in layers:
            if layer["op"] == "batchnorm2d":
                layer["track"] = False
            for key in ("body", "shortcut", "head"):
                convert(layer.get(key, []))

    convert(out["layers"])
    return out


def extract(global_weights: Weights, index_map: IndexMap) -> Weights:
    """The sub-model's weights: each global tensor cut to its windows (copies)."""
    return {name: np.ascontiguousarray(global_weights[name][np.ix_(*indices)])
            for name, indices in index_map.items()}


def width_layout(spec: dict) -> WidthLayout:
    """Analyse ``spec`` (torchspec/1) into channel spaces; SpecError if it is not valid."""
    modelspec.validate(spec)
    builder = _LayoutBuilder()
    input_axis = Axis(builder.new_space(spec["input_shape"][0]))
    final_axis = builder.walk(spec["layers"], (), "layers", input_axis, tuple(spec["input_shape"]))
    fixed_raw = [input_axis.space, final_axis.space, *(a.space for a in builder.exit_axes)]
    return builder.finish(spec, fixed_raw)


class _LayoutBuilder:
    """Walks a spec once, opening a space per conv/linear output (union-find for merges)."""

    def __init__(self) -> None:
        self.parent: list[int] = []
        self.size: list[int] = []
        self.tensors: dict[str, tuple[Axis, ...]] = {}
        self.fields: list[tuple[tuple, str, Axis]] = []
        self.units: list[str] = []
        self.unit_of: dict[str, int] = {}
        self.exit_axes: list[Axis] = []

    def new_space(self, size: int) -> int:
        self.parent.append(len(self.parent))
        self.size.append(size)
        return len(self.parent) - 1

    def find(self, space: int) -> int:
        while self.parent[space] != space:
            space = self.parent[space]
        return space

    def merge(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if self.size[ra] != self.size[rb]:
            raise modelspec.SpecError(f"cannot merge channel spaces of {self.size[ra]} and {self.size[rb]}")
        self.parent[max(ra, rb)] = min(ra, rb)

    def add_tensor(self, name: str, axes: tuple[Axis, ...]) -> None:
        self.tensors[name] = axes
        self.unit_of[name] = max(len(self.units) - 1, 0)

    def walk(self, layers: list[dict], path: tuple, prefix: str, axis: Axis, shape: tuple) -> Axis:
        """Record the tensors of ``layers``; returns the axis of their output."""
        for i, layer in enumerate(layers):
            here, name, op = (*path, i), f"{prefix}.{i}", layer["op"]
            if op in ("conv2d", "linear"):
                if op == "conv2d" and axis.repeat != 1:
                    raise modelspec.SpecError(f"{name}: conv2d after a flatten")
                out = Axis(self.new_space(layer["out"]))
                self.units.append(name)
                self.add_tensor(f"{name}.weight", (out, axis))
                if layer.get("bias", True):
                    self.add_tensor(f"{name}.bias", (out,))
                self.fields += [(here, "in", axis), (here, "out", out)]
                axis = out
            elif op == "batchnorm2d":
                running = ("running_mean", "running_var") if layer.get("track", True) else ()
                for stat in ("weight", "bias", *running):
                    self.add_tensor(f"{name}.{stat}", (axis,))
                self.fields.append((here, "c", axis))
            elif op == "flatten" and len(shape) == 3:
                axis = Axis(axis.space, axis.repeat * shape[1] * shape[2])
            elif op == "residual":
                body = self.walk(layer["body"], (*here, "body"), f"{name}.body", axis, shape)
                short = self.walk(layer.get("shortcut", []), (*here, "shortcut"), f"{name}.shortcut",
                                  axis, shape)
                self.merge(body.space, short.space)
                axis = body
            elif op == "exit":
                self.exit_axes.append(self.walk(layer["head"], (*here, "head"), f"{name}.head", axis, shape))
            shape = modelspec.infer_shapes([layer], shape, name)[0]
        return axis

    def finish(self, spec: dict, fixed_raw: list[int]) -> WidthLayout:
        def resolve(axis: Axis) -> Axis:
            return Axis(self.find(axis.space), axis.repeat)

        roots = sorted({self.find(s) for s in range(len(self.parent))})
        return WidthLayout(
            spec=copy.deepcopy(spec),
            sizes={s: self.size[s] for s in roots},
            fixed=frozenset(self.find(s) for s in fixed_raw),
            tensors={name: tuple(resolve(a) for a in axes) for name, axes in self.tensors.items()},
            units=list(self.units),
            unit_of=dict(self.unit_of),
            fields=[(path, key, resolve(axis)) for path, key, axis in self.fields],
        )


def _axis_indices(channels: dict[int, np.ndarray], axis: Axis) -> np.ndarray:
    """Global feature indices of an axis: every kept channel's ``repeat`` features."""
    kept = channels[axis.space]
    return (kept[:, None] * axis.repeat + np.arange(axis.repeat)[None, :]).ravel()


def _layer_at(spec: dict, path: tuple) -> dict:
    node = spec["layers"]
    for key in path:
        node = node[key]
    return node
