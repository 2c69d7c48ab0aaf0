"""``DashboardState``: what the dashboard and ``/metrics`` show, fed by the run as it goes.

The round loop's ``on_round`` adds each metrics row; ``watch`` hands it the fleet source
(``observe/fleet_view.py``) and the grid, whose ``live()`` gives the open round. The web
server's thread only calls ``snapshot()``; the fleet is re-read at most every ``FLEET_TTL_S``
however many pages and scrapers poll. Once the run has ended no device counts as online.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
import time
from dataclasses import dataclass

from ..rounds.grid import Grid, LiveRound
from .fleet_view import FleetSource, FleetView

FLEET_TTL_S = 1.0


@dataclass
class Snapshot:
    """A consistent copy of the state: ``status`` is starting, running, or how the run ended
    (``report/run_status.py``: finished, finished_after_rollback, finished_without_learning, diverged,
    stopped, failed)."""

    config: dict
    rows: list[dict]
    fleet: FleetView
    live: LiveRound | None
    status: str
    started_at: float
    planned_rounds: int | None = None


class DashboardState:
    """Thread-safe: the run's thread writes, the web server's thread reads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._config: dict = {}
        self._rows: list[dict] = []
        self._status = "starting"
        self._started_at = time.time()
        self._fleet_source: FleetSource | None = None
        self._grid: Grid | None = None
        self._fleet = FleetView()
        self._fleet_read_at = -FLEET_TTL_S

    def begin(self, config: dict, rows: list[dict] | None = None) -> None:
        """The run's configuration (and, when it resumes, the rows it already has)."""
        with self._lock:
            self._config = copy.deepcopy(config)
            self._rows = copy.deepcopy(rows or [])
            self._status = "running"

    def watch(self, fleet: FleetSource, grid: Grid) -> None:
        """Where the fleet and the open round are read from."""
        with self._lock:
            self._fleet_source, self._grid = fleet, grid
            self._fleet_read_at = -FLEET_TTL_S

    def add_round(self, row: dict) -> None:
        """One closed round's metrics row (the loop's ``on_round``)."""
        with self._lock:
            self._rows.append(copy.deepcopy(row))
            self._fleet_read_at = -FLEET_TTL_S  # counts changed: read the fleet again

    def finish(self, status: str) -> None:
        """The run ended (``report/run_status.py``'s ``STATUSES``)."""
        with self._lock:
            self._status = status

    def snapshot(self) -> Snapshot:
        fleet = self._read_fleet()
        with self._lock:
            grid = self._grid
            rows, config, status = copy.deepcopy(self._rows), copy.deepcopy(self._config), self._status
        if status not in ("starting", "running"):  # the server no longer serves any device
            fleet = FleetView([dataclasses.replace(d, online=False) for d in fleet.devices],
                              fleet.rejections_by_reason)
        rounds = config.get("rounds")
        return Snapshot(config, rows, fleet, grid.live() if grid is not None else None, status,
                        self._started_at, rounds if isinstance(rounds, int) else None)

    def _read_fleet(self) -> FleetView:
        with self._lock:
            source, fresh = self._fleet_source, time.monotonic() - self._fleet_read_at < FLEET_TTL_S
            if source is None or fresh:
                return self._fleet
        fleet = source()  # outside the lock: it may query the registry file
        with self._lock:
            self._fleet, self._fleet_read_at = fleet, time.monotonic()
        return fleet
