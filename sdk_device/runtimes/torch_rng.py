"""torch's CPU random stream, reproduced with numpy: same seed, same batch order and masks.

The torch and ExecuTorch runtimes order each epoch with ``torch.randperm(n, generator=g)``
and draw dropout keep-masks with ``torch.rand(shape, generator=g) >= p`` from one generator
seeded with the recipe's seed. torch's CPU generator is a 32-bit Mersenne Twister seeded like
numpy's legacy ``RandomState(seed)``; ``randperm`` swaps element i with i + (next % (n - i))
for i = 0..n-2, and ``rand`` (float32) takes the low 24 bits of one draw per element times
2**-24. Both are reproduced here exactly (tested against torch), so a torch-free device
trains on the same order as the torch runtime.
"""

from __future__ import annotations

import numpy as np


class TorchCpuGenerator:
    """``torch.Generator().manual_seed(seed)`` for ``randperm`` and float32 ``rand``."""

    def __init__(self, seed: int) -> None:
        self._state = np.random.RandomState(seed & 0xFFFFFFFF)

    def _draws(self, count: int) -> np.ndarray:
        """``count`` raw 32-bit outputs of the twister, as int64."""
        return self._state.randint(0, 2**32, size=count, dtype=np.uint32).astype(np.int64)

    def randperm(self, n: int) -> np.ndarray:
        """A permutation of range(n) (int64), as ``torch.randperm(n, generator=g)``."""
        if n < 2:
            return np.arange(n, dtype=np.int64)
        order = list(range(n))
        targets = self._draws(n - 1) % np.arange(n, 1, -1) + np.arange(n - 1)
        for i, j in enumerate(targets.tolist()):  # sequential swaps: each depends on the last
            order[i], order[j] = order[j], order[i]
        return np.array(order, dtype=np.int64)

    def rand(self, shape: tuple[int, ...]) -> np.ndarray:
        """Uniform [0, 1) float32 of ``shape``, as ``torch.rand(shape, generator=g)``."""
        bits = self._draws(int(np.prod(shape, dtype=np.int64))) & 0xFFFFFF
        return (bits.astype(np.float32) * np.float32(2.0 ** -24)).reshape(shape)
