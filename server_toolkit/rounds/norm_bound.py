"""The norm bound: no single update may move the global model much further than its peers.

Per array record (``"model"``, a returned teacher, ...) that was sent with the task, an
update's delta is ``w_i - w_sent`` over its floating-point tensors (integer tensors such
as BatchNorm's ``num_batches_tracked`` are left alone), measured per element: its RMS,
‖delta‖ / sqrt(elements). With ``m`` the round's lower median of those RMS values (of one
record, over the round's updates), a delta whose RMS exceeds ``factor * m`` is scaled down
to that RMS (``bound_updates``: m is first taken over the round's models of the same shape).
Per element, because devices of one round train models of different sizes
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


def _signature(sent: Weights) -> tuple:
    """The shapes of a sent record's float tensors: which returned models are peers."""
    return tuple((k, np.shape(v)) for k, v in sorted(sent.items()) if np.asarray(v).dtype.kind == "f")


def bound_updates(rnd: int, updates: list[ClientUpdate], factor: float) -> tuple[list[ClientUpdate], int]:
    """``updates`` with every delta whose RMS exceeds ``factor`` x its reference scaled down to
    it; and how many updates were clipped. The reference of a returned model is the lower
    median RMS of the round's returned models of the same shape (any record: a width-0.125
    device's own ``"model"`` and a wide device's ``"narrow"`` copy are peers), or, when it has
    no peer of its shape, the lower median of its record over the round (a lone full-width
    model against the narrow ones, per weight). Why by shape first: a narrow model moves
    more per weight than a wide one under the same recipe, so a median taken over a round of
    mostly wide models clipped honest narrow devices (measured: HeteroFL ``also_nested``, 18
    devices, 12 clips in 120 rounds, all of width-0.125 devices)."""
    clipped: set[int] = set()
    records = sorted({name for u in updates for name in u.arrays
                      if name in u.instruction.all_models() and name != COVERAGE})
    out = list(updates)
    rms: dict[tuple[int, str], float] = {}
    signature: dict[tuple[int, str], tuple] = {}
    wide: dict[int, tuple[Weights, tuple]] = {}  # id(sent weights) -> (float64 copy, shapes): most share one
    for name in records:
        for i, u in enumerate(out):
            if name not in u.arrays or name not in u.instruction.all_models():
                continue
            sent = u.instruction.all_models()[name].weights
            if id(sent) not in wide:
                wide[id(sent)] = ({k: np.asarray(v, np.float64) for k, v in sent.items()}, _signature(sent))
            sent64, signature[i, name] = wide[id(sent)]
            rms[i, name] = delta_rms(sent64, u.arrays[name])
    by_shape: dict[tuple, list[float]] = {}
    by_record: dict[str, list[float]] = {}
    for (i, name), value in rms.items():
        by_shape.setdefault(signature[i, name], []).append(value)
        by_record.setdefault(name, []).append(value)
    medians: dict[tuple | str, float] = {key: statistics.median_low(values)
                                         for groups in (by_shape, by_record)
                                         for key, values in groups.items() if len(values) >= 2}
    for (i, name), value in rms.items():
        reference = medians.get(signature[i, name], medians.get(name))
        if reference is None:
            continue  # one model of its shape and of its record: no reference
        bound = factor * reference
        if value <= bound:
            continue
        scale = bound / value
        log.warning("round %d: update of %s moves %s by %.3g per weight (RMS), more than %.3g "
                    "(%g x the median); scaled by %.3g", rnd, out[i].device_id, name, value, bound,
                    factor, scale)
        sent = out[i].instruction.all_models()[name].weights
        weights = _scaled(sent, out[i].arrays[name], scale)
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
