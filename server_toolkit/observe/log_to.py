"""``--log-to KIND:TARGET`` (repeatable): ``tensorboard:DIR`` or ``mlflow:URI``, opened as trackers."""

from __future__ import annotations

from .tracking import Tracker, TrackingError

KINDS = ("tensorboard", "mlflow")


def open_tracker(spec: str, run_name: str) -> Tracker:
    """The tracker of one ``--log-to`` value; TrackingError (one line) when it cannot be used."""
    kind, sep, target = spec.partition(":")
    if not sep or kind not in KINDS or not target:
        raise TrackingError(f"--log-to {spec!r}: expected tensorboard:DIR or mlflow:URI")
    if kind == "tensorboard":
        from .tensorboard_log import TensorBoardTracker
        return TensorBoardTracker(target, run_name)
    from .mlflow_log import MlflowTracker
    return MlflowTracker(target, run_name)
