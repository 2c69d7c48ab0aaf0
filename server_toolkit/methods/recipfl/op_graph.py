"""A client model as a graph of operators (RecipFL's view of an architecture).

The model a torchspec/1 spec describes is built and traced with ``torch.fx``; every traced
operator becomes one node, every tensor flowing from one operator to another one directed
edge. So a residual block gives an ``add`` node with two inputs (the body's last operator
and the shortcut's, or the block's input for an identity shortcut), and an early exit's
head hangs off the trunk. The graph also has one ``input`` node (the image) and one
``output`` node (the model's logits, exits and final).

Node types (``OP_TYPES``, fixed so one-hot codes never change): conv, linear, bn, relu,
maxpool, avgpool, gap, flatten, dropout, add, input, output. ``PARAMETRIC`` types own
learnable tensors; a node lists their names in the model's state dict and their shapes
(BatchNorm running statistics are buffers, not parameters: they are not part of a node).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from functools import cached_property

import numpy as np

OP_TYPES = ("input", "output", "conv", "linear", "bn", "relu", "maxpool", "avgpool", "gap", "flatten",
            "dropout", "add")
PARAMETRIC = ("conv", "linear", "bn")

_MODULE_TYPES = {"Conv2d": "conv", "Linear": "linear", "BatchNorm2d": "bn", "ReLU": "relu",
                 "MaxPool2d": "maxpool", "AvgPool2d": "avgpool", "AdaptiveAvgPool2d": "gap",
                 "Flatten": "flatten", "Dropout": "dropout"}
_FUNCTION_TYPES = {operator.add: "add"}


@dataclass(frozen=True)
class OpNode:
    """One operator: ``op`` (an ``OP_TYPES`` entry), the indices of the nodes feeding it,
    and its learnable tensors as (state-dict name, shape) pairs (weight first, then bias)."""

    name: str
    op: str
    inputs: tuple[int, ...]
    params: tuple[tuple[str, tuple[int, ...]], ...] = ()


@dataclass(frozen=True)
class OpGraph:
    """A DAG of operators; ``nodes`` are in topological order (inputs before users)."""

    nodes: tuple[OpNode, ...]

    def __len__(self) -> int:
        return len(self.nodes)

    @cached_property
    def edges(self) -> tuple[tuple[int, int], ...]:
        """(source, target) node indices, one per data-flow edge."""
        return tuple((u, v) for v, node in enumerate(self.nodes) for u in node.inputs)

    @cached_property
    def successors(self) -> tuple[tuple[int, ...], ...]:
        out: list[list[int]] = [[] for _ in self.nodes]
        for u, v in self.edges:
            out[u].append(v)
        return tuple(tuple(s) for s in out)

    @cached_property
    def forward_levels(self) -> tuple[tuple[int, ...], ...]:
        """Nodes grouped by longest distance from a source: every node's inputs sit in
        earlier groups, so a group can be updated at once in a forward traversal."""
        depth: list[int] = []
        for i, node in enumerate(self.nodes):
            if any(u >= i for u in node.inputs):
                raise ValueError("graph nodes are not in topological order")
            depth.append(1 + max((depth[u] for u in node.inputs), default=-1))
        return _group(depth)

    @cached_property
    def backward_levels(self) -> tuple[tuple[int, ...], ...]:
        """Nodes grouped by longest distance to a sink: every node's successors sit in
        earlier groups (for the reverse traversal)."""
        height = [0] * len(self.nodes)
        for i in reversed(range(len(self.nodes))):
            height[i] = 1 + max((height[s] for s in self.successors[i]), default=-1)
        return _group(height)

    def parametric(self) -> list[int]:
        """Indices of the nodes that own learnable tensors."""
        return [i for i, node in enumerate(self.nodes) if node.params]

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every learnable tensor of the model: name -> shape."""
        return {name: shape for node in self.nodes for name, shape in node.params}

    def feeds_relu(self, index: int) -> bool:
        """Whether the node's output reaches a ReLU directly or through BatchNorm only
        (the fan-in gain of its weights is then 2 instead of 1)."""
        for s in self.successors[index]:
            op = self.nodes[s].op
            if op == "relu" or (op == "bn" and self.feeds_relu(s)):
                return True
        return False


def _group(levels: list[int]) -> tuple[tuple[int, ...], ...]:
    groups: list[list[int]] = [[] for _ in range(max(levels, default=-1) + 1)]
    for i, level in enumerate(levels):
        groups[level].append(i)
    return tuple(tuple(g) for g in groups)


def extract_graph(spec: dict) -> OpGraph:
    """The operator graph of the model ``spec`` describes (traced with ``torch.fx``).

    ValueError for an operator the graph hypernetwork has no node type for.
    """
    import torch.fx

    from fedcore.torch_model import build_model

    traced = torch.fx.symbolic_trace(build_model(spec, seed=0))
    index: dict[torch.fx.Node, int] = {}
    nodes: list[OpNode] = []
    for fx_node in traced.graph.nodes:
        inputs = tuple(sorted({index[u] for u in fx_node.all_input_nodes}))
        params: tuple = ()
        if fx_node.op == "placeholder":
            op, name = "input", "input"
        elif fx_node.op == "output":
            op, name = "output", "output"
        elif fx_node.op == "call_module":
            module = traced.get_submodule(fx_node.target)
            op = _MODULE_TYPES.get(type(module).__name__)
            if op is None:
                raise ValueError(f"no graph node type for module {type(module).__name__} at {fx_node.target}")
            name = str(fx_node.target)
            params = tuple((f"{name}.{pname}", tuple(p.shape))
                           for pname, p in module.named_parameters(recurse=False))
        elif fx_node.op == "call_function" and fx_node.target in _FUNCTION_TYPES:
            op, name = _FUNCTION_TYPES[fx_node.target], fx_node.name
        else:
            raise ValueError(f"no graph node type for {fx_node.op} {fx_node.target!r}")
        index[fx_node] = len(nodes)
        nodes.append(OpNode(name, op, inputs, params))
    return OpGraph(tuple(nodes))


def pooled_weights(graph: OpGraph, weights: dict[str, np.ndarray], size: int = 128) -> list[np.ndarray]:
    """Each node's current learnable tensors, flattened (weight then bias) and mean-pooled
    into at most ``size`` consecutive chunks: float32 arrays of length min(numel, size),
    empty for a node without tensors. Pooling is linear, so the pooled mean of several
    models' weights is the mean of their pooled weights."""
    out = []
    for node in graph.nodes:
        if not node.params:
            out.append(np.zeros(0, np.float32))
            continue
        flat = np.concatenate([np.asarray(weights[name], np.float64).ravel() for name, _ in node.params])
        if len(flat) > size:
            flat = np.array([chunk.mean() for chunk in np.array_split(flat, size)])
        out.append(flat.astype(np.float32))
    return out
