"""``--model pkg.module:build`` or ``--model file.py[:build]``: a user's ``torch.nn.Module``,
traced with ``torch.fx`` into a torchspec/1 spec (``fedcore.modelspec``), so devices rebuild
it from JSON (they never run code they receive) and width methods (HeteroFL, FedRolex) cut it
like a zoo model.

``build`` is called as ``build(input_shape, num_classes)`` when it takes two arguments, else
``build()``. The graph may hold, in a chain: Conv2d (square kernel, one stride and padding,
no dilation), BatchNorm2d, ReLU, MaxPool2d / AvgPool2d (stride = kernel), AdaptiveAvgPool2d(1),
Flatten (or ``flatten`` / ``view`` / ``reshape`` to (N, -1)), Dropout, Linear, Identity and
residual adds (``a + b`` of two branches of one input). Anything else is a one-line error
naming the layer. The spec keeps the architecture, not the module's initial weights."""

from __future__ import annotations

import inspect
import operator

from fedcore import modelspec

from .load import load_user_function


class UnsupportedModel(ValueError):
    """A user model that torchspec/1 cannot express (the message names the layer or op)."""


SUPPORTED = ("Conv2d, BatchNorm2d, ReLU, MaxPool2d, AvgPool2d, AdaptiveAvgPool2d(1), Flatten, Dropout, "
             "Linear, Identity, residual add")


def build_user_module(ref: str, input_shape: tuple[int, ...] | None = None, num_classes: int | None = None):
    """The ``nn.Module`` ``ref``'s builder returns."""
    from torch import nn

    build = load_user_function(ref, "build", "--model")
    takes = len(inspect.signature(build).parameters)
    try:
        module = build(tuple(input_shape or ()), num_classes) if takes >= 2 else build()
    except Exception as exc:  # noqa: BLE001 - a failing builder is one line
        raise UnsupportedModel(f"--model {ref}: the builder failed: {type(exc).__name__}: {exc}") from None
    if not isinstance(module, nn.Module):
        raise UnsupportedModel(f"--model {ref}: the builder returned {type(module).__name__}, "
                               "not a torch.nn.Module")
    return module


def user_model_spec(ref: str, input_shape: tuple[int, ...], num_classes: int) -> dict:
    """The torchspec/1 spec of ``ref``'s model for this dataset; UnsupportedModel when it cannot be one."""
    layers = module_layers(build_user_module(ref, input_shape, num_classes), ref)
    try:
        return modelspec.make(input_shape, num_classes, layers)
    except modelspec.SpecError as exc:
        raise UnsupportedModel(f"--model {ref}: on input {tuple(input_shape)} with {num_classes} classes: "
                               f"{exc}") from None


def module_layers(module, ref: str) -> list[dict]:
    """torchspec/1 layers of ``module`` (shape-free: the spec's header comes from the dataset)."""
    import torch.fx

    try:
        graph = torch.fx.symbolic_trace(module).graph
    except Exception as exc:  # noqa: BLE001 - data-dependent control flow and such
        raise UnsupportedModel(f"--model {ref}: torch.fx cannot trace it "
                               f"({type(exc).__name__}: {exc})") from None
    nodes = [n for n in graph.nodes if not (n.op == "call_method" and n.target == "size")]
    inputs = [n for n in nodes if n.op == "placeholder"]
    outputs = [n for n in nodes if n.op == "output"]
    if len(inputs) != 1:
        raise UnsupportedModel(f"--model {ref}: forward must take one tensor, takes {len(inputs)}")
    converter = _Converter(module, ref)
    return converter.between(inputs[0], outputs[0].args[0])


class _Converter:
    def __init__(self, module, ref: str) -> None:
        self.modules = dict(module.named_modules())
        self.ref = ref

    def fail(self, node, what: str) -> UnsupportedModel:
        return UnsupportedModel(f"--model {self.ref}: {what} at {node.name!r} is not supported; torchspec/1 "
                                f"has {SUPPORTED}")

    def source(self, node):
        """The node a chain continues from: a layer's tensor input, or an add's fork."""
        if self.is_add(node):
            return self.fork(node)[0]
        tensors = [a for a in node.args if hasattr(a, "op")]
        if not tensors:
            raise self.fail(node, f"{node.op} {node.target}")
        return tensors[0]

    @staticmethod
    def is_add(node) -> bool:
        return node.op == "call_function" and node.target in (operator.add, operator.iadd) or \
            (node.op == "call_method" and node.target in ("add", "add_")) or \
            (node.op == "call_function" and getattr(node.target, "__name__", "") == "add")

    def ancestry(self, node) -> list:
        chain = [node]
        while chain[-1].op != "placeholder":
            chain.append(self.source(chain[-1]))
        return chain

    def fork(self, add) -> tuple:
        a, b = (arg for arg in add.args[:2])
        up_a = self.ancestry(a)
        seen = set(up_a)
        for node in self.ancestry(b):
            if node in seen:
                return node, a, b
        raise self.fail(add, "an add of two unrelated inputs")

    def between(self, start, end) -> list[dict]:
        """Layers from ``start`` (excluded) to ``end`` (included)."""
        chain = []
        node = end
        while node is not start:
            if node.op == "placeholder":
                raise self.fail(end, "a branch that does not come from its fork")
            chain.append(node)
            node = self.source(node)
        layers: list[dict] = []
        for node in reversed(chain):
            layers += self.layer(node)
        return layers

    def layer(self, node) -> list[dict]:
        if self.is_add(node):
            fork, a, b = self.fork(node)
            body, shortcut = self.between(fork, a), self.between(fork, b)
            if not body:
                body, shortcut = shortcut, body
            return [{"op": "residual", "body": body, "shortcut": shortcut}]
        if node.op == "call_module":
            return self.module_layer(node, self.modules[node.target])
        target = node.target
        name = target if isinstance(target, str) else getattr(target, "__name__", str(target))
        if name in ("relu", "relu_"):
            return [{"op": "relu"}]
        if name in ("flatten", "view", "reshape"):
            return [{"op": "flatten"}]
        if name == "dropout":
            return [{"op": "dropout", "p": float(node.kwargs.get("p", 0.5))}]
        raise self.fail(node, f"the operation {name}")

    def module_layer(self, node, m) -> list[dict]:
        from torch import nn

        kind = type(m).__name__
        if isinstance(m, nn.Conv2d):
            square = len(set(m.kernel_size)) == 1 and len(set(m.stride)) == 1 and \
                isinstance(m.padding, tuple) and len(set(m.padding)) == 1
            if not square or set(m.dilation) != {1} or m.padding_mode != "zeros":
                raise self.fail(node, "a Conv2d with a non-square kernel, stride or padding, or dilation")
            return [{"op": "conv2d", "in": m.in_channels, "out": m.out_channels, "k": m.kernel_size[0],
                     "stride": m.stride[0], "pad": m.padding[0], "bias": m.bias is not None,
                     "groups": m.groups}]
        if isinstance(m, nn.BatchNorm2d):
            return [{"op": "batchnorm2d", "c": m.num_features, "track": m.track_running_stats}]
        if isinstance(m, nn.ReLU):
            return [{"op": "relu"}]
        if isinstance(m, (nn.MaxPool2d, nn.AvgPool2d)):
            k, s = m.kernel_size, m.stride if m.stride is not None else m.kernel_size
            if not isinstance(k, int) or s != k or m.padding not in (0, (0, 0)):
                raise self.fail(node, f"a {kind} with padding, or a stride other than its square kernel")
            return [{"op": "maxpool2d" if isinstance(m, nn.MaxPool2d) else "avgpool2d", "k": k}]
        if isinstance(m, nn.AdaptiveAvgPool2d) and m.output_size in (1, (1, 1)):
            return [{"op": "gap"}]
        if isinstance(m, nn.Flatten):
            return [{"op": "flatten"}]
        if isinstance(m, nn.Dropout):
            return [{"op": "dropout", "p": float(m.p)}]
        if isinstance(m, nn.Linear):
            return [{"op": "linear", "in": m.in_features, "out": m.out_features, "bias": m.bias is not None}]
        if isinstance(m, nn.Identity):
            return []
        raise self.fail(node, f"the layer {kind} ({node.target})")
