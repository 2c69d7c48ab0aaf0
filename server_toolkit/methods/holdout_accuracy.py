"""``accuracy_holdout_tier_<tier>``: what each tier's devices can deploy, scored on their own data.

With ``--holdout F`` (``run``, ``simulate``; carried as ``task.holdout``, protocol §5.4) every
device keeps a fraction F of its samples back, never trains on them, and scores the model it
received on them before training (``sdk_device.holdout``): ``holdout_accuracy`` and
``holdout_samples`` among its result metrics. Per round the server writes:

* ``accuracy_holdout``: over every accepted update that has them, the mean of the devices'
  ``holdout_accuracy`` weighted by their ``holdout_samples`` (every held-back sample of the
  fleet weighs the same), and ``holdout_samples``, their sum;
* ``accuracy_holdout_tier_<tier>``: the same over each tier's devices (the tier the round
  loop assigned them, as in ``accuracy_tier_<tier>``; devices without one: ``default``).

Decisions: the keys start with ``accuracy_`` so ``fedsdk-server report`` and the dashboard's
"per tier / device" chart take them as accuracy parts without code of their own; the closing
table shows them as "holdout <tier>". They score the model a device *received* in round r,
i.e. the global model after round r − 1 as its tier deploys it: compare row r's
``accuracy_holdout_tier_<t>`` with row r − 1's ``accuracy_tier_<t>``. A device scores its
model's final output, or, for a method that ``deploys_ensemble`` (DepthFL; the round loop
sets ``task.holdout_ensemble``), the mean softmax of all its outputs, as ``accuracy_tier_<t>``
does (an older device that ignores the field scores its final output). For a width method's
``deploy="nested"`` the loop sets ``task.holdout_members`` (``Method.holdout_members``,
``methods/holdout_members.py``): the device scores the mean softmax of its window and the
narrower fleet windows, as ``accuracy_tier_<t>`` does; a device without the torch runtime and a
bundle's member get no members and score their own window. An update without the
two metrics (an older device, the C++ client, a server without ``--holdout``) is left out; a
round with none writes none of these keys. An edge aggregator forwards its group's
sample-weighted mean and sum as its own two metrics (``edge/aggregator.py``), so it counts as
one device of its tier weighted by its group's held-back samples.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from .base import ClientUpdate, DeviceInfo
from .tier_accuracy import DEFAULT_TIER

ACCURACY, SAMPLES = "holdout_accuracy", "holdout_samples"  # a device's result metrics
HOLDOUT_KEY = "accuracy_holdout"  # the fleet's, in a metrics row
HOLDOUT_TIER_KEY = "accuracy_holdout_tier_"


def holdout_tier_key(tier: str | None) -> str:
    """The metrics key of ``tier``'s held-back accuracy (``accuracy_holdout_tier_0.5``)."""
    return HOLDOUT_TIER_KEY + (DEFAULT_TIER if tier is None else str(tier))


def reported(metrics: Mapping) -> tuple[float, int] | None:
    """(holdout_accuracy, holdout_samples) of one result's metrics, None when absent or invalid
    (accuracy a number in 0..1, samples an integer > 0)."""
    acc, n = metrics.get(ACCURACY), metrics.get(SAMPLES)
    if isinstance(acc, bool) or not isinstance(acc, int | float) or not math.isfinite(acc) \
            or not 0 <= acc <= 1:
        return None
    if type(n) is not int or n <= 0:
        return None
    return float(acc), n


def weighted(pairs: Iterable[tuple[float, int]]) -> tuple[float, int] | None:
    """(mean accuracy weighted by samples, total samples) of (accuracy, samples) pairs; None if empty."""
    pairs = list(pairs)
    total = sum(n for _, n in pairs)
    if not total:
        return None
    return sum(a * n for a, n in pairs) / total, total


def holdout_row(updates: Iterable[ClientUpdate], devices: Mapping[str, DeviceInfo]) -> dict:
    """{``accuracy_holdout``, ``holdout_samples``, ``accuracy_holdout_tier_<t>`` …} of one
    round's accepted ``updates``; ``devices``: device id -> its info with its final tier (an
    update of a device not in it counts under ``default``). Empty when no update reported."""
    by_tier: dict[str, list[tuple[float, int]]] = {}
    for update in updates:
        found = reported(update.metrics)
        if found is None:
            continue
        info = devices.get(update.device_id)
        by_tier.setdefault(holdout_tier_key(info.tier if info is not None else None), []).append(found)
    fleet = weighted(p for pairs in by_tier.values() for p in pairs)
    if fleet is None:
        return {}
    out = {HOLDOUT_KEY: fleet[0], SAMPLES: fleet[1]}
    for key in sorted(by_tier):
        out[key] = weighted(by_tier[key])[0]
    return out
