"""``RunObservers``: everything watching one run (the dashboard's state and server, trackers), fed
through four calls the run makes: ``begin`` (config), ``watch_*`` (where the fleet is), ``add_round``
(the round loop's ``on_round``), ``finish`` (status). With nothing configured every call is a no-op."""

from __future__ import annotations

from pathlib import Path

from ..fleet.registry import FleetRegistry
from ..rounds.grid import Grid
from ..rounds.inprocess_grid import InProcessGrid
from .fleet_view import inprocess_fleet, registry_fleet
from .server import DashboardServer
from .state import DashboardState
from .tracking import Tracker


class RunObservers:
    def __init__(self, state: DashboardState | None = None, server: DashboardServer | None = None,
                 trackers: list[Tracker] | None = None) -> None:
        self.state, self.server, self.trackers = state, server, list(trackers or [])

    def begin(self, config: dict, rows: list[dict] | None = None) -> None:
        """The run starts (``rows``: those it has already, when it resumes)."""
        if self.state:
            self.state.begin(config, rows)
        for tracker in self.trackers:
            tracker.begin(config)

    def watch_registry(self, registry: FleetRegistry, registry_path: Path, grid: Grid,
                       unexplained: str = "set by hand", fleet_path: Path | None = None) -> None:
        """A fleet behind the MQTT grid, registered in ``registry`` (file ``registry_path``; its
        devices in ``fleet_path`` when another file); ``unexplained``: why a tier stored without
        a reason is what it is."""
        if self.state:
            self.state.watch(registry_fleet(registry, registry_path, grid, unexplained, fleet_path), grid)

    def watch_inprocess(self, grid: InProcessGrid) -> None:
        """Simulated devices trained in this process."""
        if self.state:
            self.state.watch(inprocess_fleet(grid), grid)

    def add_round(self, row: dict) -> None:
        if self.state:
            self.state.add_round(row)
        for tracker in self.trackers:
            tracker.add_round(row)

    def finish(self, status: str) -> None:
        """The run ended (``report/run_status.py``'s ``STATUSES``): trackers close; the dashboard shows it."""
        if self.state:
            self.state.finish(status)
        for tracker in self.trackers:
            tracker.finish(status)
        self.trackers = []

    def close(self) -> None:
        """Stop the dashboard's server."""
        if self.server:
            self.server.stop()
            self.server = None
