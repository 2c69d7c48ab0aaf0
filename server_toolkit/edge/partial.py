"""Partial aggregates: what a generic edge sends up instead of one device's weights.

A partial aggregate over a group is, per element of every global tensor, the weighted sum
``S = sum_i a_i w_i`` and the weight ``A = sum_i a_i`` of the clients that covered the
element (``methods/summands.py`` says what ``a_i`` is for each method). Partials of
disjoint groups add up; the parent's result ``S / A`` (the global value where ``A = 0``)
is then the flat aggregate, whatever the grouping, up to float rounding.

On the wire (protocol v2, no new message): an edge answers its task with two array
records in global coordinates and the global dtypes: ``model`` = the group's mean ``S / A``
(the global value where uncovered, so a result still looks like a model to the norm bound
and the shape checks) and ``coverage`` = ``A``; ``metrics.samples`` = its group's samples.
The parent re-forms ``S = mean * A``. Sums are kept in float64; the float32 mean costs
about 1e-7 relative.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..methods.records import COVERAGE
from ..methods.summands import Summand

Weights = dict[str, np.ndarray]
__all__ = ["COVERAGE", "Partial", "devices_behind"]  # COVERAGE: the array record holding A


def devices_behind(metrics: dict) -> int:
    """Device updates one result stands for: an edge's ``edge_devices`` (its group's, nested
    edges' devices included), 1 for a device's result or a missing or bad count."""
    count = metrics.get("edge_devices", 1)
    return count if isinstance(count, int) and not isinstance(count, bool) and count >= 1 else 1


@dataclass
class Partial:
    """``sums`` S and ``cover`` A per global tensor (float64, global shapes); tensors nobody
    covered are absent."""

    sums: dict[str, np.ndarray] = field(default_factory=dict)
    cover: dict[str, np.ndarray] = field(default_factory=dict)

    def add(self, global_weights: Weights, summands: dict[str, Summand]) -> None:
        """Add one update's summands; ValueError on an unknown tensor or a block of the wrong shape."""
        for name, part in summands.items():
            if name not in global_weights:
                raise ValueError(f"{name!r} is not a global tensor")
            sums, cover = self.sums.get(name), self.cover.get(name)
            if sums is None:
                shape = global_weights[name].shape
                sums = self.sums[name] = np.zeros(shape, np.float64)
                cover = self.cover[name] = np.zeros(shape, np.float64)
            if not part.indices and np.ndim(part.weight) == 0:  # a whole tensor, one weight (FedAvg)
                if part.values.shape != sums.shape:
                    raise ValueError(f"{name}: values {part.values.shape} do not fit {sums.shape}")
                weight = float(part.weight)  # the same float64 sums as the general case, bit for bit
                sums += part.values.astype(np.float64) * weight
                cover += weight
                continue
            block = np.ix_(*part.indices) if part.indices else ...
            if part.values.shape != sums[block].shape:
                raise ValueError(f"{name}: values {part.values.shape} do not fit their block "
                                 f"{sums[block].shape}")
            weight = np.broadcast_to(np.asarray(part.weight, np.float64), part.values.shape)
            sums[block] += weight * part.values.astype(np.float64)
            cover[block] += weight

    def add_partial(self, mean: Weights, cover: Weights) -> None:
        """Add a group's partial as it came over the wire (``model`` = mean, ``coverage`` = A)."""
        for name, a in cover.items():
            a = a.astype(np.float64)
            if (a < 0).any() or not np.isfinite(a).all():
                raise ValueError(f"coverage of {name} must be finite and >= 0")
            self.sums.setdefault(name, np.zeros(a.shape, np.float64))
            self.cover.setdefault(name, np.zeros(a.shape, np.float64))
            self.sums[name] += np.where(a > 0, mean[name].astype(np.float64) * a, 0.0)
            self.cover[name] += a

    def finish(self, global_weights: Weights) -> Weights:
        """``S / A`` per element; the global value where ``A = 0`` (global dtypes)."""
        out: Weights = {}
        for name, current in global_weights.items():
            if name not in self.sums:
                out[name] = current
                continue
            a = self.cover[name]
            merged = np.where(a > 0, self.sums[name] / np.where(a > 0, a, 1.0), current)
            out[name] = (np.rint(merged) if current.dtype.kind in "iu" else merged).astype(current.dtype)
        return out

    def coverage(self, global_weights: Weights) -> Weights:
        """``A`` for every global tensor (zeros where uncovered), as float32 for the wire
        (sample counts are exact in float32 up to 2**24)."""
        return {name: self.cover[name].astype(np.float32) if name in self.cover
                else np.zeros(value.shape, np.float32) for name, value in global_weights.items()}
