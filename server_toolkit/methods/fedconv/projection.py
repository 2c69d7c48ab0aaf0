"""FedConv's cross-cluster projection-layer stage (seed 001, §IV-B, Eq. 8), run at the edge.

For a linked pair of clusters (i, j), with F_i the last linear layer of cluster i's
aggregated model, x_i the "smashed data" of i's clients (the inputs of that layer) and
P_{j→i}, P_{i→j} two projection layers held by the edge::

    o_i = F_i(x_i) + λ · P_{j→i}(x_j)          loss = CE(o_i, y_i) + CE(o_j, y_j)
    o_j = F_j(x_j) + (1 − λ) · P_{i→j}(x_i)

Only the F's and P's train. Because the bodies are frozen in this stage, the smashed data
are constants: the devices upload them once (``sdk_device.protocol.smashed``) and the edge
runs the stage exactly, instead of exchanging activations and gradients every step.

Decisions where the paper is silent:

* **Which x_j goes with x_i.** The equation adds two clients' outputs sample by sample but
  does not say which samples meet. We pair each sample of i with a random sample of j of
  the same label (any sample of j when j has none of that label), so P_{j→i} learns to map
  j's view of a class onto i's logits of that class.
* **Pairs.** Clusters of one edge whose symmetric KLD (see ``clustering``) is below
  ``threshold`` × the median symmetric KLD between the edge's clients in the round: two
  clusters are linked when their heads are closer than a typical pair of clients. The
  paper pools the clusters of all edges; pairs here never cross edges (that would need
  edge-to-edge traffic).
* **λ** = 0.5 (no side favoured), **epochs** = 2, projection layers without bias,
  zero-initialised (the stage starts from the F's alone) and re-created every round.
  Optimiser, learning rate and batch size are the round's device recipe. An epoch is
  ⌈max(n_i, n_j) / batch⌉ steps of every pair; a cluster in several pairs sums their losses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedcore.recipe import Recipe

from .clustering import symmetric_kld


@dataclass
class Head:
    """One cluster's last linear layer and its smashed data: ``weight`` (K, F), ``bias``
    (K,) or None, ``x`` (n, F) float32 layer inputs, ``y`` (n,) int64 labels."""

    weight: np.ndarray
    bias: np.ndarray | None
    x: np.ndarray
    y: np.ndarray


@dataclass
class StageResult:
    """The tuned layers (cluster -> (weight, bias)) and the losses before and after:
    ``pair_loss`` = mean over pairs of the Eq. 8 loss on all their data (fixed partner
    draws), ``head_loss`` = mean CE of each paired F alone on its own smashed data."""

    heads: dict[int, tuple[np.ndarray, np.ndarray | None]]
    pair_loss_before: float
    pair_loss_after: float
    head_loss_before: float
    head_loss_after: float


def select_pairs(distributions: dict[int, np.ndarray], client_distributions: np.ndarray,
                 threshold: float = 1.0) -> list[tuple[int, int]]:
    """Cluster pairs (a < b) whose symmetric KLD is below ``threshold`` × the median
    symmetric KLD between the clients (rows of ``client_distributions``)."""
    ids = sorted(distributions)
    if len(ids) < 2 or len(client_distributions) < 2:
        return []
    between_clients = symmetric_kld(np.asarray(client_distributions))
    limit = threshold * float(np.median(between_clients[np.triu_indices(len(between_clients), 1)]))
    heads = symmetric_kld(np.array([distributions[i] for i in ids]))
    return [(ids[a], ids[b]) for a in range(len(ids)) for b in range(a + 1, len(ids))
            if heads[a, b] < limit]


def run_stage(heads: dict[int, Head], pairs: list[tuple[int, int]], recipe: Recipe,
              lam: float = 0.5, epochs: int = 2) -> StageResult:
    """Train the F's of the paired clusters and their projection layers (Eq. 8)."""
    import torch

    from fedcore.torch_train import torch_optimizer

    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lambda must be in [0, 1], got {lam}")
    torch.manual_seed(recipe.seed)
    rng = np.random.default_rng(recipe.seed)
    paired = sorted({c for pair in pairs for c in pair})
    layers = {c: _linear(heads[c]) for c in paired}
    projections = {(a, b): _projection(heads[a], heads[b]) for a, b in pairs}  # x_a -> logits of b
    projections.update({(b, a): _projection(heads[b], heads[a]) for a, b in pairs})
    data = {c: (torch.from_numpy(np.ascontiguousarray(heads[c].x, np.float32)),
                torch.from_numpy(heads[c].y.astype(np.int64))) for c in paired}
    by_label = {c: _indices_by_label(heads[c].y) for c in paired}

    def pair_loss(a: int, b: int, idx_a: np.ndarray, idx_b: np.ndarray, gen: np.random.Generator):
        (xa, ya), (xb, yb) = data[a], data[b]
        partner_b = _partners(ya[idx_a].numpy(), by_label[b], len(yb), gen)  # x_j for each x_i
        partner_a = _partners(yb[idx_b].numpy(), by_label[a], len(ya), gen)
        o_a = layers[a](xa[idx_a]) + lam * projections[(b, a)](xb[partner_b])
        o_b = layers[b](xb[idx_b]) + (1 - lam) * projections[(a, b)](xa[partner_a])
        ce = torch.nn.functional.cross_entropy
        return ce(o_a, ya[idx_a]) + ce(o_b, yb[idx_b])

    def evaluate() -> tuple[float, float]:
        with torch.no_grad():
            gen = np.random.default_rng(recipe.seed + 1)  # the same partner draws every time
            pl = [float(pair_loss(a, b, np.arange(len(data[a][1])), np.arange(len(data[b][1])), gen))
                  for a, b in pairs]
            hl = [float(torch.nn.functional.cross_entropy(layers[c](data[c][0]), data[c][1]))
                  for c in paired]
        return float(np.mean(pl)) if pl else 0.0, float(np.mean(hl)) if hl else 0.0

    pair_before, head_before = evaluate()
    params = [p for m in (*layers.values(), *projections.values()) for p in m.parameters()]
    if params:
        opt = torch_optimizer(params, recipe)
        for _ in range(epochs):
            orders = {c: rng.permutation(len(data[c][1])) for c in paired}
            steps = max(math.ceil(max(len(data[a][1]), len(data[b][1])) / recipe.batch_size)
                        for a, b in pairs)
            for step in range(steps):
                window = np.arange(step * recipe.batch_size, (step + 1) * recipe.batch_size)
                loss = sum(pair_loss(a, b, orders[a][window % len(orders[a])],
                                     orders[b][window % len(orders[b])], rng) for a, b in pairs)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
    pair_after, head_after = evaluate()
    tuned = {c: (_numpy(layers[c].weight), None if layers[c].bias is None else _numpy(layers[c].bias))
             for c in paired}
    return StageResult(tuned, pair_before, pair_after, head_before, head_after)


def _numpy(param) -> np.ndarray:
    return param.detach().numpy().astype(np.float32).copy()


def _linear(head: Head):
    import torch

    out_features, in_features = head.weight.shape
    layer = torch.nn.Linear(in_features, out_features, bias=head.bias is not None)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(np.asarray(head.weight, np.float32)))
        if head.bias is not None:
            layer.bias.copy_(torch.from_numpy(np.asarray(head.bias, np.float32)))
    return layer


def _projection(source: Head, target: Head):
    """P mapping ``source``'s layer inputs onto ``target``'s logits; zero at the start."""
    import torch

    layer = torch.nn.Linear(source.weight.shape[1], target.weight.shape[0], bias=False)
    torch.nn.init.zeros_(layer.weight)
    return layer


def _indices_by_label(y: np.ndarray) -> dict[int, np.ndarray]:
    return {int(label): np.flatnonzero(y == label) for label in np.unique(y)}


def _partners(labels: np.ndarray, pool: dict[int, np.ndarray], pool_size: int,
              gen: np.random.Generator) -> np.ndarray:
    """For each label, a random index of the partner cluster with that label (any if none)."""
    out = gen.integers(pool_size, size=len(labels))
    for label in np.unique(labels):
        same = pool.get(int(label))
        if same is not None and len(same):
            where = labels == label
            out[where] = same[gen.integers(len(same), size=int(where.sum()))]
    return out
