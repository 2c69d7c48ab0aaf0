"""HypeMeFed's hypernetworks: map one conv weight to another (seed 000, Sec. 4.3).

Low-rank (LRF) hypernetwork:

1. A conv weight ``W`` (OC, IC, K, K) is viewed as the matrix ``M`` (IC*K, OC*K) with
   ``M[(ic, kh), (oc, kw)] = W[oc, ic, kh, kw]`` (the paper's IC*KS x OC*KS).
2. ``M = U S V^T`` (SVD); the top ``k`` components give ``A = U_k sqrt(S_k)`` (IC*K, k) and
   ``B = sqrt(S_k) V_k^T`` (k, OC*K), so ``M ~= A B``.
3. Two MLPs (Linear -> ReLU -> Linear, hidden 512) are applied row-wise: to each of the
   ``k`` columns of ``A`` (length IC_s*K_s -> IC_t*K_t) and each of the ``k`` rows of ``B``
   (OC_s*K_s -> OC_t*K_t). Their size does not depend on ``k``.
4. Generated target matrix = ``A' B'`` = ``sum_i a'_i b'_i^T`` (IC_t*K_t, OC_t*K_t),
   reshaped back to (OC_t, IC_t, K_t, K_t). Loss: MSE to the real target weight.

Naive hypernetwork (for the cost comparison): one MLP from the flattened source weight to
the flattened target weight (Linear -> ReLU -> Linear, same hidden width).

Decisions where the paper is silent:

* SVD signs are made canonical (each left singular vector's largest-magnitude entry is
  positive, the right one flips with it): otherwise the same weight could reach the MLPs
  with arbitrary signs, which a ReLU MLP does not treat alike.
* ``k`` larger than the matrix rank is clipped to the rank; ``None`` = all components.
* Training ("single-batch", 25 epochs, Adam 5e-4): one optimiser step per training pair,
  pairs in a seeded shuffled order each epoch; the Adam state is new every round (the
  network's weights carry over: warm start).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

Shape = tuple[int, ...]


def conv_to_matrix(weight: torch.Tensor) -> torch.Tensor:
    """(OC, IC, K, K) -> (IC*K, OC*K) with rows (ic, kh) and columns (oc, kw)."""
    oc, ic, kh, kw = weight.shape
    return weight.permute(1, 2, 0, 3).reshape(ic * kh, oc * kw)


def matrix_to_conv(matrix: torch.Tensor, shape: Shape) -> torch.Tensor:
    """Inverse of ``conv_to_matrix`` for a conv weight of ``shape`` (OC, IC, K, K)."""
    oc, ic, kh, kw = shape
    return matrix.reshape(ic, kh, oc, kw).permute(2, 0, 1, 3).contiguous()


def low_rank_factors(weight: torch.Tensor, rank: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``rank`` SVD factors of a conv weight: ``A`` (IC*K, r), ``B`` (r, OC*K), with
    ``A @ B`` the best rank-r approximation of ``conv_to_matrix(weight)`` (r = min(rank, full))."""
    matrix = conv_to_matrix(weight.detach().to(torch.float32))
    u, s, vh = torch.linalg.svd(matrix, full_matrices=False)
    r = len(s) if rank is None else min(rank, len(s))
    u, s, vh = u[:, :r], s[:r], vh[:r]
    biggest = u.abs().argmax(dim=0)
    signs = torch.sign(u[biggest, torch.arange(r)])
    signs[signs == 0] = 1.0
    root = s.sqrt() * signs  # the sign flips both factors, so A @ B is unchanged
    return u * root, root[:, None] * vh


def _mlp(d_in: int, hidden: int, d_out: int, zero_output: bool = False) -> nn.Sequential:
    mlp = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, d_out))
    if zero_output:  # generates zeros until trained (a residual hypernetwork starts at "no correction")
        nn.init.zeros_(mlp[2].weight)
        nn.init.zeros_(mlp[2].bias)
    return mlp


class LowRankHypernet(nn.Module):
    """LRF hypernetwork from a conv of ``source_shape`` to a conv of ``target_shape``."""

    kind = "lrf"

    def __init__(self, source_shape: Shape, target_shape: Shape, rank: int | None = 100,
                 hidden: int = 512, zero_output: bool = False) -> None:
        super().__init__()
        self.source_shape, self.target_shape, self.rank = tuple(source_shape), tuple(target_shape), rank
        s_oc, s_ic, s_k, _ = self.source_shape
        t_oc, t_ic, t_k, _ = self.target_shape
        self.left = _mlp(s_ic * s_k, hidden, t_ic * t_k, zero_output)    # columns of A
        self.right = _mlp(s_oc * s_k, hidden, t_oc * t_k)   # rows of B

    def encode(self, source: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The network input for one source weight: its SVD factors (``A^T``, ``B``), (r, .)."""
        a, b = low_rank_factors(source, self.rank)
        return a.T.contiguous(), b.contiguous()

    def forward(self, a_rows: torch.Tensor, b_rows: torch.Tensor) -> torch.Tensor:
        """Generated target conv weight (OC_t, IC_t, K_t, K_t) from (r, IC_s*K_s), (r, OC_s*K_s)."""
        matrix = self.left(a_rows).T @ self.right(b_rows)
        return matrix_to_conv(matrix, self.target_shape)


class NaiveHypernet(nn.Module):
    """Full-weight hypernetwork: flattened source conv -> MLP -> flattened target conv."""

    kind = "naive"

    def __init__(self, source_shape: Shape, target_shape: Shape, hidden: int = 512,
                 zero_output: bool = False) -> None:
        super().__init__()
        self.source_shape, self.target_shape = tuple(source_shape), tuple(target_shape)
        self.net = _mlp(int(np.prod(source_shape)), hidden, int(np.prod(target_shape)), zero_output)

    def encode(self, source: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (source.detach().to(torch.float32).reshape(-1),)

    def forward(self, flat_source: torch.Tensor) -> torch.Tensor:
        return self.net(flat_source).reshape(self.target_shape)


Hypernet = LowRankHypernet | NaiveHypernet


def make_hypernet(kind: str, source_shape: Shape, target_shape: Shape, rank: int | None = 100,
                  hidden: int = 512, zero_output: bool = False) -> Hypernet:
    """``kind`` "lrf" or "naive"; ``rank`` None = all singular values (LRF only);
    ``zero_output``: the network generates zeros until trained."""
    if kind == "lrf":
        return LowRankHypernet(source_shape, target_shape, rank, hidden, zero_output)
    if kind == "naive":
        return NaiveHypernet(source_shape, target_shape, hidden, zero_output)
    raise ValueError(f"hypernetwork kind must be 'lrf' or 'naive', got {kind!r}")


def fit(net: Hypernet, pairs: list[tuple[torch.Tensor, torch.Tensor]], epochs: int = 25, lr: float = 5e-4,
        seed: int = 0) -> list[float]:
    """Train ``net`` on (source weight, target weight) pairs: one Adam step per pair, pairs
    shuffled each epoch. Returns the mean MSE of each epoch (computed during the epoch)."""
    if not pairs:
        return []
    inputs = [net.encode(source) for source, _ in pairs]
    targets = [target.detach().to(torch.float32) for _, target in pairs]
    params = list(net.parameters())
    optimizer = torch.optim.Adam(params, lr=lr)
    order_rng = torch.Generator().manual_seed(seed)
    history = []
    net.train()
    for _ in range(epochs):
        total = 0.0
        for i in torch.randperm(len(pairs), generator=order_rng).tolist():
            loss = torch.mean((net(*inputs[i]) - targets[i]) ** 2)
            for p, g in zip(params, torch.autograd.grad(loss, params), strict=True):
                p.grad = g
            optimizer.step()
            total += float(loss.detach())
        history.append(total / len(pairs))
    net.zero_grad(set_to_none=True)  # do not keep a gradient-sized copy between rounds
    return history


@torch.no_grad()
def generate(net: Hypernet, source: torch.Tensor) -> torch.Tensor:
    """The target conv weight ``net`` generates from one source conv weight."""
    net.eval()
    return net(*net.encode(source))


@torch.no_grad()
def mse(net: Hypernet, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """Mean MSE of ``net``'s generated weights over (source, target) pairs."""
    errors = [float(torch.mean((generate(net, s) - t.to(torch.float32)) ** 2)) for s, t in pairs]
    return float(np.mean(errors))
