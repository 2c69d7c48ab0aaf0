"""``--log-to``: a wrong value or a missing optional extra is a one-line error naming the fix."""

from __future__ import annotations

import sys

import pytest

from server_toolkit.observe.log_to import open_tracker
from server_toolkit.observe.tracking import TrackingError, flat_config, numeric_metrics


def test_a_log_to_value_without_a_known_kind_and_target_is_refused():
    for spec in ("tensorboard", "wandb:proj", "mlflow:"):
        with pytest.raises(TrackingError, match="expected tensorboard:DIR or mlflow:URI"):
            open_tracker(spec, "run")


def test_a_missing_tracking_extra_names_the_pip_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if tensorboard were absent
    for name in ("mlflow", "mlflow.entities", "mlflow.tracking"):  # whether or not imported already;
        monkeypatch.setitem(sys.modules, name, None)  # never half-imported (later tests import it whole)
    with pytest.raises(TrackingError) as tb:
        open_tracker(f"tensorboard:{tmp_path}", "run")
    with pytest.raises(TrackingError) as ml:
        open_tracker(f"mlflow:file:{tmp_path}", "run")
    for caught in (tb, ml):
        assert "pip install 'fedsdk[tracking]'" in str(caught.value) and "\n" not in str(caught.value)


def test_only_finite_numbers_are_logged_and_the_config_is_flattened():
    row = {"round": 2, "accuracy": 0.5, "accepted": 3, "ok": True, "note": "x", "loss": float("nan")}
    assert numeric_metrics(row) == {"accuracy": 0.5, "accepted": 3.0}
    flat = flat_config({"method": "fedavg", "recipe": {"lr": 0.05}})
    assert flat == {"method": "fedavg", "recipe.lr": "0.05"}
