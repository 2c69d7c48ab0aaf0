"""The architecture zoo of model-heterogeneous fleets (MH-pFedHN's Tables 16-19).

A device's *tier* names its architecture (``--tiers lenet,vgg8,resnet10,resnet12,mlp`` or
the registry's tier). ``architecture(tier, input_shape, num_classes)`` gives its torchspec/1
spec, the parameter tensors a hypernetwork must generate (names and shapes, in the model's
``named_parameters`` order), the state that stays on the device (BatchNorm running
statistics) and K, the number of generated values: all a hypernetwork server needs.

Sizes. The paper's models are for 32x32x3 CIFAR (K = 240k-570k). On 8x8 digits the same
layer lists give very different ratios (the flattened features shrink, the convolutions do
not), so:

==========  ==================================================================  ==========
tier        layers (``c`` = input channels)                                      K, digits
==========  ==================================================================  ==========
lenet       conv3x3 c->16, ReLU, pool, conv3x3 16->32, ReLU, pool, FC 108, 64   26,358
            (the paper's widths; "LeNet-style CNN", not the zoo's ``lenet5``)
vgg8        6 conv3x3 + BN + ReLU at 8,8 | pool | 16,16 | pool | 32,32 | pool,    36,438
            FC 180, 64 (half the paper's channels, BatchNorm added, no dropout)
resnet10    conv3x3 stem + BN, basic blocks (conv3x3-BN-ReLU-conv3x3-BN, 1x1     34,660
            conv + BN shortcut when the shape changes) x [3, 3, 4]
resnet12    the same, blocks x [1, 5, 6]                                          52,060
resnet18    the same, blocks x [6, 6, 6]                                          56,320
mlp         flatten, FC 128, ReLU, FC 64, ReLU, FC classes (paper's widths)      17,226
==========  ==================================================================  ==========

The ResNets have stage widths 5, 10, 20 (the paper's 16, 32, 64 scaled by 5/16) so that
their K keeps the paper's ratio to the LeNet (1.3x, 2.0x, 2.1x here; 1.5x, 2.2x, 2.4x in
the paper) and every convolution has a bias, as in the authors' code. Pools are skipped
once a feature map is 1x1; the ResNets end with a global average pool. Any other zoo
model name (``small_cnn``, ``lenet5``...) is a valid tier too.

vgg8 has a BatchNorm after every convolution; the paper's Table 18 has none. Decision
(measured): without it the 9-layer ReLU stack never leaves the constant predictor with
torch's default initialisation, whoever trains it. One device alone (k-classes, 3 classes,
4 rounds x 5 epochs, batch 16, SGD momentum 0.9; label-weighted test accuracy, chance 0.333):

==============================  ==========================  ==========================
vgg8 variant                    digits, lr 0.05 / 0.01      Fashion-MNIST, lr 0.05 / 0.01
==============================  ==========================  ==========================
paper (default init, no BN)     0.336 / 0.336              0.333 / 0.333
Kaiming-normal init, no BN      0.327 / 0.981              0.333 / 0.712
BatchNorm, default init (ours)  0.991 / 0.991              0.712 / 0.727
==============================  ==========================  ==========================

Kaiming initialisation needs lr 0.01 (at 0.05, the user's default then, it dies, and the paper-style
model diverged to NaN in a Local run on Fashion-MNIST), and it does nothing for a model a
hypernetwork generates (the generated weights' scale comes from the hypernetwork, not from
the device's initialiser). BatchNorm makes the convolutions' scale irrelevant, so it fixes
local training at both rates and generated models alike; like the ResNets' statistics, the
vgg8's running statistics stay on the device. Cost: 2 x 56 more parameters on 1-channel
input (K 36,214 -> 36,438 on digits, still tau 12).
"""

from __future__ import annotations

from collections.abc import Callable

from fedcore import modelspec
from fedcore.modelspec import Shape

from .cnn import conv, pool_if_possible, shape_after

RESNET_WIDTHS = (5, 10, 20)
RESNET_BLOCKS = {"resnet10": (3, 3, 4), "resnet12": (1, 5, 6), "resnet18": (6, 6, 6)}


def _classifier(input_shape: Shape, layers: list[dict], hidden: tuple[int, ...],
                num_classes: int) -> list[dict]:
    """flatten -> (linear -> ReLU) per hidden width -> linear to the classes."""
    n = shape_after(input_shape, [*layers, {"op": "flatten"}])[0]
    out: list[dict] = [{"op": "flatten"}]
    for width in hidden:
        out += [{"op": "linear", "in": n, "out": width}, {"op": "relu"}]
        n = width
    return [*out, {"op": "linear", "in": n, "out": num_classes}]


def lenet_cnn(input_shape: Shape, num_classes: int) -> dict:
    """The paper's "LeNet-style" CNN (Table 16)."""
    layers: list[dict] = []
    cin = input_shape[0]
    for cout in (16, 32):
        layers += [conv(cin, cout), {"op": "relu"}]
        layers += pool_if_possible(shape_after(input_shape, layers))
        cin = cout
    return modelspec.make(input_shape, num_classes,
                          layers + _classifier(input_shape, layers, (108, 64), num_classes))


def vgg8(input_shape: Shape, num_classes: int, channels: tuple[int, ...] = (8, 16, 32)) -> dict:
    """The paper's simplified VGG8 (Table 18): pairs of conv3x3-BatchNorm-ReLU, a pool after
    each pair. The BatchNorm is ours (see the module docstring: without it the model never trains)."""
    layers: list[dict] = []
    cin = input_shape[0]
    for cout in channels:
        for _ in range(2):
            layers += [conv(cin, cout), {"op": "batchnorm2d", "c": cout}, {"op": "relu"}]
            cin = cout
        layers += pool_if_possible(shape_after(input_shape, layers))
    return modelspec.make(input_shape, num_classes,
                          layers + _classifier(input_shape, layers, (180, 64), num_classes))


def _block(cin: int, cout: int, stride: int) -> list[dict]:
    body = [conv(cin, cout, stride=stride), {"op": "batchnorm2d", "c": cout}, {"op": "relu"},
            conv(cout, cout), {"op": "batchnorm2d", "c": cout}]
    shortcut = []
    if stride != 1 or cin != cout:
        shortcut = [conv(cin, cout, k=1, stride=stride, pad=0), {"op": "batchnorm2d", "c": cout}]
    return [{"op": "residual", "body": body, "shortcut": shortcut}, {"op": "relu"}]


def resnet(input_shape: Shape, num_classes: int, blocks: tuple[int, ...],
           widths: tuple[int, ...] = RESNET_WIDTHS) -> dict:
    """The paper's ResNets (Table 19): stem, stages of basic blocks (stride 2 from the
    second stage on, while the map is larger than 1x1), global average pool, linear."""
    layers = [conv(input_shape[0], widths[0]), {"op": "batchnorm2d", "c": widths[0]}, {"op": "relu"}]
    cin = widths[0]
    for stage, (count, cout) in enumerate(zip(blocks, widths, strict=True)):
        for b in range(count):
            size = shape_after(input_shape, layers)[1]
            layers += _block(cin, cout, 2 if stage > 0 and b == 0 and size > 1 else 1)
            cin = cout
    layers += [{"op": "gap"}, {"op": "flatten"}, {"op": "linear", "in": cin, "out": num_classes}]
    return modelspec.make(input_shape, num_classes, layers)


def mlp(input_shape: Shape, num_classes: int) -> dict:
    """The paper's MLP (Table 17): input -> 128 -> 64 -> classes."""
    return modelspec.make(input_shape, num_classes, _classifier(input_shape, [], (128, 64), num_classes))


def resnet10(input_shape: Shape, num_classes: int) -> dict:
    return resnet(input_shape, num_classes, RESNET_BLOCKS["resnet10"])


def resnet12(input_shape: Shape, num_classes: int) -> dict:
    return resnet(input_shape, num_classes, RESNET_BLOCKS["resnet12"])


def resnet18(input_shape: Shape, num_classes: int) -> dict:
    return resnet(input_shape, num_classes, RESNET_BLOCKS["resnet18"])


ARCHITECTURES: dict[str, Callable[..., dict]] = {
    "lenet": lenet_cnn, "vgg8": vgg8, "resnet10": resnet10, "resnet12": resnet12, "resnet18": resnet18,
    "mlp": mlp,
}
