"""Experiment tracking: what every tracker does (``observe/log_to.py`` opens them).

A tracker gets the run's config once (``begin``), every round's numeric metrics (``add_round``,
step = round) and the run's end (``finish``). Their libraries are optional extras: a missing one is
a one-line ``TrackingError`` naming ``pip install 'fedsdk[tracking]'``.
"""

from __future__ import annotations

import math
import numbers
from typing import Protocol

EXTRA_HINT = "pip install 'fedsdk[tracking]'"


class TrackingError(Exception):
    """A ``--log-to`` target cannot be used; the message is one line."""


class Tracker(Protocol):
    def begin(self, config: dict) -> None: ...

    def add_round(self, row: dict) -> None: ...

    def finish(self, status: str) -> None: ...


def numeric_metrics(row: dict) -> dict[str, float]:
    """The row's finite numbers (not ``round``, not booleans), by key."""
    return {k: float(v) for k, v in row.items() if k != "round" and isinstance(v, numbers.Real)
            and not isinstance(v, bool) and math.isfinite(float(v))}


def flat_config(config: dict, prefix: str = "") -> dict[str, str]:
    """``{"recipe.lr": "0.05", ...}``: nested config values as dotted keys and strings."""
    out: dict[str, str] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(flat_config(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = str(value)
    return out
