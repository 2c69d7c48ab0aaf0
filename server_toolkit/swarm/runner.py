"""The swarm: N simulated devices split over a few processes, with summed counters."""

from __future__ import annotations

import multiprocessing as mp
import time
from dataclasses import dataclass

from ..fleet.device_ids import numbered_ids
from .counters import Counters
from .shard import ShardConfig, run_shard


@dataclass(frozen=True)
class SwarmConfig:
    """A swarm of ``devices`` devices named ``<prefix><index>`` from ``first`` (the ids of
    ``fedsdk-server devices add --count devices --prefix prefix --start first``),
    in ``processes`` processes, connecting at ``connect_rate`` devices per second in total
    (0: all at once)."""

    broker_url: str
    fleet: str
    devices: int = 100
    processes: int = 1
    prefix: str = "swarm-"
    first: int = 0
    connect_rate: float = 500.0
    heartbeat_s: float = 10.0
    fail_fraction: float = 0.0
    pull_programs: bool = True
    username: str | None = None
    password: str | None = None
    ca_file: str | None = None
    insecure: bool = False

    def device_ids(self) -> list[str]:
        return swarm_ids(self.prefix, self.devices, self.first)

    def shards(self) -> list[ShardConfig]:
        """One ``ShardConfig`` per process (devices dealt round-robin)."""
        ids = self.device_ids()
        count = max(1, min(self.processes, len(ids)))
        return [ShardConfig(self.broker_url, self.fleet, tuple(ids[i::count]), self.connect_rate / count,
                            self.heartbeat_s, self.fail_fraction, self.pull_programs, self.username,
                            self.password, self.ca_file, self.insecure)
                for i in range(count)]


def swarm_ids(prefix: str, count: int, first: int = 0) -> list[str]:
    """The device ids of a swarm, exactly those ``fedsdk-server devices add --count COUNT
    --prefix PREFIX --start FIRST`` registers: the index zero-padded to the digits of the last
    one (``swarm-0000`` … ``swarm-9999`` for 10,000)."""
    return numbered_ids(prefix, count, first)


class Swarm:
    """Start with ``start()``; read ``counters()``; ``stop()`` closes every device cleanly."""

    def __init__(self, config: SwarmConfig) -> None:
        self.config = config
        self._ctx = mp.get_context("spawn")  # no inherited threads or sockets
        self._shards = config.shards()
        self._values = self._ctx.Array("q", len(self._shards) * Counters.width(), lock=False)
        self._stop = self._ctx.Event()
        self._procs: list = []

    def start(self) -> Swarm:
        for row, shard in enumerate(self._shards):
            proc = self._ctx.Process(target=run_shard, args=(shard, self._values, row, self._stop),
                                     name=f"swarm-{row}", daemon=True)
            proc.start()
            self._procs.append(proc)
        return self

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs if p.pid is not None]

    def counters(self) -> Counters:
        width = Counters.width()
        values = list(self._values)
        return Counters.total([tuple(values[r * width:(r + 1) * width]) for r in range(len(self._shards))])

    def alive(self) -> bool:
        return all(p.is_alive() for p in self._procs)

    def wait(self, condition, timeout_s: float, poll_s: float = 0.2) -> bool:
        """Wait until ``condition(counters)`` holds; False after ``timeout_s`` seconds or if a
        process died."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if condition(self.counters()):
                return True
            if not self.alive():
                return False
            time.sleep(poll_s)
        return condition(self.counters())

    def stop(self, timeout_s: float = 15.0) -> None:
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        for proc in self._procs:
            proc.join(max(0.1, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(5)

    def __enter__(self) -> Swarm:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
