"""The norm bound: no single update may move the global model much further than its peers.

Per array record (``"model"``, a returned teacher, ...) that was sent with the task, an
update's delta is ``w_i - w_sent`` over its floating-point tensors (integer tensors such
as BatchNorm's ``num_batches_tracked`` are left alone), measured per element: its RMS,
‖delta‖ / sqrt(elements). With ``m`` the round's lower median of those RMS values (of one
record, over the round's updates), a delta whose RMS exceeds ``factor * m`` is scaled down
to that RMS. Per element, because devices of one round train models of different sizes
(width tiers, personalised architectures): at the same step per weight a resnet18's delta
has ~13x the norm of a lenet's, and a plain norm bound would clip every large model.
The lower median keeps a single huge update out of the reference even when only two
devices answered; with one update there is no reference and nothing is clipped.

BatchNorm running statistics (``running_mean``, ``running_var``) are float tensors and
count as part of the delta, scaled with it: a forged running variance is as harmful as a
forged weight, and scaling by s <= 1 keeps a variance between the sent and the returned
(positive) value. Records the task never sent (``features``) are not model deltas and are
left alone, and so is an edge's ``coverage`` (sample counts, not weights: ``edge/partial.py``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics

import numpy as np

from ..methods.base import MODEL, ClientUpdate, Weights
from ..methods.records import COVERAGE
from .aggregator import Aggregator, RoundInput

log = logging.getLogger(__name__)

DEFAULT_FACTOR = 10.0


def _float_names(sent: Weights, returned: Weights) -> list[str]:
    """Tensors of both with the same shape and a floating-point dtype, sorted."""
    return sorted(k for k, v in returned.items() if k in sent and v.dtype.kind == "f"
                  and np.shape(sent[k]) == v.shape)


def _delta_squares(sent: Weights, returned: Weights) -> tuple[float, int]:
    """(sum of squared deltas, element count) over the floating-point tensors both hold."""
    total, count = 0.0, 0
    for k in _float_names(sent, returned):
        d = returned[k].astype(np.float64) - np.asarray(sent[k], np.float64)
        total += float(np.dot(d.ravel(), d.ravel()))
        count += d.size
    return total, count


def delta_norm(sent: Weights, returned: Weights) -> float:
    """‖returned - sent‖ over the floating-point tensors both hold (float64 sums)."""
    return math.sqrt(_delta_squares(sent, returned)[0])


def delta_rms(sent: Weights, returned: Weights) -> float:
    """The root mean square of ``returned - sent`` per float element (0 when there is none)."""
    total, count = _delta_squares(sent, returned)
    return math.sqrt(total / count) if count else 0.0


def _scaled(sent: Weights, returned: Weights, scale: float) -> Weights:
    """``returned`` with its float delta from ``sent`` multiplied by ``scale``."""
    out = dict(returned)
    for k in _float_names(sent, returned):
        base = np.asarray(sent[k], np.float64)
        out[k] = (base + scale * (returned[k].astype(np.float64) - base)).astype(returned[k].dtype)
    return out


def bound_updates(rnd: int, updates: list[ClientUpdate], factor: float) -> tuple[list[ClientUpdate], int]:
    """``updates`` with every delta whose RMS exceeds ``factor`` x the round's lower median RMS
    (per record) scaled down to it; and how many updates were clipped."""
    clipped: set[int] = set()
    records = sorted({name for u in updates for name in u.arrays
                      if name in u.instruction.all_models() and name != COVERAGE})
    out = list(updates)
    for name in records:
        have = [i for i, u in enumerate(out) if name in u.arrays and name in u.instruction.all_models()]
        if len(have) < 2:
            continue
        sent = {i: out[i].instruction.all_models()[name].weights for i in have}
        wide: dict[int, Weights] = {}  # id(sent weights) -> them in float64: most updates share one
        for i in have:
            if id(sent[i]) not in wide:
                wide[id(sent[i])] = {k: np.asarray(v, np.float64) for k, v in sent[i].items()}
        rms = {i: delta_rms(wide[id(sent[i])], out[i].arrays[name]) for i in have}
        bound = factor * statistics.median_low(rms.values())
        for i in have:
            if rms[i] <= bound:
                continue
            scale = bound / rms[i]
            log.warning("round %d: update of %s moves %s by %.3g per weight (RMS), more than %.3g "
                        "(%g x the median); scaled by %.3g", rnd, out[i].device_id, name, rms[i], bound,
                        factor, scale)
            weights = _scaled(sent[i], out[i].arrays[name], scale)
            if name == MODEL:
                out[i] = dataclasses.replace(out[i], weights=weights)
            else:
                out[i] = dataclasses.replace(out[i], others={**out[i].others, name: weights})
            clipped.add(i)
    return out, len(clipped)


class NormBound(Aggregator):
    """The stack's layer (``rounds/aggregator.py``): ``bound_updates`` before the layers below;
    the count of clipped updates in the row's ``clipped``."""

    def __init__(self, inner: Aggregator, factor: float = DEFAULT_FACTOR) -> None:
        super().__init__(inner)
        self.factor = factor

    def aggregate(self, rnd: int, global_weights: Weights, updates: list[ClientUpdate],
                  info: RoundInput) -> Weights:
        updates, info.row["clipped"] = bound_updates(rnd, updates, self.factor)
        return self.inner.aggregate(rnd, global_weights, updates, info)
