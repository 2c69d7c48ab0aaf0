"""The asynchronous MQTT grid: ``MqttGrid``'s tasks, validation and persistence, without rounds.

Every task, result pull, check, persistence and acknowledgement is ``MqttGrid``'s; what
differs is when a result is taken: any task not expired is open (``_task_open``), whatever
version it was made from. A task made from version ``v`` is persisted under registry round
``v + 1`` (the version it would make were it fresh), so after a restart the updates the
registry holds say which version they were trained on (``recovered``). A task expires
``timeout_s`` after it was sent: its device counts as idle again, and a late result is
refused as ``round_closed`` (never accepted, so never lost). A task whose result is rejected for
the device's own data (NaN, wrong shape, a replay: ``results.check_pulled``) closes at once, as
a round resolves such a device: its device is idle again and may get the next task, so the
buffer keeps filling; a repeat of that result gets the same error.
"""

from __future__ import annotations

import time

from ..methods.base import DeviceInfo, TrainInstruction
from .async_grid import Arrival, AsyncGrid
from .grid import TRAINING, LiveRound
from .mqtt_grid import MqttGrid
from .results import PendingTask


class AsyncMqttGrid(MqttGrid, AsyncGrid):
    """The devices of ``registry`` through ``endpoint``, one open task per device at most."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._expires: dict[str, float] = {}  # open task id -> when it expires (unix seconds)
        self._version = 0  # the newest version tasks are made from
        self._rejected = self._expired = 0  # since the last counters() call
        self._settled: set[str] = set()  # accepted tasks whose ack is sent and offers withdrawn

    # -- MqttGrid hooks ------------------------------------------------------------------------
    def _task_open(self, pending: PendingTask) -> bool:
        return pending.task_id in self._expires

    def _record_rejection(self, *args) -> None:  # (rnd, dev, task_id, code, detail): also counted here
        super()._record_rejection(*args)
        _rnd, dev, task_id, code, _detail = args
        with self._lock:
            self._rejected += 1
            pending = self._pending.get(task_id or "")
            if code.startswith("device:") and pending is not None and pending.instruction.device_id == dev:
                self._expires[task_id] = 0.0  # it refused its task: free it for a new one now

    def _reject(self, dev, task_id, err, rnd, tell=True, pending=None) -> None:  # (MqttGrid's)
        super()._reject(dev, task_id, err, rnd, tell, pending)
        with self._lock:  # refused for its own data: the task is over, its device idle now
            if pending is not None and pending.refused and pending.task_id in self._expires:
                del self._expires[pending.task_id]
                self._pending.pop(pending.task_id, None)
                self._closed_tasks[pending.task_id] = pending.round

    def _task_replaced(self, old: PendingTask) -> None:  # (KernelFallback hook): it keeps the expiry
        self._expires[next(reversed(self._pending))] = self._expires.pop(old.task_id, time.time())
        self._closed_tasks[old.task_id] = self._pending.pop(old.task_id).round

    def _accept(self, *args) -> None:  # (dev, result, pending, key), on a fetch thread
        super()._accept(*args)
        with self._lock:  # only now may the device get a new task: the ack's withdraw() is done
            if args[1].task_id in self._accepted:  # (not when the pull or the checks failed)
                self._settled.add(args[1].task_id)

    # -- the AsyncGrid interface ---------------------------------------------------------------
    def idle(self) -> list[DeviceInfo]:
        with self._lock:
            busy = {self._pending[t].instruction.device_id for t in self._expires if t in self._pending}
        return [d for d in self.online() if d.device_id not in busy]

    def open_version(self, version: int) -> None:
        self.registry.open_round(version + 1, [], "")
        with self._lock:
            self._version, self._open_round = version, version + 1

    def submit(self, version: int, instructions: list[TrainInstruction], timeout_s: float) -> None:
        for instruction in instructions:  # export first: the time limit is the devices' time
            if not instruction.programs:
                self.programs_for(instruction.device_id, instruction.spec, instruction.recipe)
        for instruction in instructions:
            expires = time.time() + timeout_s
            with self._lock:  # a fast device's result must find its task open
                self._send_task(version + 1, instruction, expires)
                self._expires[next(reversed(self._pending))] = expires  # the task just sent

    def arrivals(self, timeout_s: float) -> list[Arrival]:
        until = time.monotonic() + timeout_s
        while not self._settled and time.monotonic() < until:
            self._pump(timeout_s=min(0.05, max(0.0, until - time.monotonic())))
        while self._pump_ready():
            pass
        self._expire(time.time())
        with self._lock:  # the longest prefix (acceptance order) of updates whose ack is out
            count = 0
            while count < len(self._accepted) and self._accepted[count] in self._settled:
                count += 1
            taken, self._accepted = self._accepted[:count], self._accepted[count:]
            self._settled -= set(taken)
            self._resolved, self._left = set(), set()  # (MqttGrid's round bookkeeping: unused here)
        rows = self._rows({self._pending[t].round for t in taken})
        out = [Arrival(self._load_update(rows[t]), self._pending[t].round - 1) for t in taken]
        with self._lock:
            for task_id in taken:  # answered: forget it (a repeat of its result is acked again)
                self._expires.pop(task_id, None)
                self._closed_tasks[task_id] = self._pending.pop(task_id).round
        return out

    def recovered(self, consumed: int) -> list[Arrival]:
        rows, rnd = [], 1
        while self.registry.round_info(rnd) is not None:  # rounds 1 .. newest version + 1, all opened
            rows += self.registry.updates(rnd)
            rnd += 1
        rows = sorted(rows, key=lambda row: row["id"])[consumed:]
        return [Arrival(self._load_update(row), row["round"] - 1) for row in rows]

    def in_flight(self) -> dict[int, int]:
        out: dict[int, int] = {}
        with self._lock:
            for task_id in self._expires:
                base = self._pending[task_id].round - 1
                out[base] = out.get(base, 0) + 1
        return out

    def counters(self) -> dict[str, int]:
        with self._lock:
            out = {"rejected": self._rejected, "expired": self._expired}
            self._rejected = self._expired = 0
        return out

    def live(self) -> LiveRound | None:
        with self._lock:
            asked = {self._pending[t].instruction.device_id: t for t in self._expires if t in self._pending}
            deadline = max(self._expires.values(), default=time.time())
            progress = {dev: self.progress[dev] for dev in asked if dev in self.progress}
            return LiveRound(self._version + 1, sorted(asked), [], {}, deadline,
                             dict.fromkeys(sorted(asked), TRAINING), progress)

    # -- helpers -------------------------------------------------------------------------------
    def _pump_ready(self) -> bool:
        """Handle one item already waiting in the inbox; False when there is none."""
        if self.endpoint.inbox.empty():
            return False
        self._pump(timeout_s=0.0)
        return True

    def _expire(self, now: float) -> None:
        """Close the tasks whose time is up (their late results are refused as round_closed)."""
        with self._lock:
            for task_id in [t for t, expires in self._expires.items() if expires < now]:
                pending = self._pending.get(task_id)
                if pending is not None and pending.answered:
                    continue  # accepted in time; ``arrivals`` takes it
                del self._expires[task_id]
                if pending is not None:
                    self._closed_tasks[task_id] = self._pending.pop(task_id).round
                self._expired += 1

    def _rows(self, rounds: set[int]) -> dict[str, dict]:
        """The registry rows of the updates of ``rounds``, by task id."""
        return {row["task_id"]: row for rnd in rounds for row in self.registry.updates(rnd)}

