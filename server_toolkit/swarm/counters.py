"""What a swarm process has done so far: plain integer counters, summed over processes."""

from __future__ import annotations

from dataclasses import astuple, dataclass, fields


@dataclass
class Counters:
    """Counts of one swarm process (``connected`` is a current value, the rest are totals)."""

    connected: int = 0  # devices with a live MQTT session now
    connects: int = 0  # CONNACKs received (first connects and reconnects)
    hellos: int = 0  # hello messages sent
    reoffers: int = 0  # results sent again (after a reconnect or a server restart)
    tasks: int = 0  # tasks received
    results: int = 0  # results sent
    accepted: int = 0  # results the server acknowledged
    rejected: int = 0  # results the server refused (error with ref = task id)
    refused: int = 0  # tasks this swarm refused (error sent)
    errors: int = 0  # other errors and malformed messages received
    chunks_served: int = 0  # chunk frames published for the server's blob requests
    vanished: int = 0  # devices killed by the --fail-fraction hook

    @classmethod
    def width(cls) -> int:
        return len(fields(cls))

    def values(self) -> tuple[int, ...]:
        return astuple(self)

    @classmethod
    def total(cls, rows: list[tuple[int, ...]]) -> Counters:
        """The element-wise sum of several processes' ``values()``."""
        return cls(*(sum(column) for column in zip(*rows, strict=True))) if rows else cls()

    def status_line(self, devices: int) -> str:
        """One line for the console."""
        return (f"{self.connected}/{devices} connected, {self.hellos} hellos, {self.tasks} tasks, "
                f"{self.results} answered, {self.reoffers} re-offered, {self.accepted} accepted, "
                f"{self.rejected} rejected, {self.refused} refused, {self.vanished} vanished")
