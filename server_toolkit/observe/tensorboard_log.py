"""``--log-to tensorboard:DIR``: event files in ``DIR/<run name>`` (torch's ``SummaryWriter``);
scalars are the rows' numeric keys at step = round, the config is the text ``config``."""

from __future__ import annotations

import json
from pathlib import Path

from .tracking import EXTRA_HINT, TrackingError, numeric_metrics


class TensorBoardTracker:
    def __init__(self, directory: str, run_name: str) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise TrackingError(f"--log-to tensorboard needs the tensorboard package: {EXTRA_HINT}") from None
        self.log_dir = Path(directory) / run_name
        self._writer = SummaryWriter(log_dir=str(self.log_dir))

    def begin(self, config: dict) -> None:
        self._writer.add_text("config", "```\n" + json.dumps(config, indent=2, default=str) + "\n```", 0)
        self._writer.flush()

    def add_round(self, row: dict) -> None:
        for key, value in numeric_metrics(row).items():
            self._writer.add_scalar(key, value, global_step=int(row["round"]))
        self._writer.flush()

    def finish(self, status: str) -> None:
        self._writer.add_text("status", status, 0)
        self._writer.close()
