"""Exit-split sub-models: a tier trains the depth prefix of the global model up to its exit.

The global spec has ``S`` outputs (``S - 1`` exit layers + the final classifier). Tier
``t`` (1..S; the tier name is the number of exits the device trains, ``None`` = all) gets
the top-level layers before the ``t``-th exit, the earlier exits unchanged, and the
``t``-th exit's head appended to the trunk, so that head is the sub-model's final output.
The device's loss (sum of CE over every output) is then HypeMeFed's local loss.

Segment ``n`` (0-based) = the trunk between exit ``n`` and exit ``n + 1``: tier ``t`` trains
segments ``0..t-1`` and exits ``1..t``. ``conv_segments`` lists each segment's conv weights,
which the hypernetworks map from one segment to the next; ``classifier_tensors`` names each
output's classifier (the last linear layer of every exit head, and the final layer).

Tensor names: a prefix layer keeps its global name; head layer ``j`` of exit ``t`` (global
``layers.<e>.head.<j>.*``) becomes ``layers.<e + j>.*`` in the sub-model. ``index_map`` of
a planned sub-model = ``{"tier": t, "to_global": {sub-model name: global name}}``.
"""

from __future__ import annotations

import re

from fedcore import modelspec

from .base import SubModel, Weights

_TOP_INDEX = re.compile(r"^layers\.(\d+)\.(.*)$")
_HEAD_INDEX = re.compile(r"^head\.(\d+)\.(.*)$")


def exit_positions(spec: dict) -> list[int]:
    """Top-level indices of the spec's exit layers, in order."""
    return [i for i, layer in enumerate(spec["layers"]) if layer["op"] == "exit"]


def num_tiers(spec: dict) -> int:
    """How many exit-split tiers the spec has (= its number of outputs)."""
    return len(exit_positions(spec)) + 1


def parse_tier(tier: str | int | None, spec: dict) -> int:
    """Tier name ("1", "2", ...; None = all) -> number of exits trained, checked against spec."""
    total = num_tiers(spec)
    if tier is None:
        return total
    try:
        value = int(tier)
    except (TypeError, ValueError):
        raise ValueError(f"exit-split tier must be an exit count 1..{total}, got {tier!r}") from None
    if not 1 <= value <= total:
        raise ValueError(f"exit-split tier must be an exit count 1..{total}, got {tier!r}")
    return value


def prefix_spec(global_spec: dict, tier: int) -> dict:
    """The spec tier ``tier`` trains (the global spec itself for the deepest tier)."""
    positions = exit_positions(global_spec)
    if tier == len(positions) + 1:
        return global_spec
    cut = positions[tier - 1]
    layers = global_spec["layers"]
    return modelspec.make(global_spec["input_shape"], global_spec["num_classes"],
                          [*layers[:cut], *layers[cut]["head"]])


def name_map(global_spec: dict, tier: int, global_names: list[str]) -> dict[str, str]:
    """Sub-model tensor name -> global tensor name, for the tensors tier ``tier`` trains."""
    positions = exit_positions(global_spec)
    if tier == len(positions) + 1:
        return {name: name for name in global_names}
    cut = positions[tier - 1]
    mapping = {}
    for name in global_names:
        top = _TOP_INDEX.match(name)
        if top is None:
            continue
        index, rest = int(top.group(1)), top.group(2)
        if index < cut:
            mapping[name] = name
        elif index == cut:
            head = _HEAD_INDEX.match(rest)
            if head is not None:
                mapping[f"layers.{cut + int(head.group(1))}.{head.group(2)}"] = name
    return mapping


def segment_of_layer(global_spec: dict, index: int) -> int:
    """Segment (0-based) of the top-level trunk layer ``index``."""
    return sum(1 for e in exit_positions(global_spec) if e < index)


def conv_segments(global_spec: dict) -> list[list[tuple[str, tuple[int, ...]]]]:
    """Per segment, its trunk conv weights as ``(global name, (OC, IC, K, K))`` in order
    (convs of residual bodies and shortcuts included; exit heads excluded)."""
    segments: list[list[tuple[str, tuple[int, ...]]]] = [[] for _ in range(num_tiers(global_spec))]
    for i, layer in enumerate(global_spec["layers"]):
        found = []
        if layer["op"] == "conv2d":
            found.append((f"layers.{i}.weight", layer))
        elif layer["op"] == "residual":
            for part in ("body", "shortcut"):
                found += [(f"layers.{i}.{part}.{j}.weight", inner)
                          for j, inner in enumerate(layer.get(part, [])) if inner["op"] == "conv2d"]
        segment = segment_of_layer(global_spec, i)
        segments[segment] += [(name, (c["out"], c["in"], c["k"], c["k"])) for name, c in found]
    return segments


def _linear_tensors(prefix: str, layer: dict) -> list[str]:
    return [f"{prefix}.weight", *([f"{prefix}.bias"] if layer.get("bias", True) else [])]


def classifier_tensors(global_spec: dict) -> list[str]:
    """Global names of every output's classifier tensors (weight, bias; rows = classes): the
    last linear layer of each exit head, then the spec's final layer when it is linear."""
    layers = global_spec["layers"]
    names: list[str] = []
    for i, layer in enumerate(layers):
        if layer["op"] != "exit":
            continue
        linears = [j for j, inner in enumerate(layer["head"]) if inner["op"] == "linear"]
        if linears:
            names += _linear_tensors(f"layers.{i}.head.{linears[-1]}", layer["head"][linears[-1]])
    if layers and layers[-1]["op"] == "linear":
        names += _linear_tensors(f"layers.{len(layers) - 1}", layers[-1])
    return names


class ExitSplit:
    """Planner: tier ``t`` trains the prefix through exit ``t`` (see the module docstring)."""

    def plan(self, global_spec: dict, global_weights: Weights, tier: str | None,
             round_number: int) -> SubModel:
        t = parse_tier(tier, global_spec)
        to_global = name_map(global_spec, t, list(global_weights))
        weights = {sub: global_weights[g] for sub, g in to_global.items()}
        return SubModel(prefix_spec(global_spec, t), weights, {"tier": t, "to_global": to_global})
