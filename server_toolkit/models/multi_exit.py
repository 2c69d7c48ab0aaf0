"""Multi-exit models: exits placed at fractions of a network's depth.

``add_exits(spec, n)`` turns an exit-free spec into one with ``n`` outputs: ``n - 1``
early exits at depth ``i/n`` (i = 1..n-1) plus the spec's own classifier as the last one.
Depth is counted in trunk conv layers (convs inside a residual body count, 1x1 shortcut
convs do not). An exit can only sit where a layer has just finished: after a ReLU or a
max-pool that is not itself followed by a max-pool; of those positions the one whose depth
is closest to ``i/n`` of the total is taken (the shallower one on a tie).

Models (HypeMeFed, seed 000, and RecipFL's DepthFL baseline):

* ``vgg_multi_exit`` — the paper's VGG (4 blocks, exits after blocks 2, 3 and 4); this is
  the zoo's model, re-exported so all exit-split models are reachable from here.
* ``resnet18_multi_exit`` — ResNet-18 (CIFAR stem, 4 stages of 2 basic blocks) with exits
  at thirds of its depth. Decision: its exit heads are gap -> flatten -> dropout -> linear
  (the VGG heads have no pooling); a ResNet's own classifier pools, and flattening a
  64x32x32 map would make one exit head larger than the first two stages together.
* ``cnn_multi_exit`` — a plain CNN of ``num_exits`` conv3x3-BN-ReLU layers with an exit
  after every layer (the paper's 10-exit FashionMNIST experiment). The paper does not give
  this CNN; ours keeps one width everywhere so that consecutive convs have equal shapes,
  and max-pools after every third layer while the map is at least 4x4 (keeps heads small).
* ``lenet5_multi_exit`` — LeNet-5 with one early exit (flatten -> linear) at the end of its
  conv trunk, where ``add_exits`` cannot cut (it keeps exits off the last conv). Its
  1-exit prefix (the two conv blocks and a linear classifier; 6.6k parameters on 28x28, the
  whole model 65.7k) is RecipFL's depth-scaled small model, about the size of LeNet-5 at
  width 0.3 (6.1k of 61.7k); the paper's MNIST small model has 5.6k of 44k.
"""

from __future__ import annotations

import copy

from fedcore import modelspec
from fedcore.modelspec import Shape

from .cnn import lenet5, resnet_small, vgg_multi_exit

__all__ = ["MULTI_EXIT", "add_exits", "cnn_multi_exit", "exit_cut_positions", "lenet5_multi_exit",
           "resnet18_multi_exit", "vgg_multi_exit"]

_CLASSIFIER_START = ("gap", "flatten")


def _convs_in(layer: dict) -> int:
    """Trunk conv layers inside one top-level layer (residual shortcuts excluded)."""
    if layer["op"] == "conv2d":
        return 1
    if layer["op"] == "residual":
        return sum(1 for inner in layer["body"] if inner["op"] == "conv2d")
    return 0


def _trunk_end(layers: list[dict]) -> int:
    """Index of the first top-level layer of the classifier (gap/flatten)."""
    for i, layer in enumerate(layers):
        if layer["op"] in _CLASSIFIER_START:
            return i
    raise modelspec.SpecError("the spec has no classifier (no top-level gap or flatten)")


def exit_cut_positions(spec: dict) -> list[tuple[int, int]]:
    """Where an exit may be inserted: ``(top-level index, trunk convs before it)`` pairs."""
    layers = spec["layers"]
    end = _trunk_end(layers)
    positions, depth = [], 0
    for i in range(end):
        depth += _convs_in(layers[i])
        finished = layers[i]["op"] in ("relu", "maxpool2d")
        pool_follows = i + 1 < end and layers[i + 1]["op"] == "maxpool2d"
        if finished and not pool_follows and depth > 0 and i + 1 < end:
            positions.append((i + 1, depth))
    return positions


def _exit_head(features: Shape, num_classes: int, dropout: float, pool: bool) -> list[dict]:
    """[gap] -> flatten -> dropout -> linear over a (C, H, W) feature map."""
    channels, height, width = features
    n = channels if pool else channels * height * width
    head = [{"op": "gap"}] if pool else []
    return [*head, {"op": "flatten"}, {"op": "dropout", "p": dropout},
            {"op": "linear", "in": n, "out": num_classes}]


def add_exits(spec: dict, num_exits: int, dropout: float = 0.5, pool: bool = False) -> dict:
    """A copy of exit-free ``spec`` with ``num_exits`` outputs (``num_exits - 1`` early exits
    at depth thirds/quarters/...; the spec's classifier stays the last output).
    ``pool`` puts a global average pool first in each exit head."""
    if num_exits < 1:
        raise ValueError(f"num_exits must be >= 1, got {num_exits}")
    if modelspec.num_outputs(spec) != 1:
        raise ValueError("add_exits expects a spec without exits")
    layers = copy.deepcopy(spec["layers"])
    candidates = exit_cut_positions(spec)
    total = sum(_convs_in(layer) for layer in layers[:_trunk_end(layers)])
    chosen: list[int] = []
    last_depth = 0
    for i in range(1, num_exits):
        target = i * total / num_exits
        usable = [(idx, d) for idx, d in candidates if d > last_depth and d < total]
        if not usable:
            raise ValueError(f"cannot place {num_exits} exits: the trunk has only {total} conv layers "
                             f"and {len(candidates)} places to cut")
        idx, last_depth = min(usable, key=lambda c: (abs(c[1] - target), c[1]))
        chosen.append(idx)
    input_shape = tuple(spec["input_shape"])
    for idx in reversed(chosen):  # insert from the back so earlier indices stay valid
        features = modelspec.infer_shapes(layers[:idx], input_shape, "layers")[0]
        layers.insert(idx, {"op": "exit", "head": _exit_head(features, spec["num_classes"], dropout, pool)})
    return modelspec.make(input_shape, spec["num_classes"], layers)


def resnet18_multi_exit(input_shape: Shape, num_classes: int, widths: tuple[int, ...] = (64, 128, 256, 512),
                        num_exits: int = 3, dropout: float = 0.5) -> dict:
    """ResNet-18 (stages of 2 basic blocks) with ``num_exits`` outputs at depth fractions."""
    plain = resnet_small(input_shape, num_classes, widths=widths, blocks_per_stage=2)
    return add_exits(plain, num_exits, dropout=dropout, pool=True)


def cnn_multi_exit(input_shape: Shape, num_classes: int, num_exits: int = 10, width: int = 32,
                   dropout: float = 0.5) -> dict:
    """``num_exits`` layers of conv3x3(width)-BN-ReLU, an exit after each (the last one is the
    final classifier); a 2x2 max-pool after every third layer while the map is >= 4x4."""
    layers: list[dict] = []
    channels = input_shape[0]
    for i in range(1, num_exits + 1):
        conv = {"op": "conv2d", "in": channels, "out": width, "k": 3, "stride": 1, "pad": 1, "bias": False}
        layers += [conv, {"op": "batchnorm2d", "c": width}, {"op": "relu"}]
        channels = width
        shape = modelspec.infer_shapes(layers, tuple(input_shape), "layers")[0]
        if i % 3 == 0 and i < num_exits and min(shape[1], shape[2]) >= 4:
            layers.append({"op": "maxpool2d", "k": 2})
    features = modelspec.infer_shapes(layers, tuple(input_shape), "layers")[0]
    layers += _exit_head(features, num_classes, dropout, pool=False)
    return add_exits(modelspec.make(input_shape, num_classes, layers), num_exits, dropout=dropout)


def lenet5_multi_exit(input_shape: Shape, num_classes: int) -> dict:
    """LeNet-5 with an exit (flatten -> linear) after its second conv block."""
    layers = lenet5(input_shape, num_classes)["layers"]
    cut = next(i for i, layer in enumerate(layers) if layer["op"] == "flatten")
    features = modelspec.infer_shapes([*layers[:cut], {"op": "flatten"}], tuple(input_shape), "layers")[0][0]
    head = [{"op": "flatten"}, {"op": "linear", "in": features, "out": num_classes}]
    layers = [*layers[:cut], {"op": "exit", "head": head}, *layers[cut:]]
    return modelspec.make(input_shape, num_classes, layers)


# the models of this module ``--model`` can name (besides the zoo's own ``vgg_multi_exit``)
MULTI_EXIT = {"lenet5_multi_exit": lenet5_multi_exit}
