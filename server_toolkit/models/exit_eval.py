"""Accuracy of a multi-exit model at each of its exits (one forward pass per batch)."""

from __future__ import annotations

import numpy as np
import torch

from fedcore.torch_model import build_model, load_numpy


@torch.no_grad()
def exit_accuracies(spec: dict, weights: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray,
                    batch_size: int = 256) -> list[float]:
    """Top-1 accuracy of every output of ``spec`` (exits in order, then the final one) on
    ``x`` (N, C, H, W) float32 and ``y`` (N,) labels; eval mode (dropout off, BN running stats)."""
    model = build_model(spec)
    load_numpy(model, weights)
    model.eval()
    correct: np.ndarray | None = None
    for start in range(0, len(y), batch_size):
        xb = torch.from_numpy(np.ascontiguousarray(x[start:start + batch_size], np.float32))
        yb = torch.from_numpy(np.asarray(y[start:start + batch_size], np.int64))
        hits = np.array([float((out.argmax(1) == yb).sum()) for out in model(xb)])
        correct = hits if correct is None else correct + hits
    if correct is None:
        return []
    return (correct / len(y)).tolist()


@torch.no_grad()
def ensemble_model_accuracy(model: torch.nn.Module, x: np.ndarray, y: np.ndarray,
                            batch_size: int = 256) -> float:
    """Top-1 accuracy on ``x`` (N, C, H, W), ``y`` (N,) of the mean of the softmax of every
    output of ``model`` (DepthFL's ensemble inference); eval mode. One output: that output."""
    model.eval()
    correct = 0.0
    for start in range(0, len(y), batch_size):
        xb = torch.from_numpy(np.ascontiguousarray(x[start:start + batch_size], np.float32))
        yb = torch.from_numpy(np.asarray(y[start:start + batch_size], np.int64))
        probs = torch.stack([torch.softmax(out, dim=1) for out in model(xb)]).mean(dim=0)
        correct += float((probs.argmax(1) == yb).sum())
    return correct / max(len(y), 1)


def ensemble_accuracy(spec: dict, weights: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> float:
    """``ensemble_model_accuracy`` of ``spec`` with ``weights`` (all its tensors)."""
    model = build_model(spec)
    load_numpy(model, weights)
    return ensemble_model_accuracy(model, x, y)


def deepest_exit_accuracy(spec: dict, weights: dict[str, np.ndarray],
                          clients: list[tuple[int, np.ndarray, np.ndarray]]) -> float:
    """Mean over clients of the accuracy at each client's deepest exit: ``clients`` holds
    (exits the client trains, its local test x, y); exit ``t`` is output ``t`` of ``spec``."""
    scores = [exit_accuracies(spec, weights, x, y)[tier - 1] for tier, x, y in clients if len(y)]
    return float(np.mean(scores)) if scores else float("nan")
