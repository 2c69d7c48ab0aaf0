"""The basic zoo models (small_cnn, lenet5, vgg_multi_exit, resnet_small) and the layer
helpers every model builder shares: functions from (input_shape, num_classes) to a
torchspec/1 spec (plain JSON, see ``fedcore.modelspec``).
"""

from __future__ import annotations

from fedcore import modelspec
from fedcore.modelspec import Shape


def conv(cin: int, cout: int, k: int = 3, stride: int = 1, pad: int | None = None,
         bias: bool = True) -> dict:
    """A conv2d layer; ``pad`` defaults to k // 2 (same size at stride 1)."""
    return {"op": "conv2d", "in": cin, "out": cout, "k": k, "stride": stride,
            "pad": k // 2 if pad is None else pad, "bias": bias}


def pool_if_possible(shape: Shape) -> list[dict]:
    """A 2x2 max-pool, omitted when the feature map is already smaller than 2x2."""
    return [{"op": "maxpool2d", "k": 2}] if shape[1] >= 2 and shape[2] >= 2 else []


def head(features_shape: Shape, num_classes: int, dropout: float | None = None) -> list[dict]:
    """flatten -> (dropout) -> linear: the classifier used for exits."""
    n = 1
    for d in features_shape:
        n *= d
    layers: list[dict] = [{"op": "flatten"}]
    if dropout:
        layers.append({"op": "dropout", "p": dropout})
    return [*layers, {"op": "linear", "in": n, "out": num_classes}]


def shape_after(input_shape: Shape, layers: list[dict]) -> Shape:
    """The (C, H, W) (or (N,)) shape after ``layers`` on a ``input_shape`` input."""
    return modelspec.infer_shapes(layers, tuple(input_shape), "layers")[0]


def small_cnn(input_shape: Shape, num_classes: int, width: int = 16) -> dict:
    """Two conv-ReLU-pool blocks (width, 2*width channels) and a 64-unit MLP head."""
    c = input_shape[0]
    layers = [conv(c, width), {"op": "relu"}]
    layers += pool_if_possible(shape_after(input_shape, layers))
    layers += [conv(width, 2 * width), {"op": "relu"}]
    layers += pool_if_possible(shape_after(input_shape, layers))
    flat = shape_after(input_shape, [*layers, {"op": "flatten"}])[0]
    layers += [{"op": "flatten"}, {"op": "linear", "in": flat, "out": 64}, {"op": "relu"},
               {"op": "linear", "in": 64, "out": num_classes}]
    return modelspec.make(input_shape, num_classes, layers)


def lenet5(input_shape: Shape, num_classes: int) -> dict:
    """LeNet-5: conv5(6)-pool-conv5(16)-pool-120-84-K. The second conv is padded on inputs
    smaller than 10x10 (e.g. 8x8 digits) so the feature map does not vanish."""
    c, h = input_shape[0], input_shape[1]
    layers = [conv(c, 6, 5, pad=2), {"op": "relu"}, {"op": "maxpool2d", "k": 2},
              conv(6, 16, 5, pad=0 if h >= 20 else 2), {"op": "relu"}]
    layers += pool_if_possible(shape_after(input_shape, layers))
    flat = shape_after(input_shape, [*layers, {"op": "flatten"}])[0]
    layers += [{"op": "flatten"}, {"op": "linear", "in": flat, "out": 120}, {"op": "relu"},
               {"op": "linear", "in": 120, "out": 84}, {"op": "relu"},
               {"op": "linear", "in": 84, "out": num_classes}]
    return modelspec.make(input_shape, num_classes, layers)


def vgg_multi_exit(input_shape: Shape, num_classes: int,
                   channels: tuple[int, ...] = (32, 64, 128, 256),
                   exits_after: tuple[int, ...] = (2, 3), dropout: float = 0.5) -> dict:
    """HypeMeFed's VGG-style multi-exit CNN: blocks of [conv3x3-BN-ReLU] x 2 + max-pool
    (the pool is skipped once the map is 1x1); exits (flatten -> dropout -> linear) after
    the blocks numbered in ``exits_after`` (1-based) and after the last block."""
    layers: list[dict] = []
    cin = input_shape[0]
    for block, cout in enumerate(channels, start=1):
        for _ in range(2):
            layers += [conv(cin, cout, bias=False), {"op": "batchnorm2d", "c": cout}, {"op": "relu"}]
            cin = cout
        layers += pool_if_possible(shape_after(input_shape, layers))
        if block in exits_after:
            layers.append({"op": "exit",
                           "head": head(shape_after(input_shape, layers), num_classes, dropout)})
    layers += head(shape_after(input_shape, layers), num_classes, dropout)
    return modelspec.make(input_shape, num_classes, layers)


def basic_block(cin: int, cout: int, stride: int) -> list[dict]:
    body = [conv(cin, cout, stride=stride, bias=False), {"op": "batchnorm2d", "c": cout},
            {"op": "relu"}, conv(cout, cout, bias=False), {"op": "batchnorm2d", "c": cout}]
    shortcut = []
    if stride != 1 or cin != cout:
        shortcut = [conv(cin, cout, k=1, stride=stride, pad=0, bias=False),
                    {"op": "batchnorm2d", "c": cout}]
    return [{"op": "residual", "body": body, "shortcut": shortcut}, {"op": "relu"}]


def resnet_small(input_shape: Shape, num_classes: int, widths: tuple[int, ...] = (16, 32, 64),
                 blocks_per_stage: int = 1) -> dict:
    """A small ResNet: conv3x3 stem, stages of basic blocks (stride 2 from the second
    stage on), global average pool, linear classifier."""
    layers = [conv(input_shape[0], widths[0], bias=False), {"op": "batchnorm2d", "c": widths[0]},
              {"op": "relu"}]
    cin = widths[0]
    for stage, cout in enumerate(widths):
        for b in range(blocks_per_stage):
            layers += basic_block(cin, cout, 2 if stage > 0 and b == 0 else 1)
            cin = cout
    layers += [{"op": "gap"}, {"op": "flatten"}, {"op": "linear", "in": cin, "out": num_classes}]
    return modelspec.make(input_shape, num_classes, layers)
