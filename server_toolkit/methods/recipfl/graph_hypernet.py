"""RecipFL's graph hypernetwork (GHN): operator graph + client descriptor -> model weights.

For one client model (an ``OpGraph``), its current weights and its descriptor a (the
label distribution, K numbers summing to 1):

1. Node features. The node's op type, one-hot over ``OP_TYPES``, goes through a linear
   embedding; its current weights, pooled to at most 128 scalars (``pooled_weights``),
   go through a small Transformer encoder (one layer, 4 heads) and a mean over positions.
   The node state is the sum of the two embeddings (= a linear map of their concatenation).
   Each pooled sequence is divided by its RMS and the log-RMS rides along as a second input
   channel, so layers of any size give the encoder inputs of the same scale.
2. Gated GNN, ``steps`` times (τ, default 1): a forward traversal in topological order (a
   node's message is the sum of a shared MLP over the states of its inputs; a GRU cell
   updates the node with it), then a backward traversal (messages from successors, same
   MLP and GRU). Nodes at equal depth are updated together, which is the same as visiting
   them one by one. A LayerNorm follows.
3. One MLP decoder per parametric op type (conv, linear, bn) takes [node state, a] and
   outputs a fixed-size block: for conv/linear a weight block of the type's largest shape in
   the fleet (each dim capped at ``max_dim``) plus a bias vector; for bn gamma and beta.
   The block is sliced (or tiled, when the target is larger) to the exact tensor shape; a
   kernel smaller than the block's is taken from its centre.
4. Scaling (fan-in, as in GHN-2): weights x sqrt(gain / fan_in) with gain 2 when the layer
   feeds a ReLU (directly or through BN), else 1; biases and BN betas tanh(0.2 p); BN gammas
   2 sigmoid(0.5 p) (in (0, 2), 1 at p = 0). The decoders are initialised so their raw
   outputs have about unit variance: a fresh GHN gives about He-initialised weights.

``generate`` returns {state-dict name: tensor} for every learnable tensor of the model,
differentiable in the GHN's parameters (the server's VJP update needs that).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from .op_graph import OP_TYPES, PARAMETRIC, OpGraph

POOLED_SIZE = 128  # scalars the current weights of one operator are pooled to


def sinusoidal_positions(length: int, dim: int) -> torch.Tensor:
    """(length, dim) fixed sine/cosine position codes (dim even)."""
    position = torch.arange(length, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    codes = torch.zeros(length, dim)
    codes[:, 0::2] = torch.sin(position * freq)
    codes[:, 1::2] = torch.cos(position * freq)
    return codes


class WeightEncoder(nn.Module):
    """A node's pooled weights (variable length <= POOLED_SIZE) -> a ``dim`` vector."""

    def __init__(self, dim: int = 32, heads: int = 4, feedforward: int = 64) -> None:
        super().__init__()
        self.inp = nn.Linear(2, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, feedforward, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=1, enable_nested_tensor=False)
        self.register_buffer("positions", sinusoidal_positions(POOLED_SIZE, dim), persistent=False)

    def forward(self, sequences: list[torch.Tensor]) -> torch.Tensor:
        """``sequences``: 1-D tensors of 1..POOLED_SIZE scalars -> (len(sequences), dim)."""
        length = max(len(s) for s in sequences)
        values = torch.zeros(len(sequences), length)
        mask = torch.ones(len(sequences), length, dtype=torch.bool)  # True = padding
        log_rms = torch.zeros(len(sequences), 1)
        for i, seq in enumerate(sequences):
            rms = seq.pow(2).mean().sqrt().clamp_min(1e-8)
            values[i, :len(seq)] = seq / rms
            mask[i, :len(seq)] = False
            log_rms[i] = rms.log()
        x = torch.stack([values, log_rms.expand_as(values)], dim=-1)  # (n, length, 2)
        h = self.encoder(self.inp(x) + self.positions[:length], src_key_padding_mask=mask)
        keep = (~mask).unsqueeze(-1).float()
        return (h * keep).sum(1) / keep.sum(1)


class GatedGNN(nn.Module):
    """Gated graph propagation: per step a forward then a backward traversal."""

    def __init__(self, dim: int, steps: int = 1) -> None:
        super().__init__()
        self.steps = steps
        self.message = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, dim))
        self.gru = nn.GRUCell(dim, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, h: torch.Tensor, graph: OpGraph) -> torch.Tensor:
        """``h``: (nodes, dim) initial states -> (nodes, dim) final states."""
        forward_in = [list(node.inputs) for node in graph.nodes]
        backward_in = [list(s) for s in graph.successors]
        for _ in range(self.steps):
            h = self._traverse(h, graph.forward_levels, forward_in)
            h = self._traverse(h, graph.backward_levels, backward_in)
        return self.norm(h)

    def _traverse(self, h: torch.Tensor, levels, senders: list[list[int]]) -> torch.Tensor:
        for level in levels:
            receivers = [v for v in level if senders[v]]
            if not receivers:
                continue
            src = torch.tensor([u for v in receivers for u in senders[v]])
            dst = torch.tensor([k for k, v in enumerate(receivers) for _ in senders[v]])
            messages = torch.zeros(len(receivers), h.shape[1]).index_add(0, dst, self.message(h[src]))
            rows = torch.tensor(receivers)
            h = h.index_copy(0, rows, self.gru(messages, h[rows]))
        return h


def fit_to_shape(block: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """Slice (or tile, then slice) ``block`` to ``shape`` (same number of dims). Dims 2+
    (conv kernels) are cut around the centre."""
    out = block
    for dim, (have, want) in enumerate(zip(block.shape, shape, strict=True)):
        if want > have:
            out = out.repeat(*[math.ceil(want / have) if d == dim else 1 for d in range(out.dim())])
            have = out.shape[dim]
        start = (have - want) // 2 if dim >= 2 else 0
        out = out.narrow(dim, start, want)
    return out


class GraphHypernet(nn.Module):
    """Generates the weights of any model whose operators are in ``OP_TYPES``.

    ``graphs``: the fleet's architectures, which fix each decoder's block shape (the
    largest shape of its op type, every dim capped at ``max_dim``; larger layers are tiled).
    ``num_classes``: the length of the client descriptor.
    """

    def __init__(self, graphs: list[OpGraph], num_classes: int, hidden: int = 64, weight_dim: int = 32,
                 decoder_hidden: int = 128, steps: int = 1, max_dim: int = 256) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.op_embedding = nn.Linear(len(OP_TYPES), hidden)
        self.weight_encoder = WeightEncoder(weight_dim)
        self.weight_projection = nn.Linear(weight_dim, hidden)
        self.gnn = GatedGNN(hidden, steps)
        self.block_shapes = block_shapes(graphs, max_dim)
        self.decoders = nn.ModuleDict({
            op: nn.Sequential(nn.Linear(hidden + num_classes, decoder_hidden), nn.ReLU(),
                              nn.Linear(decoder_hidden, _block_size(op, shape)))
            for op, shape in self.block_shapes.items()})
        for decoder in self.decoders.values():  # raw outputs of about unit variance (see ``_tensors``)
            nn.init.kaiming_normal_(decoder[0].weight, nonlinearity="relu")
            nn.init.normal_(decoder[2].weight, std=decoder_hidden ** -0.5)
            nn.init.zeros_(decoder[0].bias)
            nn.init.zeros_(decoder[2].bias)

    def node_states(self, graph: OpGraph, pooled: list[torch.Tensor]) -> torch.Tensor:
        """(nodes, hidden) GNN states of ``graph`` given each node's pooled weights."""
        one_hot = torch.zeros(len(graph), len(OP_TYPES))
        one_hot[torch.arange(len(graph)), torch.tensor([OP_TYPES.index(n.op) for n in graph.nodes])] = 1.0
        h = self.op_embedding(one_hot)
        with_weights = [i for i, seq in enumerate(pooled) if len(seq)]
        if with_weights:
            encoded = self.weight_projection(self.weight_encoder([pooled[i] for i in with_weights]))
            h = h.index_add(0, torch.tensor(with_weights), encoded)
        return self.gnn(h, graph)

    def generate(self, graph: OpGraph, pooled: list[np.ndarray] | list[torch.Tensor],
                 descriptor: np.ndarray | torch.Tensor) -> dict[str, torch.Tensor]:
        """Every learnable tensor of ``graph``'s model, by state-dict name.

        ``pooled``: per node, its current weights pooled to <= 128 scalars (empty for nodes
        without weights); ``descriptor``: (K,) label distribution of the client.
        """
        pooled_t = [torch.as_tensor(np.asarray(p, np.float32)) for p in pooled]
        if len(pooled_t) != len(graph):
            raise ValueError(f"{len(pooled_t)} pooled weight vectors for a graph of {len(graph)} nodes")
        a = torch.as_tensor(np.asarray(descriptor, np.float32))
        if a.shape != (self.num_classes,):
            raise ValueError(f"descriptor has shape {tuple(a.shape)}, expected ({self.num_classes},)")
        states = self.node_states(graph, pooled_t)
        out: dict[str, torch.Tensor] = {}
        for op in PARAMETRIC:
            nodes = [i for i in graph.parametric() if graph.nodes[i].op == op]
            if not nodes:
                continue
            if op not in self.decoders:
                raise ValueError(f"this hypernetwork has no decoder for {op!r} layers")
            inputs = torch.cat([states[nodes], a.expand(len(nodes), -1)], dim=1)
            blocks = self.decoders[op](inputs)
            for row, i in enumerate(nodes):
                out.update(self._tensors(graph, i, blocks[row]))
        return out

    def _tensors(self, graph: OpGraph, index: int, raw: torch.Tensor) -> dict[str, torch.Tensor]:
        node = graph.nodes[index]
        block = self.block_shapes[node.op]
        (weight_name, weight_shape), *rest = node.params
        if node.op == "bn":
            channels = block[0]
            out = {weight_name: 2 * torch.sigmoid(0.5 * fit_to_shape(raw[:channels], weight_shape))}
            if rest:
                out[rest[0][0]] = torch.tanh(0.2 * fit_to_shape(raw[channels:], rest[0][1]))
            return out
        n_weight = int(np.prod(block))
        weight = fit_to_shape(raw[:n_weight].reshape(block), weight_shape)
        fan_in = int(np.prod(weight_shape[1:]))
        gain = 2.0 if graph.feeds_relu(index) else 1.0
        out = {weight_name: weight * math.sqrt(gain / fan_in)}
        if rest:
            out[rest[0][0]] = torch.tanh(0.2 * fit_to_shape(raw[n_weight:], rest[0][1]))
        return out

    def memory_bytes(self) -> int:
        """Bytes of the parameters (float32)."""
        return sum(p.numel() * p.element_size() for p in self.parameters())


def block_shapes(graphs: list[OpGraph], max_dim: int) -> dict[str, tuple[int, ...]]:
    """Per parametric op type, the largest weight shape over ``graphs`` (dims capped)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for graph in graphs:
        for i in graph.parametric():
            node = graph.nodes[i]
            shape = tuple(min(d, max_dim) for d in node.params[0][1])
            seen = shapes.get(node.op)
            if seen is not None and len(seen) != len(shape):
                raise ValueError(f"{node.op} weights of rank {len(seen)} and {len(shape)}")
            if seen is not None:
                shape = tuple(max(a, b) for a, b in zip(seen, shape, strict=True))
            shapes[node.op] = shape
    return shapes


def _block_size(op: str, shape: tuple[int, ...]) -> int:
    """Decoder outputs: bn -> gamma and beta; conv/linear -> weight block and a bias."""
    if op == "bn":
        return 2 * shape[0]
    return int(np.prod(shape)) + shape[0]
