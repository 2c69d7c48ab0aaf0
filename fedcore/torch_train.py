"""Training and evaluating a torchspec/1 model in torch, by a recipe (imports torch).

One definition of what a recipe means in torch: the device's torch runtime trains a task
with ``train_model``, and the server uses the same functions where it trains or evaluates
a model itself (central evaluation, FedConv's pre-training on server data, the edge's
projection stage). x is (N, C, H, W) float32, y (N,) integer labels.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from .recipe import Recipe, StepStats
from .torch_model import SpecModel

Progress = Callable[[float], None]  # fraction of the task done, 0..1


def batch_bounds(n: int, batch_size: int) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` covering ``n`` samples in batches of ``batch_size``. A lone
    trailing sample joins the batch before it (BatchNorm cannot train on a batch of one),
    so no sample is dropped."""
    bounds = [(s, min(s + batch_size, n)) for s in range(0, n, batch_size)]
    if len(bounds) > 1 and bounds[-1][1] - bounds[-1][0] == 1:
        bounds[-2:] = [(bounds[-2][0], n)]
    return bounds


def torch_optimizer(params: list, recipe: Recipe) -> torch.optim.Optimizer:
    """The recipe's optimiser (SGD with momentum, or Adam; weight decay) over ``params``."""
    if recipe.optimizer == "adam":
        return torch.optim.Adam(params, lr=recipe.lr, weight_decay=recipe.weight_decay)
    return torch.optim.SGD(params, lr=recipe.lr, momentum=recipe.momentum, weight_decay=recipe.weight_decay)


def add_proximal(params: list, start: list, mu: float) -> None:
    """FedProx: add mu * (w - w_start) to each parameter's gradient (``Recipe.prox_mu``);
    ``start`` = the parameters' values at the start of the step (nothing to do when empty)."""
    for param, anchor in zip(params, start, strict=False):
        if param.grad is not None:
            param.grad.add_(param.detach() - anchor, alpha=mu)


def loss_function(recipe: Recipe, extras: dict[str, np.ndarray] | None, n: int):
    """``loss(outputs, features, labels, extras) -> scalar``. Plain CE keeps torch's own
    cross-entropy; the distillation losses use the shared ``losses.Loss`` definition."""
    if recipe.loss == "ce":
        return lambda outputs, features, labels, extras: sum(F.cross_entropy(o, labels) for o in outputs)
    from .losses import Loss

    loss = Loss.from_dict(recipe.loss_dict())
    extras = extras or {}
    needed = [name for name, _ in loss.extra_inputs(1, 0)]
    if needed and needed[0] not in extras:
        raise ValueError(f"loss {recipe.loss!r} needs {needed[0]} (the task's teacher model)")
    bad = {k: v.shape for k, v in extras.items() if len(v) != n}
    if bad:
        raise ValueError(f"teacher arrays must have one row per sample ({n}): {bad}")

    def compute(outputs, features, labels, batch_extras):
        extras_used = dict(batch_extras)
        if not loss.uses_features(features.shape[1]):
            extras_used.pop("teacher_features", None)
        mask = torch.ones(len(labels))
        return loss(outputs, features, labels, mask, extras_used)

    return compute


def train_model(model: SpecModel, x: np.ndarray, y: np.ndarray, recipe: Recipe,
                progress: Progress | None = None, extras: dict[str, np.ndarray] | None = None) -> StepStats:
    """``recipe.epochs`` passes of mini-batch training of ``model`` in place, stopping after
    ``recipe.max_steps`` optimiser steps when that is > 0, with the recipe's loss (default:
    sum of CE over the outputs) and optimiser. Shuffling and dropout are drawn from
    ``recipe.seed``, so a task trains the same wherever it runs. ``extras``: per-sample
    teacher arrays the loss reads (``teacher_logits`` (N, K), ``teacher_features`` (N, F)).
    Returns the stats of the last epoch that ran (partial when cut short), samples = N."""
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch_optimizer(params, recipe)
    anchors = [p.detach().clone() for p in params] if recipe.prox_mu else []  # FedProx: w_start
    loss_fn = loss_function(recipe, extras, len(y))
    extra_t = {k: torch.from_numpy(np.ascontiguousarray(v, np.float32)) for k, v in (extras or {}).items()}
    xt, yt = torch.from_numpy(np.ascontiguousarray(x, np.float32)), torch.from_numpy(y.astype(np.int64))
    gen = torch.Generator().manual_seed(recipe.seed)
    n = len(yt)
    batches = batch_bounds(n, recipe.batch_size)
    plan = recipe.epoch_steps(len(batches))  # steps per epoch; the last epoch is reported
    total, last_epoch = sum(plan), len(plan) - 1
    total_loss = correct = seen = 0.0
    done = 0
    with torch.random.fork_rng():
        torch.manual_seed(recipe.seed)
        for epoch, steps in enumerate(plan):
            order = torch.randperm(n, generator=gen)
            for start, stop in batches[:steps]:
                idx = order[start:stop]
                outputs, features = model.forward_with_features(xt[idx])
                loss = loss_fn(outputs, features, yt[idx], {k: v[idx] for k, v in extra_t.items()})
                opt.zero_grad(set_to_none=True)
                loss.backward()
                add_proximal(params, anchors, recipe.prox_mu)
                opt.step()
                done += 1
                if epoch == last_epoch:  # report the last epoch
                    total_loss += float(loss.detach()) * len(idx)
                    correct += float((outputs[-1].argmax(1) == yt[idx]).sum())
                    seen += len(idx)
                if progress:
                    progress(done / total)
    return StepStats(n if seen else 0, total_loss / max(seen, 1), correct / max(seen, 1))


@torch.no_grad()
def predict_model(model: SpecModel, x: np.ndarray, batch_size: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """Eval-mode ``(logits (N, K), features (N, F))`` of the final output; features are the
    input of the model's last linear layer (see ``SpecModel.forward_with_features``)."""
    model.eval()
    xt = torch.from_numpy(np.ascontiguousarray(x, np.float32))
    logits, features = [], []
    for start in range(0, len(xt), batch_size):
        outputs, feats = model.forward_with_features(xt[start:start + batch_size])
        logits.append(outputs[-1].numpy())
        features.append(feats.reshape(len(feats), -1).numpy())
    if not logits:
        k = model.spec["num_classes"]
        return np.zeros((0, k), np.float32), np.zeros((0, 0), np.float32)
    return np.concatenate(logits), np.concatenate(features)


@torch.no_grad()
def evaluate_model(model: SpecModel, x: np.ndarray, y: np.ndarray, batch_size: int = 256) -> StepStats:
    """Eval-mode accuracy and mean cross-entropy of the final output on (x, y)."""
    model.eval()
    xt, yt = torch.from_numpy(np.ascontiguousarray(x, np.float32)), torch.from_numpy(y.astype(np.int64))
    total_loss = correct = 0.0
    for start in range(0, len(yt), batch_size):
        out = model(xt[start:start + batch_size])[-1]
        total_loss += float(F.cross_entropy(out, yt[start:start + batch_size], reduction="sum"))
        correct += float((out.argmax(1) == yt[start:start + batch_size]).sum())
    n = max(len(yt), 1)
    return StepStats(len(yt), total_loss / n, correct / n)
