"""MH-pFedHN (seed 002): a multi-head hypernetwork whose heads are shared by parameter count.

A device of K parameters gets tau = ceil(K / N) embedding vectors (N = ``chunk``, 3072).
Devices with the same tau share one head, whatever their architecture: tau separate
Linear(128, N) layers; chunk j = layer j applied to the feature of embedding row j; the tau
chunks are concatenated and cut to K values, unpacked in the device model's parameter
order. The server needs only K (``models.architectures`` computes it from the tier).
Update rule, recipe and options: ``methods.hypernet.hypernetwork``.
"""

from __future__ import annotations

from ...models.architectures import Architecture
from .hypernetwork import HypernetMethod


class MHPFedHN(HypernetMethod):
    name = "mh-pfedhn"
    family = "personalised"
    example = "--model lenet --tiers lenet,vgg8,resnet10,resnet12,resnet18"

    def head_key(self, arch: Architecture) -> str:
        return f"tau{arch.chunks(self.chunk)}"

    def make_head(self, key: str, arch: Architecture) -> None:
        self.hypernet.add_chunk_head(key, arch.chunks(self.chunk), self.chunk)

    def embedding_rows(self, arch: Architecture) -> int:
        return arch.chunks(self.chunk)
