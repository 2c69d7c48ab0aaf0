"""pFedHN (Shamsian et al., 2021) in the model-heterogeneous harness of seed 002.

Each device has one 64-d embedding vector; the shared feature extractor turns it into a
128-d feature; one head per *architecture* (no sharing between architectures) has one
Linear(128, numel) per parameter tensor, and their outputs, concatenated in the model's
parameter order, are the device's K parameters. The paper says it "modified [pFedHN] by
adding multiple heads" for heterogeneous fleets; this is that, with MH-pFedHN's feature
extractor, update rule (``methods.hypernet.hypernetwork``) and client recipe, so that the two
differ only in how parameters come out of the heads.
"""

from __future__ import annotations

import math

from ...models.architectures import Architecture
from .hypernetwork import HypernetMethod


class PFedHN(HypernetMethod):
    name = "pfedhn"
    family = "personalised"
    example = "--model lenet --tiers lenet,vgg8,resnet10,resnet12,resnet18"

    def head_key(self, arch: Architecture) -> str:
        return f"arch-{arch.name}"

    def make_head(self, key: str, arch: Architecture) -> None:
        self.hypernet.add_tensor_head(key, [math.prod(shape) for _, shape in arch.parameters])

    def embedding_rows(self, arch: Architecture) -> int:
        return 1
