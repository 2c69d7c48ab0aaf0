"""The fleet as a dashboard shows it: one row per device, from the registry (a real fleet) or
from the in-process grid (a simulation without a broker)."""

from __future__ import annotations

import platform
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..fleet.registry import FleetRegistry
from ..fleet.tallies import read_tallies
from ..methods.tiers import resolve_tier
from ..rounds.grid import Grid
from ..rounds.inprocess_grid import InProcessGrid


@dataclass
class DeviceRow:
    """One device: ``last_seen`` in unix seconds (None: never), ``runtime``: the runtimes it offers,
    ``arch``: its machine (``platform.machine()`` of its profile), ``tier_reason``: why it has its tier."""

    device: str
    tier: str | None
    runtime: str
    last_seen: float | None
    online: bool
    accepted: int = 0
    rejected: int = 0
    last_error: str = ""
    arch: str = ""
    tier_reason: str = ""


@dataclass
class FleetView:
    """Every device, sorted by id, and the run's rejections by reason code."""

    devices: list[DeviceRow] = field(default_factory=list)
    rejections_by_reason: dict[str, int] = field(default_factory=dict)

    @property
    def online(self) -> int:
        return sum(d.online for d in self.devices)


FleetSource = Callable[[], FleetView]


def registry_fleet(registry: FleetRegistry, registry_path: Path, grid: Grid,
                   unexplained: str = "set by hand", fleet_path: Path | None = None) -> FleetSource:
    """A source reading the registry's in-memory device states and the file's tallies;
    ``unexplained``: the reason shown for a registered tier stored without one
    (``devices add --tier``; ``--tiers`` in a simulation)."""

    def view() -> FleetView:
        online = {d.device_id for d in grid.online()}
        tallies = read_tallies(registry_path, fleet_path)
        rows = []
        for dev, state in registry.states().items():
            profile = state.profile or {}
            why = tallies.tier_reason.get(dev) or (unexplained if state.tier is not None else
                                                    "from its profile" if profile.get("tier") else "")
            rows.append(DeviceRow(dev, resolve_tier(state.tier, profile), ", ".join(state.runtimes or []),
                                  state.last_seen, dev in online, tallies.accepted.get(dev, 0),
                                  tallies.rejected.get(dev, 0), tallies.last_error.get(dev, ""),
                                  str(profile.get("arch") or tallies.pair_arch.get(dev, "")), why))
        return FleetView(rows, tallies.by_reason)

    return view


def inprocess_fleet(grid: InProcessGrid) -> FleetSource:
    """A source reading the in-process grid: every device is online, seen now, runs on this
    machine, and has the tier ``--tiers`` gave it."""

    def view() -> FleetView:
        rejected = sum(grid.rejected.values())  # the in-process grid rejects non-finite updates only
        by_reason = {"non_finite": rejected} if rejected else {}
        rows = [DeviceRow(info.device_id, info.tier, ", ".join(info.runtimes) or "torch (in-process)", None,
                          True, grid.accepted.get(info.device_id, 0), grid.rejected.get(info.device_id, 0),
                          grid.last_error.get(info.device_id, ""), f"{platform.machine()} (in-process)",
                          "--tiers" if info.tier is not None else "")
                for info in grid.online()]
        return FleetView(rows, by_reason)

    return view
