"""Learned weighted aggregation (FedConv, seed 001): per-layer weights over full-size models.

Given n full-size models w_j (FedConv: the dilated client models) with sample counts s_j,
each tensor ("layer") l of each model is min-max normalised to [0, 1]: n_{j,l} =
(w_{j,l} − lo_{j,l}) / (hi_{j,l} − lo_{j,l}). A learned scalar v_{j,l} per model and layer
weighs them:

    N_l = Σ_j v_{j,l} s_j n_{j,l} / Σ_j s_j,      W_l = N_l · span_l + lo_l

where span_l and lo_l are the sample-weighted means of the models' (hi − lo) and lo: the
normalisation undone with the models' average scale. The v are trained on server data with

    loss = CE(model with W) + λ Σ_j KLD_j,   KLD_j = Σ_l KL(softmax(ĝ_l) ‖ softmax(v_{j,l} n_{j,l}))

(ĝ_l: the previous global tensor, min-max normalised; softmax over all entries of the
tensor), λ = 0.2, Adam lr 1e-3, 10 epochs.

Decisions where the paper is silent: v starts at 1 (the untrained result is then the
sample-weighted average in normalised space; with equal scales, exactly FedAvg) and starts
afresh every round; the KLD compares the *weighted* normalised layer (v_{j,l} n_{j,l}), the
only form in which it depends on v; a constant tensor (hi = lo) normalises to zeros.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..models.train_generated import Schedule, train_generated

Weights = dict[str, np.ndarray]


def min_max(t: torch.Tensor) -> tuple[torch.Tensor, float, float]:
    """(t scaled to [0, 1], lo, hi - lo); a constant tensor gives zeros."""
    lo, hi = float(t.min()), float(t.max())
    span = hi - lo
    return ((t - lo) / span if span > 0 else torch.zeros_like(t)), lo, span


class LayerWeights(nn.Module):
    """The learned v (models × layers) and the normalised models it weighs."""

    def __init__(self, previous: Weights, models: list[Weights], samples: list[float]) -> None:
        super().__init__()
        if not models or len(models) != len(samples) or sum(samples) <= 0:
            raise ValueError("need at least one model and positive sample counts, one per model")
        self.names = sorted(previous)
        share = torch.tensor(samples, dtype=torch.float32) / float(sum(samples))
        self.v = nn.Parameter(torch.ones(len(models), len(self.names)))
        self.normalised: dict[str, torch.Tensor] = {}  # name -> (models, *shape), each in [0, 1]
        self.scaled: dict[str, torch.Tensor] = {}  # name -> s_j / S · n_j (the constant part of N_l)
        self.lo: dict[str, float] = {}
        self.span: dict[str, float] = {}
        self.target: dict[str, torch.Tensor] = {}  # name -> softmax of the normalised previous global
        for name in self.names:
            parts = [min_max(torch.from_numpy(np.asarray(m[name], np.float32))) for m in models]
            stacked = torch.stack([p[0] for p in parts])
            self.normalised[name] = stacked
            self.scaled[name] = stacked * share.view(-1, *([1] * (stacked.dim() - 1)))
            self.lo[name] = float(sum(float(w) * p[1] for w, p in zip(share, parts, strict=True)))
            self.span[name] = float(sum(float(w) * p[2] for w, p in zip(share, parts, strict=True)))
            global_norm = min_max(torch.from_numpy(np.asarray(previous[name], np.float32)))[0]
            self.target[name] = F.softmax(global_norm.flatten(), dim=0)

    def forward(self) -> dict[str, torch.Tensor]:
        """The aggregated tensors W_l (de-normalised)."""
        out = {}
        for col, name in enumerate(self.names):
            weights = self.v[:, col].view(-1, *([1] * (self.scaled[name].dim() - 1)))
            out[name] = (weights * self.scaled[name]).sum(0) * self.span[name] + self.lo[name]
        return out

    def kld(self) -> torch.Tensor:
        """Σ_j Σ_l KL(softmax(previous global layer) ‖ softmax(v_{j,l} n_{j,l}))."""
        total = torch.zeros(())
        for col, name in enumerate(self.names):
            flat = self.normalised[name].flatten(1) * self.v[:, col:col + 1]
            log_q = F.log_softmax(flat, dim=1)
            target = self.target[name].expand_as(log_q)
            total = total + F.kl_div(log_q, target, reduction="sum")
        return total


def learned_aggregate(global_spec: dict, previous: Weights, models: list[Weights], samples: list[float],
                      x: np.ndarray, y: np.ndarray, epochs: int = 10, lr: float = 1e-3,
                      kld_weight: float = 0.2, batch_size: int = 16, seed: int = 0) -> tuple[Weights, dict]:
    """(the aggregated weights of ``global_spec``, {"v_min", "v_max", "loss"}): ``models``
    (full-size, same tensors as ``previous``) weighed by learned per-layer weights trained
    ``epochs`` epochs on (x, y); ``epochs=0`` keeps v = 1."""
    weights = LayerWeights(previous, models, samples)
    stats = {}
    if epochs > 0:
        schedule = Schedule(epochs=epochs, lr_max=lr, cosine=False, batch_size=batch_size)
        stats = train_generated(weights, weights.parameters(), global_spec, x, y, schedule, seed,
                                penalty=lambda: kld_weight * weights.kld())
    with torch.no_grad():
        out = {k: v.numpy().astype(np.float32, copy=True) for k, v in weights().items()}
    v = weights.v.detach()
    return out, {"v_min": float(v.min()), "v_max": float(v.max()), "loss": stats.get("loss")}
