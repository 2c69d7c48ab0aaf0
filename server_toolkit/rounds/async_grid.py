"""The asynchronous grid: how the async loop (``rounds/async_loop.py``) reaches devices.

Where a round's ``Grid.exchange`` sends a batch of tasks and waits for them, an async grid
never waits for a batch: the loop hands a task to each idle device (``submit``) and takes the
updates accepted so far (``arrivals``), over and over. Each task is made from one global
version (its *base*); the grid remembers it and hands it back with the update, so the loop
can weigh the update by its staleness. A task not answered within its time limit expires:
its device counts as idle again and a late result is refused (``round_closed``).

``AsyncMqttGrid`` (``rounds/mqtt_async.py``) implements it over MQTT. An edge aggregator
running async (``docs/async.md``) would implement it towards its own devices.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from ..methods.base import ClientUpdate, DeviceInfo, TrainInstruction


@dataclass(frozen=True)
class Arrival:
    """An accepted update and the global version its task was made from."""

    update: ClientUpdate
    base: int


class AsyncGrid(ABC):
    """The devices of one fleet, as the async loop sees them."""

    @abstractmethod
    def online(self) -> list[DeviceInfo]:
        """The devices that may get a task now (online, registered), sorted by device id."""

    @abstractmethod
    def idle(self) -> list[DeviceInfo]:
        """The online devices without an open task, sorted by device id."""

    @abstractmethod
    def open_version(self, version: int) -> None:
        """Version ``version`` is the newest global model: tasks submitted now are made from it."""

    @abstractmethod
    def submit(self, version: int, instructions: list[TrainInstruction], timeout_s: float) -> None:
        """Send each instruction (made from ``version``); each expires ``timeout_s`` seconds later."""

    @abstractmethod
    def arrivals(self, timeout_s: float) -> list[Arrival]:
        """Handle traffic for up to ``timeout_s`` seconds (less once an update is accepted);
        the updates accepted since the last call, in acceptance order."""

    @abstractmethod
    def recovered(self, consumed: int) -> list[Arrival]:
        """After a restart: the updates accepted before it, in acceptance order, but the first
        ``consumed`` (the loop had already folded or dropped them)."""

    @abstractmethod
    def in_flight(self) -> dict[int, int]:
        """Open tasks per base version (the versions devices are still training on)."""

    def wait_for_devices(self, count: int, timeout_s: float) -> int:
        """Handle traffic until ``count`` devices are online (or the timeout); how many are."""
        return len(self.online())

    def counters(self) -> dict[str, int]:
        """Since the last call: ``rejected`` results and ``expired`` tasks."""
        return {"rejected": 0, "expired": 0}

    def traffic(self) -> tuple[int, int]:
        """Bytes sent to and received from devices so far: (down, up)."""
        return 0, 0

    def close(self) -> None:  # noqa: B027 - optional
        """Release what the grid holds (threads, connections)."""
