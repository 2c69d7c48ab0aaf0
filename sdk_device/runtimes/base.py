"""The runtime interface: what the device agent needs from any training engine.

A runtime loads a *program* (a blob in one of its formats), takes weights as named numpy
arrays, trains on local numpy data following a ``Recipe``, evaluates, and hands the
weights back. The agent never sees which engine does the work, so ExecuTorch and ONNX
Runtime slot in by implementing this protocol and registering in ``runtimes.registry``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np

from fedcore.recipe import Recipe, StepStats

Progress = Callable[[float], None]  # called with the fraction done, 0..1

__all__ = ["Progress", "Runtime", "StepStats"]


class Runtime(Protocol):
    name: str
    formats: tuple[str, ...]  # program formats this runtime can execute, best first

    def load_program(self, program: bytes, fmt: str) -> None: ...

    def set_weights(self, weights: dict[str, np.ndarray]) -> None: ...

    def get_weights(self) -> dict[str, np.ndarray]: ...

    def train(self, x: np.ndarray, y: np.ndarray, recipe: Recipe,
              progress: Progress | None = None,
              extras: dict[str, np.ndarray] | None = None) -> StepStats:
        """``extras``: per-sample teacher arrays for distillation losses (recipe.loss != "ce")."""

    def evaluate(self, x: np.ndarray, y: np.ndarray, batch_size: int = 256) -> StepStats: ...

    def outputs(self, x: np.ndarray) -> list[np.ndarray]:
        """Eval-mode logits (N, K) float32 of every output of the model on ``x`` (N, C, H, W),
        exits in order then the final output (one array for a single-output model); what a
        device needs to score an ensemble of its exits (``sdk_device.holdout``)."""
