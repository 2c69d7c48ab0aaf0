"""Small torch helpers shared by the server's learned modules (hypernetworks, FedConv's convs)."""

from __future__ import annotations

import base64
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import numpy as np
import torch


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """Run the enclosed torch work in a single intra-op thread. The server's learned modules
    are small; on a busy 2-core server two threads made them 5-10x slower, not faster."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def recalibrate_batchnorm(model: torch.nn.Module, batches: Iterable[torch.Tensor]) -> None:
    """Re-estimate the running statistics of ``model``'s BatchNorm layers from ``batches``
    (inputs, (B, ...) float32): reset, then cumulative averages over forward passes in
    training mode without gradients. Does nothing (and reads no batch) without BatchNorm;
    otherwise leaves ``model`` in training mode."""
    norms = [m for m in model.modules()
             if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
    if not norms:
        return
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # a cumulative average over the passes
    model.train()
    with torch.no_grad():
        for batch in batches:
            model(batch)


def to_torch(weights: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """Numpy tensors by name as float32 torch tensors (sharing memory where possible)."""
    return {k: torch.from_numpy(np.ascontiguousarray(v, np.float32)) for k, v in weights.items()}


def to_numpy(tensors: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """Torch tensors by name as float32 numpy copies (detached)."""
    return {k: v.detach().numpy().astype(np.float32, copy=True) for k, v in tensors.items()}


def input_batches(x: np.ndarray, size: int = 256) -> Iterator[torch.Tensor]:
    """``x`` (n, ...) in consecutive float32 tensors of at most ``size`` rows."""
    for start in range(0, len(x), size):
        yield torch.from_numpy(np.ascontiguousarray(x[start:start + size], np.float32))


def tensors_to_json(tensors: dict[str, torch.Tensor]) -> dict:
    """``{name: {"shape", "data"}}`` with float32 data in base64: JSON-ready, for checkpoints."""
    return {name: {"shape": list(t.shape),
                   "data": base64.b64encode(t.detach().to(torch.float32).numpy().tobytes()).decode()}
            for name, t in tensors.items()}


def tensors_from_json(state: dict) -> dict[str, torch.Tensor]:
    """The inverse of ``tensors_to_json``."""
    return {name: torch.from_numpy(np.frombuffer(base64.b64decode(t["data"]), np.float32)
                                   .reshape(t["shape"]).copy())
            for name, t in state.items()}
