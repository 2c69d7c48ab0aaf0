"""Training modules that *generate* a model's weights (FedConv's compressors, dilators and
aggregation weights) on labelled server data.

The generated tensors are non-leaf results of the generator's graph; they enter the model
through ``torch.func.functional_call``, so the model's own parameters are never used or
changed and the loss back-propagates into the generator's parameters only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call

from fedcore.torch_model import build_model
from fedcore.torch_train import batch_bounds


@dataclass(frozen=True)
class Schedule:
    """``epochs`` passes over the data in batches of ``batch_size``; Adam at a cosine
    learning rate between ``lr_max`` and ``lr_min`` with period ``2 * t_max`` epochs
    (``cosine=False``: ``lr_max`` throughout)."""

    epochs: int = 20
    lr_max: float = 1e-3
    lr_min: float = 1e-5
    t_max: int = 4
    cosine: bool = True
    batch_size: int = 16

    def lr(self, epoch: int) -> float:
        """The learning rate of epoch ``epoch`` (0-based): ``lr_min + (lr_max - lr_min) *
        (1 + cos(pi * epoch / t_max)) / 2``."""
        if not self.cosine:
            return self.lr_max
        return self.lr_min + 0.5 * (self.lr_max - self.lr_min) * (1 + math.cos(math.pi * epoch / self.t_max))


def train_generated(generate: Callable[[], dict[str, torch.Tensor]], params: Iterable[torch.nn.Parameter],
                    spec: dict, x: np.ndarray, y: np.ndarray, schedule: Schedule, seed: int = 0,
                    penalty: Callable[[], torch.Tensor] | None = None) -> dict:
    """Train ``params`` so that the model ``spec`` with the tensors ``generate()`` returns
    classifies (x, y) well: loss = cross-entropy summed over the model's outputs (as the
    device runtime trains) + ``penalty()`` if given. Returns the last epoch's mean loss and
    accuracy (``{"loss", "accuracy"}``)."""
    model = build_model(spec)
    model.train()
    xt, yt = torch.from_numpy(np.ascontiguousarray(x, np.float32)), torch.from_numpy(np.asarray(y, np.int64))
    # foreach: one kernel per op over all the (many small) tensors; the same update as torch's
    # CPU default, a loop over tensors (1.3 -> 0.9 ms a compressor step on small_cnn)
    optimizer = torch.optim.Adam(list(params), lr=schedule.lr_max, foreach=True)
    order_gen = torch.Generator().manual_seed(seed)
    batches = batch_bounds(len(yt), schedule.batch_size)
    stats = {"loss": float("nan"), "accuracy": float("nan")}
    for epoch in range(schedule.epochs):
        for group in optimizer.param_groups:
            group["lr"] = schedule.lr(epoch)
        order = torch.randperm(len(yt), generator=order_gen)
        total_loss = correct = 0.0
        for start, stop in batches:
            idx = order[start:stop]
            outputs = functional_call(model, generate(), (xt[idx],))
            loss = sum(F.cross_entropy(out, yt[idx]) for out in outputs)
            if penalty is not None:
                loss = loss + penalty()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if epoch == schedule.epochs - 1:  # only the last epoch's figures are returned
                total_loss += float(loss.detach()) * len(idx)
                correct += float((outputs[-1].detach().argmax(1) == yt[idx]).sum())
    if schedule.epochs:
        stats = {"loss": total_loss / len(yt), "accuracy": correct / len(yt)}
    return stats
