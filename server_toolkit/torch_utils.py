"""Small torch helpers shared by the server's learned modules (hypernetworks, FedConv's convs)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
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
