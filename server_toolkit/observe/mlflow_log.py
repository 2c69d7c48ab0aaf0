"""``--log-to mlflow:URI``: one MLflow run (experiment ``fedsdk``) per fedsdk run, through the client
API of ``mlflow-skinny``: params = the flattened config, metrics = the rows' numeric keys at step =
round, status FINISHED (also finished_after_rollback), KILLED (stopped) or FAILED (also diverged).
URI: a tracking server (``http://host:5000``) or a directory (``file:/path/mlruns``; MLflow keeps
file stores in maintenance mode, this opts in to them)."""

from __future__ import annotations

import os
import time

from .tracking import EXTRA_HINT, TrackingError, flat_config, numeric_metrics

EXPERIMENT = "fedsdk"
MAX_PARAM = 500  # MLflow's limit on a param value's length


class MlflowTracker:
    def __init__(self, uri: str, run_name: str) -> None:
        try:
            from mlflow.entities import Metric, Param
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise TrackingError(f"--log-to mlflow needs the mlflow-skinny package: {EXTRA_HINT}") from None
        if uri.startswith("file:"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self._metric, self._param = Metric, Param
        try:
            self.client = MlflowClient(tracking_uri=uri)
            found = self.client.get_experiment_by_name(EXPERIMENT)
            experiment = found.experiment_id if found else self.client.create_experiment(EXPERIMENT)
            self.run_id = self.client.create_run(experiment, run_name=run_name).info.run_id
        except Exception as exc:  # mlflow raises many kinds; the user needs the one line
            raise TrackingError(f"--log-to mlflow:{uri}: {str(exc).splitlines()[0]}") from None

    def begin(self, config: dict) -> None:
        params = [self._param(k, v[:MAX_PARAM]) for k, v in flat_config(config).items()]
        for start in range(0, len(params), 100):  # log_batch takes at most 100 params
            self.client.log_batch(self.run_id, params=params[start:start + 100])

    def add_round(self, row: dict) -> None:
        now = int(time.time() * 1000)
        metrics = [self._metric(k, v, now, int(row["round"])) for k, v in numeric_metrics(row).items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def finish(self, status: str) -> None:
        self.client.set_terminated(self.run_id, "FINISHED" if status.startswith("finished") else
                                   "KILLED" if status == "stopped" else "FAILED")
