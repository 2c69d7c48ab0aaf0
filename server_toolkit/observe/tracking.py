"""Experiment tracking: ``--log-to tensorboard:DIR`` and ``--log-to mlflow:URI`` (repeatable).

A tracker gets the run's config once (``begin``), every round's numeric metrics (``add_round``,
step = round) and the run's end (``finish``). Their libraries are optional extras: a missing one is
a one-line ``TrackingError`` naming ``pip install 'fedsdk[tracking]'``.
"""

from __future__ import annotations

import math
import numbers
from typing import Protocol

EXTRA_HINT = "pip install 'fedsdk[tracking]'"
KINDS = ("tensorboard", "mlflow")


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


def open_tracker(spec: str, run_name: str) -> Tracker:
    """The tracker of one ``--log-to`` value (``KIND:TARGET``)."""
    kind, sep, target = spec.partition(":")
    if not sep or kind not in KINDS or not target:
        raise TrackingError(f"--log-to {spec!r}: expected tensorboard:DIR or mlflow:URI")
    if kind == "tensorboard":
        from .tensorboard_log import TensorBoardTracker
        return TensorBoardTracker(target, run_name)
    from .mlflow_log import MlflowTracker
    return MlflowTracker(target, run_name)
