"""Torch eager runtime: trains torchspec/1 programs with PyTorch (imports torch)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ..protocol import modelspec
from .base import Progress, StepStats
from .recipe import Recipe
from .torch_model import SpecModel, build_model, load_numpy, state_numpy


def batch_bounds(n: int, batch_size: int) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` covering ``n`` samples in batches of ``batch_size``. A lone
    trailing sample joins the batch before it (BatchNorm cannot train on a batch of one),
    so no sample is dropped."""
    bounds = [(s, min(s + batch_size, n)) for s in range(0, n, batch_size)]
    if len(bounds) > 1 and bounds[-1][1] - bounds[-1][0] == 1:
        bounds[-2:] = [(bounds[-2][0], n)]
    return bounds


def _loss_function(recipe: Recipe, extras: dict[str, np.ndarray] | None, n: int):
    """``loss(outputs, features, labels, extras) -> scalar``. Plain CE keeps torch's own
    cross-entropy; the distillation losses use the shared ``losses.Loss`` definition."""
    if recipe.loss == "ce":
        return lambda outputs, features, labels, extras: sum(F.cross_entropy(o, labels) for o in outputs)
    from .losses import Loss

    loss = Loss.from_dict(recipe.loss_dict())
    extras = extras or {}
    if "teacher_logits" not in extras:
        raise ValueError(f"loss {recipe.loss!r} needs teacher_logits (the task's teacher model)")
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


def torch_optimizer(params: list, recipe: Recipe) -> torch.optim.Optimizer:
    """The recipe's optimiser (SGD with momentum, or Adam; weight decay) over ``params``."""
    if recipe.optimizer == "adam":
        return torch.optim.Adam(params, lr=recipe.lr, weight_decay=recipe.weight_decay)
    return torch.optim.SGD(params, lr=recipe.lr, momentum=recipe.momentum, weight_decay=recipe.weight_decay)


class TorchRuntime:
    """Runs the model a torchspec/1 program describes, in torch eager mode on the CPU."""

    name = "torch"
    formats = (modelspec.FORMAT,)

    def __init__(self, threads: int | None = None) -> None:
        if threads:
            torch.set_num_threads(threads)
        self.model: SpecModel | None = None

    def load_program(self, program: bytes, fmt: str) -> None:
        if fmt not in self.formats:
            raise ValueError(f"torch runtime cannot run {fmt!r} programs")
        self.model = build_model(modelspec.loads(program))

    def _require_model(self) -> SpecModel:
        if self.model is None:
            raise RuntimeError("load_program() first")
        return self.model

    def set_weights(self, weights: dict[str, np.ndarray]) -> None:
        load_numpy(self._require_model(), weights)

    def get_weights(self) -> dict[str, np.ndarray]:
        return state_numpy(self._require_model())

    def train(self, x: np.ndarray, y: np.ndarray, recipe: Recipe,
              progress: Progress | None = None, extras: dict[str, np.ndarray] | None = None) -> StepStats:
        """``recipe.epochs`` passes of mini-batch training with ``recipe``'s loss (default: sum of
        CE over outputs). ``extras``: per-sample teacher arrays the loss reads,
        ``{"teacher_logits": (N, K), "teacher_features": (N, F)}``."""
        model = self._require_model()
        model.train()
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch_optimizer(params, recipe)
        loss_fn = _loss_function(recipe, extras, len(y))
        extra_t = {k: torch.from_numpy(np.ascontiguousarray(v, np.float32))
                   for k, v in (extras or {}).items()}
        xt, yt = torch.from_numpy(np.ascontiguousarray(x, np.float32)), torch.from_numpy(y.astype(np.int64))
        gen = torch.Generator().manual_seed(recipe.seed)
        with torch.random.fork_rng():  # dropout draws from the global generator: seed it too, so a
            torch.manual_seed(recipe.seed)  # task trains the same wherever it runs
            return self._epochs(model, opt, loss_fn, xt, yt, extra_t, recipe, gen, progress)

    def _epochs(self, model, opt, loss_fn, xt, yt, extra_t, recipe: Recipe, gen, progress) -> StepStats:
        n = len(yt)
        batches = batch_bounds(n, recipe.batch_size)
        steps_per_epoch = len(batches)
        total_loss = correct = seen = 0.0
        for epoch in range(recipe.epochs):
            order = torch.randperm(n, generator=gen)
            for step, (start, stop) in enumerate(batches):
                idx = order[start:stop]
                outputs, features = model.forward_with_features(xt[idx])
                loss = loss_fn(outputs, features, yt[idx], {k: v[idx] for k, v in extra_t.items()})
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                if epoch == recipe.epochs - 1:  # report the last epoch
                    total_loss += float(loss.detach()) * len(idx)
                    correct += float((outputs[-1].argmax(1) == yt[idx]).sum())
                    seen += len(idx)
                if progress:
                    progress((epoch * steps_per_epoch + step + 1) / (recipe.epochs * steps_per_epoch))
        return StepStats(int(seen), total_loss / max(seen, 1), correct / max(seen, 1))

    @torch.no_grad()
    def predict(self, x: np.ndarray, batch_size: int = 256) -> tuple[np.ndarray, np.ndarray]:
        """Eval-mode ``(logits (N, K), features (N, F))`` of the final output; features are
        the input of the model's last linear layer (see ``SpecModel.forward_with_features``)."""
        model = self._require_model()
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
    def evaluate(self, x: np.ndarray, y: np.ndarray, batch_size: int = 256) -> StepStats:
        model = self._require_model()
        model.eval()
        xt, yt = torch.from_numpy(np.ascontiguousarray(x, np.float32)), torch.from_numpy(y.astype(np.int64))
        total_loss = correct = 0.0
        for start in range(0, len(yt), batch_size):
            out = model(xt[start:start + batch_size])[-1]
            total_loss += float(F.cross_entropy(out, yt[start:start + batch_size], reduction="sum"))
            correct += float((out.argmax(1) == yt[start:start + batch_size]).sum())
        n = max(len(yt), 1)
        return StepStats(len(yt), total_loss / n, correct / n)
