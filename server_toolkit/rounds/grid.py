"""The grid: how the round loop reaches devices (after Flower's ``Grid``).

The round loop (``rounds/loop.py``) never sees MQTT, blobs or device processes; it talks
to a grid, which knows which devices are online and runs one exchange per round: hand each
instruction to its device, then collect results until ``quorum`` are accepted, every asked
device is resolved (accepted, refused, rejected or gone), or the deadline passes.

Two grids implement it:

* ``MqttGrid`` (``rounds/mqtt_grid.py``): real devices over MQTT: tasks, pulled and
  validated blobs, a registry that survives server restarts;
* ``InProcessGrid`` (``rounds/inprocess_grid.py``): simulated devices trained in this
  process with the device's own task code, for benchmarks and quick studies.

Both hand back ``ClientUpdate``s, so a number measured on one is a number of the other.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field

from ..methods.base import ClientUpdate, DeviceInfo, Method, TrainInstruction, Weights


@dataclass
class Exchange:
    """What one round's exchange brought back: the accepted updates (in arrival order) and
    how many results or refusals were rejected, by reason code; ``left``: the exchange ended
    early because every device asked went offline or refused its task; ``secure``: set by
    secure aggregation (``server_toolkit/secagg``), whose updates carry metrics only: (method,
    round, global weights) -> the next global weights, from the unmasked sum."""

    updates: list[ClientUpdate] = field(default_factory=list)
    rejections: dict[str, int] = field(default_factory=dict)
    left: bool = False
    secure: Callable[[Method, int, Weights], Weights] | None = None

    @property
    def rejected(self) -> int:
        return sum(self.rejections.values())


TRAINING, UPLOADING, ACCEPTED, GONE, WAITING = "training", "uploading", "accepted", "gone", "waiting"
REJECTED = "rejected: "  # + the reason code of the device's last rejection this round


@dataclass
class LiveRound:
    """The open round as the grid sees it now (for dashboards): the devices asked, those whose
    update was accepted, rejections by reason code, the deadline (unix seconds); ``states``: per
    device asked, ``training``, ``uploading`` (its result is being pulled), ``accepted``,
    ``rejected: <code>``, ``gone`` (offline) or ``waiting`` (in-process: not trained yet);
    ``progress``: the training progress (0..1) a device last reported."""

    round: int
    asked: list[str]
    accepted: list[str]
    rejections: dict[str, int]
    deadline: float
    states: dict[str, str] = field(default_factory=dict)
    progress: dict[str, float] = field(default_factory=dict)

    def count(self, state: str) -> int:
        """Devices in ``state`` (``"rejected: "``: rejected for any reason)."""
        return sum(s == state or (state == REJECTED and s.startswith(REJECTED)) for s in self.states.values())

    def trained(self) -> int:
        """Devices whose result came in (uploading, accepted, or rejected: not refused, not gone)."""
        refused = REJECTED + "device:"
        return sum(s in (UPLOADING, ACCEPTED) or (s.startswith(REJECTED) and not s.startswith(refused))
                   for s in self.states.values())


def device_states(asked: list[str], accepted: list[str], uploading: set[str], gone: set[str],
                  rejected: dict[str, str]) -> dict[str, str]:
    """Per device asked, the first that holds: accepted, uploading, gone, ``rejected: <code>``
    (``rejected``: device -> the code of its last rejection this round; its task stays open), training."""
    done = set(accepted)
    return {dev: ACCEPTED if dev in done else UPLOADING if dev in uploading else GONE if dev in gone
            else REJECTED + rejected[dev] if dev in rejected else TRAINING for dev in asked}


class Grid(ABC):
    """The devices of one fleet, as the round loop sees them."""

    @abstractmethod
    def online(self) -> list[DeviceInfo]:
        """The devices that may be selected now (online, registered, with current tiers),
        sorted by device id."""

    @abstractmethod
    def exchange(self, round_number: int, instructions: list[TrainInstruction], deadline: float,
                 quorum: int) -> Exchange:
        """Send every instruction; collect results until ``quorum`` updates are accepted,
        every device asked is resolved, or ``deadline`` (unix seconds) passes. Time the grid
        spends preparing the tasks (exporting programs) moves the deadline by as much: the
        deadline is the devices' time."""

    def wait_for_devices(self, count: int, timeout_s: float) -> int:
        """Handle traffic until ``count`` devices are online (or the timeout); how many are."""
        return len(self.online())

    def accepted_before(self, round_number: int) -> list[ClientUpdate]:
        """Updates of ``round_number`` accepted before a restart of the server (their round
        was interrupted); empty for a round never opened."""
        return []

    def close_round(self, round_number: int, row: dict) -> None:  # noqa: B027 - optional
        """The round is over (its metrics row); later results for it are refused."""

    def poll(self, timeout_s: float) -> None:  # noqa: B027 - optional
        """Handle incoming traffic between rounds for up to ``timeout_s`` seconds."""

    def live(self) -> LiveRound | None:
        """A copy of the open round's progress (None: no round open). Safe from any thread."""
        return None

    def traffic(self) -> tuple[int, int]:
        """Bytes sent to and received from devices so far: (down, up)."""
        return 0, 0

    def close(self) -> None:  # noqa: B027 - optional
        """Release what the grid holds (threads, connections)."""
