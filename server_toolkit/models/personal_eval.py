"""Server-side accuracy of a device's personal model, as honest as the server can make it.

The server holds a test set but not the device's data. ``label_weighted_accuracy`` scores
the model on the test set re-weighted to the device's label distribution p (from the
``label_counts`` the device reports): sum_c p(c) * (accuracy on the test samples of class
c), over the classes present in both. It is the expected accuracy on test data drawn like
the device's own labels.

BatchNorm. A personal model's running statistics stay on the device, so the server
re-estimates them: ``BN_SAMPLES`` test samples drawn (seeded, with replacement) with
probability proportional to p(label) / (test count of label), passed through the model
in training mode once (cumulative averages), then evaluation as usual. A proxy: the
device's statistics come from its training data, these from a resample of server data.
"""

from __future__ import annotations

import numpy as np
import torch

from fedcore.torch_model import build_model

from ..torch_utils import recalibrate_batchnorm
from .architectures import Architecture

BN_SAMPLES = 256
BN_BATCH = 64


def label_weights(y: np.ndarray, label_counts: list[int] | None) -> np.ndarray:
    """Per-test-sample weights (sum 1) making class c weigh p(c); uniform over samples
    when ``label_counts`` is None or shares no class with ``y``."""
    y = np.asarray(y, np.int64)
    if label_counts is not None:
        counts = np.zeros(max(int(y.max()) + 1, len(label_counts)))
        counts[: len(label_counts)] = label_counts
        test_counts = np.bincount(y, minlength=len(counts)).astype(float)
        present = (counts > 0) & (test_counts > 0)
        if present.any():
            p = np.where(present, counts, 0.0) / counts[present].sum()
            weights = p[y] / np.maximum(test_counts[y], 1)
            return weights / weights.sum()
    return np.full(len(y), 1.0 / len(y))


def label_weighted_accuracy(arch: Architecture, params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray,
                            label_counts: list[int] | None, seed: int = 0) -> float:
    """Accuracy of ``arch`` with ``params`` on (x, y) re-weighted to ``label_counts``
    (see the module docstring). ``params`` holds the generated tensors only."""
    weights = label_weights(y, label_counts)
    return float((weights * correct_samples(arch, params, x, y, weights, seed)).sum())


@torch.no_grad()
def correct_samples(arch: Architecture, params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray,
                    weights: np.ndarray | None = None, seed: int = 0) -> np.ndarray:
    """(N,) bool: which samples of (x, y) the model's final output gets right. A model with
    BatchNorm first has its statistics re-estimated on ``BN_SAMPLES`` samples drawn with
    probabilities ``weights`` (default uniform); a model without BatchNorm ignores them."""
    model = build_model(arch.spec, seed=0)
    model.load_state_dict({k: torch.from_numpy(np.asarray(v, np.float32)) for k, v in params.items()},
                          strict=False)
    xt = torch.from_numpy(np.ascontiguousarray(x, np.float32))
    if arch.buffers:
        p = np.full(len(y), 1.0 / len(y)) if weights is None else weights
        draw = np.random.default_rng(seed).choice(len(y), size=BN_SAMPLES, p=p)
        recalibrate_batchnorm(model, (xt[draw[s:s + BN_BATCH]] for s in range(0, BN_SAMPLES, BN_BATCH)))
    model.eval()
    return np.concatenate([(model(xt[s:s + 256])[-1].argmax(1).numpy() == y[s:s + 256])
                           for s in range(0, len(y), 256)])
