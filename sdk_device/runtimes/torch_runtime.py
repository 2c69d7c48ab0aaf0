"""Torch eager runtime: trains torchspec/1 programs with PyTorch (imports torch); the training
itself is ``fedcore.torch_train``, which the server shares."""

from __future__ import annotations

import numpy as np
import torch

from fedcore import modelspec
from fedcore.recipe import Recipe, StepStats
from fedcore.torch_model import SpecModel, build_model, load_numpy, state_numpy
from fedcore.torch_train import evaluate_model, predict_model, train_model

from .base import Progress


class TorchRuntime:
    """Runs the model a torchspec/1 program describes, in torch eager mode on the CPU."""

    name = "torch"
    formats = (modelspec.FORMAT,)

    def __init__(self, threads: int | None = None) -> None:
        if threads:
            torch.set_num_threads(threads)
        self.model: SpecModel | None = None
        # torch.optim imports torch._dynamo on first use (as long as importing torch: ~1 s CPU,
        # 10-20 s with ten processes starting on a loaded 2-core machine). Pay it here, when the
        # agent starts, not in the first task, whose deadline and straggler timing it distorted.
        torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.0)

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
        """``recipe.epochs`` passes of mini-batch training, at most ``recipe.max_steps`` steps
        (``fedcore.torch_train.train_model``).
        ``extras``: per-sample teacher arrays the loss reads."""
        return train_model(self._require_model(), x, y, recipe, progress, extras)

    def predict(self, x: np.ndarray, batch_size: int = 256) -> tuple[np.ndarray, np.ndarray]:
        """Eval-mode ``(logits (N, K), features (N, F))`` of the final output; features are
        the input of the model's last linear layer."""
        return predict_model(self._require_model(), x, batch_size)

    def evaluate(self, x: np.ndarray, y: np.ndarray, batch_size: int = 256) -> StepStats:
        return evaluate_model(self._require_model(), x, y, batch_size)

    @torch.no_grad()
    def outputs(self, x: np.ndarray, batch_size: int = 256) -> list[np.ndarray]:
        """Eval-mode logits (N, K) of every output, exits then final (``Runtime.outputs``)."""
        model = self._require_model()
        model.eval()
        xt = torch.from_numpy(np.ascontiguousarray(x, np.float32))
        parts = [[out.numpy() for out in model(xt[start:start + batch_size])]
                 for start in range(0, len(xt), batch_size)]
        if not parts:  # no rows: every output's (0, K)
            return [out.numpy() for out in model(xt[:0])]
        return [np.concatenate([part[i] for part in parts]) for i in range(len(parts[0]))]
