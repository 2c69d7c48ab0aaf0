"""The server-side hypernetwork of pFedHN / MH-pFedHN (seed 002): embeddings -> shared
feature extractor -> a head -> one flat vector of a client's K parameters.

``PersonalHypernet`` is a plain ``nn.Module`` holding

* ``extractor``: the shared feature extractor, ``layers`` x (Linear -> ReLU), 64 -> 128 -> ...
  -> 128 by default (the authors' code; the paper gives 3 layers but no width);
* ``embeddings[key]``: learnable (rows, 64) embedding matrices, initialised N(0, 0.002);
* ``heads[key]``: heads turning (rows, 128) features into a flat vector, either
  ``ChunkHead`` (MH-pFedHN: tau separate Linear(128, N), chunk j from embedding row j,
  concatenated) or ``TensorHead`` (pFedHN: one Linear(128, numel) per parameter tensor, from
  a single embedding row).

Which client uses which embedding and head is the method's business (``methods/``); the
module only generates: ``generate(embedding, head, K)`` = the head's output cut to K values.
"""

from __future__ import annotations

import math
import zlib

import torch
from torch import nn

EMBED_DIM = 64
HIDDEN = 128
CHUNK = 3072
EMBED_INIT_STD = 0.002


def _uniform(shape: tuple[int, ...], bound: float, generator: torch.Generator) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape).uniform_(-bound, bound, generator=generator))


class ChunkHead(nn.Module):
    """tau separate Linear(hidden, chunk) layers, stored as one (tau, chunk, hidden) weight
    and (tau, chunk) bias (the same maths, one einsum). Row j of the (tau, hidden) input
    goes through layer j; the tau outputs are concatenated: (tau * chunk,)."""

    def __init__(self, tau: int, hidden: int, chunk: int, generator: torch.Generator) -> None:
        super().__init__()
        bound = 1 / math.sqrt(hidden)  # nn.Linear's default initialisation range
        self.weight = _uniform((tau, chunk, hidden), bound, generator)
        self.bias = _uniform((tau, chunk), bound, generator)

    @property
    def rows(self) -> int:
        return self.weight.shape[0]

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return (torch.einsum("th,tch->tc", features, self.weight) + self.bias).reshape(-1)


class TensorHead(nn.Module):
    """pFedHN's output layers: one Linear(hidden, numel) per parameter tensor of one
    architecture, all fed the same single feature row; outputs concatenated in order."""

    def __init__(self, sizes: list[int], hidden: int, generator: torch.Generator) -> None:
        super().__init__()
        bound = 1 / math.sqrt(hidden)
        self.weights = nn.ParameterList(_uniform((n, hidden), bound, generator) for n in sizes)
        self.biases = nn.ParameterList(_uniform((n,), bound, generator) for n in sizes)

    @property
    def rows(self) -> int:
        return 1

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        row = features[0]
        return torch.cat([w @ row + b for w, b in zip(self.weights, self.biases, strict=True)])


class PersonalHypernet(nn.Module):
    """Embeddings, shared feature extractor and heads; see the module docstring."""

    def __init__(self, embed_dim: int = EMBED_DIM, hidden: int = HIDDEN, layers: int = 3,
                 init_std: float = EMBED_INIT_STD, seed: int = 0) -> None:
        super().__init__()
        if layers < 1:
            raise ValueError(f"the feature extractor needs at least one layer, got {layers}")
        self.embed_dim, self.hidden, self.init_std, self.seed = embed_dim, hidden, init_std, seed
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            blocks: list[nn.Module] = []
            for i in range(layers):
                blocks += [nn.Linear(embed_dim if i == 0 else hidden, hidden), nn.ReLU()]
            self.extractor = nn.Sequential(*blocks)
        self.embeddings = nn.ParameterDict()
        self.heads = nn.ModuleDict()

    def _generator(self, key: str) -> torch.Generator:
        """A generator seeded by (seed, key): what a part starts as does not depend on when
        it is created."""
        return torch.Generator().manual_seed(self.seed * 1_000_003 + zlib.crc32(key.encode()))

    def add_embedding(self, key: str, rows: int) -> nn.Parameter:
        """A new (rows, embed_dim) embedding ~ N(0, init_std); KeyError if ``key`` exists."""
        if key in self.embeddings:
            raise KeyError(f"embedding {key!r} exists")
        values = torch.randn((rows, self.embed_dim), generator=self._generator("embedding." + key))
        self.embeddings[key] = nn.Parameter(values * self.init_std)
        return self.embeddings[key]

    def add_chunk_head(self, key: str, tau: int, chunk: int = CHUNK) -> ChunkHead:
        """A new ``ChunkHead`` of ``tau`` chunks; KeyError if ``key`` exists."""
        if key in self.heads:
            raise KeyError(f"head {key!r} exists")
        self.heads[key] = ChunkHead(tau, self.hidden, chunk, self._generator("head." + key))
        return self.heads[key]

    def add_tensor_head(self, key: str, sizes: list[int]) -> TensorHead:
        """A new ``TensorHead`` producing tensors of ``sizes`` values; KeyError if ``key`` exists."""
        if key in self.heads:
            raise KeyError(f"head {key!r} exists")
        self.heads[key] = TensorHead(sizes, self.hidden, self._generator("head." + key))
        return self.heads[key]

    def generate(self, embedding: str, head: str, num_params: int) -> torch.Tensor:
        """The flat (num_params,) vector head(extractor(embeddings[embedding]))[:num_params]."""
        out = self.heads[head](self.extractor(self.embeddings[embedding]))
        if out.shape[0] < num_params:
            raise ValueError(f"head {head!r} makes {out.shape[0]} values, {num_params} are needed")
        return out[:num_params]

    def parameters_of(self, embedding: str, head: str, train_extractor: bool = True) -> list[nn.Parameter]:
        """The parameters ``generate(embedding, head, ...)`` depends on (the extractor's
        only when ``train_extractor``)."""
        params = [self.embeddings[embedding], *self.heads[head].parameters()]
        return [*self.extractor.parameters(), *params] if train_extractor else params

    def memory(self) -> dict:
        """{"parameters": count, "bytes": float32 bytes} of the whole hypernetwork."""
        count = sum(p.numel() for p in self.parameters())
        return {"parameters": count, "bytes": 4 * count}
