"""Transposed-convolution dilation (FedConv, seed 001): a returned small model back to full size.

The mirror of ``submodels/conv_compress.py``: each tensor of a tier's model goes through
the same kind of path, with a ``ConvTranspose2d`` (stride 1, padding 0, the compression
kernel) in place of the compressing conv, so (rows', cols') grows back to (rows, cols).
Every returned client model gets its own dilator, trained on the server data (global
model's CE, client weights frozen) so that the *dilated* model classifies well.

With the default delta initialisation an untrained dilator puts the client's tensors in the
top-left corner and zeros elsewhere: the dilated model then computes exactly what the client
model computes, and training starts from the client's accuracy.
"""

from __future__ import annotations

import torch

from ..submodels.conv_compress import DEFAULT_BLOCK, BlockConfig, WeightTransform, tensor_shapes, tier_spec


def dilator(global_spec: dict, ratio: float, config: BlockConfig = DEFAULT_BLOCK,
            seed: int = 0) -> WeightTransform:
    """The dilation paths from tier ``ratio``'s model to ``global_spec``'s shapes."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return WeightTransform(tensor_shapes(tier_spec(global_spec, ratio)), tensor_shapes(global_spec),
                               config, transposed=True)

