"""``torchspec/1``: a model architecture as plain JSON (the torch runtime's program format).

A spec is ``{"format": "torchspec/1", "input_shape": [C, H, W], "num_classes": K,
"layers": [...]}``. Each layer is an object with an ``op``:

=============  ==============================================================
op             fields
=============  ==============================================================
conv2d         in, out, k, stride (1), pad (0), bias (true), groups (1; in and out divisible by it)
batchnorm2d    c, track (true: running statistics; false: static BN)
relu / flatten none
maxpool2d      k (stride = k)
avgpool2d      k (stride = k)
gap            global average pool to 1x1
dropout        p
linear         in, out, bias (true)
residual       body: [layers], shortcut: [layers] (empty = identity); output = body + shortcut
exit           head: [layers]; an early-exit output taken here, the trunk continues
=============  ==============================================================

The model's outputs are the exits in order followed by the last layer's output; every
output is a (batch, num_classes) logit tensor. Parameter names follow the nesting:
``layers.<i>.weight``, ``layers.<i>.body.<j>.bias``, ``layers.<i>.head.<j>.weight``.
JSON only: a device never executes code it received.
"""

from __future__ import annotations

import copy
import json
from typing import Any

FORMAT = "torchspec/1"
Shape = tuple[int, ...]


class SpecError(ValueError):
    """A spec that cannot describe a valid model."""


def dumps(spec: dict) -> bytes:
    """Canonical bytes of a spec (sorted keys), so equal specs have equal blob ids."""
    return json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()


def loads(data: bytes) -> dict:
    """Parse and validate a spec; SpecError if it is not a valid torchspec/1 model."""
    try:
        spec = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SpecError(f"not JSON: {exc}") from None
    validate(spec)
    return spec


def make(input_shape: Shape, num_classes: int, layers: list[dict]) -> dict:
    """Build and validate a spec."""
    spec = {"format": FORMAT, "input_shape": list(input_shape), "num_classes": num_classes,
            "layers": copy.deepcopy(layers)}
    validate(spec)
    return spec


def validate(spec: Any) -> None:
    """Check format, fields and that shapes flow through every layer to the logits."""
    if not isinstance(spec, dict) or spec.get("format") != FORMAT:
        raise SpecError(f"not a {FORMAT} spec")
    shape = spec.get("input_shape")
    if not (isinstance(shape, list) and len(shape) == 3 and all(_pos_int(v) for v in shape)):
        raise SpecError("input_shape must be [C, H, W] of positive integers")
    k = spec.get("num_classes")
    if not _pos_int(k):
        raise SpecError("num_classes must be a positive integer")
    out, exits = infer_shapes(spec.get("layers"), tuple(shape), "layers")
    for where, exit_shape in [*exits, ("final output", out)]:
        if exit_shape != (k,):
            raise SpecError(f"{where} produces shape {exit_shape}, expected ({k},)")


def feature_size(spec: dict) -> int:
    """F, the width of the model's features (docs/protocol.md §12.4): the ``in`` of its last
    top-level layer when that layer is ``linear``, else ``num_classes`` (the features are then
    the final logits). Every runtime and the server's ``features`` check use this one rule."""
    last = spec["layers"][-1]
    return int(last["in"]) if last["op"] == "linear" else int(spec["num_classes"])


def num_outputs(spec: dict) -> int:
    """How many logit tensors the model returns (exits + final)."""
    return 1 + sum(1 for layer in spec["layers"] if layer.get("op") == "exit")


def infer_shapes(layers: Any, shape: Shape, where: str) -> tuple[Shape, list[tuple[str, Shape]]]:
    """Shape after ``layers`` given input ``shape`` (per sample), and each exit's shape."""
    if not isinstance(layers, list):
        raise SpecError(f"{where} must be a list")
    exits: list[tuple[str, Shape]] = []
    for i, layer in enumerate(layers):
        here = f"{where}[{i}]"
        if not isinstance(layer, dict) or not isinstance(layer.get("op"), str):
            raise SpecError(f"{here} must be an object with an 'op'")
        op = layer["op"]
        if op == "exit":
            head_out, inner = infer_shapes(layer.get("head"), shape, f"{here}.head")
            if inner:
                raise SpecError(f"{here}: an exit head cannot contain exits")
            exits.append((here, head_out))
            continue
        if op == "residual":
            body, e1 = infer_shapes(layer.get("body"), shape, f"{here}.body")
            short, e2 = infer_shapes(layer.get("shortcut", []), shape, f"{here}.shortcut")
            if e1 or e2 or body != short:
                raise SpecError(f"{here}: body gives {body}, shortcut gives {short}")
            shape = body
            continue
        shape = _layer_shape(op, layer, shape, here)
    return shape, exits


def _pos_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _need(layer: dict, key: str, here: str, default: Any = None, positive: bool = True) -> Any:
    v = layer.get(key, default)
    if v is None or not isinstance(v, int) or isinstance(v, bool) or (positive and v <= 0) or v < 0:
        raise SpecError(f"{here}: field {key!r} must be a {'positive' if positive else '>= 0'} integer")
    return v


def _layer_shape(op: str, layer: dict, shape: Shape, here: str) -> Shape:
    if op == "conv2d":
        if len(shape) != 3 or shape[0] != _need(layer, "in", here):
            raise SpecError(f"{here}: conv2d expects {layer.get('in')} channels, input is {shape}")
        k, s = _need(layer, "k", here), _need(layer, "stride", here, 1)
        p = _need(layer, "pad", here, 0, positive=False)
        g = _need(layer, "groups", here, 1)
        if layer["in"] % g or _need(layer, "out", here) % g:
            raise SpecError(f"{here}: conv2d groups={g} must divide in={layer['in']} and out={layer['out']}")
        h, w = (shape[1] + 2 * p - k) // s + 1, (shape[2] + 2 * p - k) // s + 1
        if h <= 0 or w <= 0:
            raise SpecError(f"{here}: conv2d k={k} on {shape[1]}x{shape[2]} leaves nothing")
        return (_need(layer, "out", here), h, w)
    if op == "batchnorm2d":
        if len(shape) != 3 or shape[0] != _need(layer, "c", here):
            raise SpecError(f"{here}: batchnorm2d over {layer.get('c')} channels, input is {shape}")
        return shape
    if op in ("relu", "dropout"):
        p = layer.get("p", 0.5)
        if op == "dropout" and not (isinstance(p, int | float) and not isinstance(p, bool) and 0 <= p < 1):
            raise SpecError(f"{here}: dropout p must be in [0, 1)")
        return shape
    if op in ("maxpool2d", "avgpool2d"):
        k = _need(layer, "k", here)
        if len(shape) != 3 or shape[1] < k or shape[2] < k:
            raise SpecError(f"{here}: {op} k={k} on input {shape}")
        return (shape[0], shape[1] // k, shape[2] // k)
    if op == "gap":
        if len(shape) != 3:
            raise SpecError(f"{here}: gap needs a (C, H, W) input, got {shape}")
        return (shape[0], 1, 1)
    if op == "flatten":
        n = 1
        for d in shape:
            n *= d
        return (n,)
    if op == "linear":
        if len(shape) != 1 or shape[0] != _need(layer, "in", here):
            raise SpecError(f"{here}: linear expects {layer.get('in')} features, input is {shape}")
        return (_need(layer, "out", here),)
    raise SpecError(f"{here}: unknown op {op!r}")
