"""Transposed-convolution dilation (FedConv, seed 001): a returned small model back to full size.

The mirror of ``methods/fedconv/conv_compress.py``: each tensor of a tier's model goes through
the same kind of path, with a ``ConvTranspose2d`` (stride 1, padding 0, the compression
kernel) in place of the compressing conv, so (rows', cols') grows back to (rows, cols).
Every returned client model gets its own dilator, trained on the server data (global
model's CE, client weights frozen) so that the *dilated* model classifies well.

With the default delta initialisation an untrained dilator puts the client's tensors in the
top-left corner and zeros elsewhere: the dilated model then computes exactly what the client
model computes, and training starts from the client's accuracy.
"""

from __future__ import annotations

import numpy as np
import torch

from ...torch_utils import to_numpy, to_torch
from .conv_compress import (
    DEFAULT_BLOCK,
    BlockConfig,
    Weights,
    WeightTransform,
    tensor_shapes,
    tier_spec,
)
from .train_generated import Schedule, train_generated


def dilator(global_spec: dict, ratio: float, config: BlockConfig = DEFAULT_BLOCK,
            seed: int = 0) -> WeightTransform:
    """The dilation paths from tier ``ratio``'s model to ``global_spec``'s shapes."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return WeightTransform(tensor_shapes(tier_spec(global_spec, ratio)), tensor_shapes(global_spec),
                               config, transposed=True)



def train_update_dilator(transform: WeightTransform, change: Weights, global_weights: Weights,
                         global_spec: dict, x: np.ndarray, y: np.ndarray, schedule: Schedule,
                         seed: int = 0) -> tuple[Weights, dict]:
    """Dilate a client's *update* instead of its model (``dilate_what="update"``): tune
    ``transform`` so that the global model plus the dilated ``change`` (trained − sent, the
    tier's shapes) classifies (x, y) well (``schedule.epochs`` = 0: no tuning); returns
    (global + dilated change, the last epoch's {"loss", "accuracy"})."""
    frozen_change, frozen_global = to_torch(change), to_torch(global_weights)

    def generate() -> dict[str, torch.Tensor]:
        dilated = transform(frozen_change)
        return {name: frozen_global[name] + dilated[name] for name in dilated}

    stats = train_generated(generate, transform.parameters(), global_spec, x, y, schedule, seed)
    with torch.no_grad():
        out = to_numpy(generate())
    return out, stats
