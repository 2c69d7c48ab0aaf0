"""The fleet as a dashboard shows it: one row per device, from the registry (a real fleet) or
from the in-process grid (a simulation without a broker)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..fleet.registry import FleetRegistry
from ..fleet.tallies import read_tallies
from ..rounds.grid import Grid
from ..rounds.inprocess_grid import InProcessGrid


@dataclass
class DeviceRow:
    """One device: ``last_seen`` in unix seconds (None: never), ``runtime``: the runtimes it offers."""

    device: str
    tier: str | None
    runtime: str
    last_seen: float | None
    online: bool
    accepted: int = 0
    rejected: int = 0
    last_error: str = ""


@dataclass
class FleetView:
    """Every device, sorted by id, and the run's rejections by reason code."""

    devices: list[DeviceRow] = field(default_factory=list)
    rejections_by_reason: dict[str, int] = field(default_factory=dict)

    @property
    def online(self) -> int:
        return sum(d.online for d in self.devices)


FleetSource = Callable[[], FleetView]


def registry_fleet(registry: FleetRegistry, registry_path: Path, grid: Grid) -> FleetSource:
    """A source reading the registry's in-memory device states and the file's tallies."""

    def view() -> FleetView:
        online = {d.device_id for d in grid.online()}
        tallies = read_tallies(registry_path)
        rows = [DeviceRow(dev, state.tier, ", ".join(state.runtimes or []), state.last_seen, dev in online,
                          tallies.accepted.get(dev, 0), tallies.rejected.get(dev, 0),
                          tallies.last_error.get(dev, ""))
                for dev, state in registry.states().items()]
        return FleetView(rows, tallies.by_reason)

    return view


def inprocess_fleet(grid: InProcessGrid) -> FleetSource:
    """A source reading the in-process grid: every device is online and seen now."""

    def view() -> FleetView:
        rejected = sum(grid.rejected.values())  # the in-process grid rejects non-finite updates only
        by_reason = {"non_finite": rejected} if rejected else {}
        rows = [DeviceRow(info.device_id, info.tier, ", ".join(info.runtimes) or "torch (in-process)", None,
                          True, grid.accepted.get(info.device_id, 0), grid.rejected.get(info.device_id, 0),
                          grid.last_error.get(info.device_id, ""))
                for info in grid.online()]
        return FleetView(rows, by_reason)

    return view
