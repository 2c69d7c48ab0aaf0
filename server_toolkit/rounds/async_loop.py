"""The asynchronous loop (``--mode async``): buffered asynchronous aggregation (FedBuff).

No rounds: every idle device gets a task made from the newest global version (at most
``concurrency`` devices train at once), and the server takes updates as they are accepted.
An update made from version ``b`` arriving at version ``v`` has staleness ``tau = v - b``;
with ``tau > max_staleness`` it is dropped (counted in ``dropped_stale``), else it joins the
buffer. Every ``buffer`` (K) updates the buffer is folded into the global model
(``rounds/staleness.py``: staleness-weighted deltas through the method's own aggregation,
times ``server_lr``), which makes the next version; then evaluate, checkpoint, one metrics
row. ``LoopConfig.rounds`` is the number of versions to make; ``round_timeout_s`` is a task's
time limit (then it expires and its device gets a new one).

The versions devices still train on stay alive in their tasks: a task carries the weights
it was made from (persisted with the task on the MQTT grid), and the delta is taken against
those, so nothing else is kept; ``versions_alive`` in a row counts them (``in_flight``).

A metrics row per version: ``round`` (= ``version``), ``accepted`` (updates taken since the
previous row), ``folded`` (K), ``dropped_stale``, ``staleness_mean`` / ``staleness_max`` (of
the folded ones), ``rejected``, ``expired`` (tasks that timed out), ``versions_alive``,
``tasks_sent``, ``buffered`` (last row only: updates the loop had taken but not folded when the
run ended; the grid may have accepted more meanwhile: a ``--resume`` folds them all),
``accuracy`` / ``loss``, ``seconds`` (since the previous row) and ``wall_s`` (since start).

The quality guard (``rounds/quality_guard.py``) judges every evaluated version as the round
loop's judges a round; after a rollback to the best weights, updates made from a version before
the rollback are dropped (counted in ``dropped_stale``): they trained the diverged model.

Aggregation is the stack's (``rounds/aggregator.py``): its ``StalenessFold`` layer folds the
buffer (``fold_buffer``), the layers under it aggregate the scaled deltas. Without a stack the
loop builds ``async_stack``: the norm bound over ``StalenessFold`` over the method.

Edge aggregators (``edge/``, the stack's ``EdgeFold``): a generic edge is dispatched like a
device but sent the global model (``edge/fold.configure``); it runs one synchronous group
round from that version and answers its group's partial aggregate, which ``fold_buffer`` folds
with the devices' deltas. It counts as the device updates it carries (the stack's ``carried``)
in ``accepted``, ``folded``, ``dropped_stale``, the staleness statistics and towards K;
``edge_results`` counts the partials folded into a version. A bundle edge's answer (``edge/bundle.py``: each
member's update, for methods that are not sums) joins the buffer as its members' updates,
all of the edge's base. An edge the method cannot use, or any device the stack leaves out
(``configure``, with an error in the log: under ``--secagg`` every unit but a secure edge) gets
no task until it says hello with another profile.

``eval_every`` (``--eval-every N``): the global model is evaluated on versions N, 2N, ... and
the last one only; the other rows carry no ``accuracy`` / ``loss``. Evaluating blocks the
loop (nothing is dispatched or taken meanwhile), so with fast versions it is most of the
server's time.

Checkpoints: as the round loop's, plus ``async``: the updates consumed so far (folded or
dropped, a prefix of the grid's acceptance order; the buffer is empty after a fold). A
resumed run asks the grid for the updates accepted after that prefix (``recovered``), so an
acknowledged update is never lost to a restart.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from ..methods.abilities import async_refusal
from ..methods.base import Method
from ..methods.holdout_accuracy import holdout_row
from .aggregator import Aggregator, MethodAggregate, RoundInput, StopRun
from .async_grid import Arrival, AsyncGrid
from .checkpoint import load_checkpoint, save_checkpoint
from .loop import LoopConfig, NoUpdates, RoundLoop
from .norm_bound import NormBound
from .staleness import BufferedUpdate, StalenessFold, staleness_stats

log = logging.getLogger(__name__)


@dataclass
class AsyncConfig:
    """``buffer``: K, updates per version (>= 1); ``max_staleness``: S, versions an update may
    lag (>= 0); ``concurrency``: devices training at once (None: every online device);
    ``server_lr``: the step on the folded delta (1.0: plain average; see ``staleness.py``)."""

    buffer: int = 5  # FedBuff's experiments use 10 with hundreds of concurrent clients
    max_staleness: int = 20  # a 10x straggler among 10 devices lags ~14 versions at K = 5
    concurrency: int | None = None
    server_lr: float = 1.0
    eval_every: int = 1  # evaluate the global model every this many versions (and the last)


class AsyncLoop(RoundLoop):
    """Drives ``method`` over the devices of an async ``grid`` (ValueError, one line, when the
    method cannot run asynchronously). Checkpoints, evaluation and callbacks as ``RoundLoop``."""

    def __init__(self, method: Method, grid: AsyncGrid, config: LoopConfig, async_config: AsyncConfig,
                 aggregator: Aggregator | None = None, **kwargs) -> None:
        refusal = async_refusal(method)
        if refusal:
            raise ValueError(refusal)
        if aggregator is None:
            aggregator = async_stack(method, config.norm_bound, async_config.server_lr)
        super().__init__(method, grid, config, aggregator=aggregator,  # type: ignore[arg-type] - online()
                         **kwargs)
        self.grid: AsyncGrid = grid
        self.async_config = async_config
        self.buffer: list[BufferedUpdate] = []
        self.consumed = 0  # updates taken from the grid and folded or dropped, over the run
        self.tasks_sent = 0
        self._since = {"accepted": 0, "dropped_stale": 0, "tasks_sent": 0}
        self._left_out: dict[str, str] = {}  # device -> its profile when configure gave it no task
        self._started = self._last_row = time.monotonic()

    def start(self, resume: bool = False) -> None:
        super().start(resume)
        found = load_checkpoint(self.run_dir) if resume and self.run_dir is not None else None
        if found:
            state = found[2].get("async", {})
            self.consumed, self.tasks_sent = int(state.get("consumed", 0)), int(state.get("tasks_sent", 0))
        self.grid.open_version(self.completed_round)
        self._recovered = self.grid.recovered(self.consumed) if resume else []
        if self._recovered:
            log.info("resuming: %d updates accepted before the restart join the buffer", len(self._recovered))

    def run(self) -> list[dict]:
        """Make versions ``completed_round + 1 .. config.rounds``; their metric rows. Raises
        ``FleetLost`` (``min_devices``) or ``NoUpdates`` (nothing accepted for a task time
        limit plus ``fleet_timeout_s``)."""
        rows: list[dict] = []
        pending, self._recovered = list(self._recovered), []
        self._started = self._last_row = last_take = time.monotonic()
        patience = self.config.round_timeout_s + self.config.fleet_timeout_s
        while self.completed_round < self.config.rounds and not self.stopped:  # stopped: the quality guard
            self.wait_for_fleet(self.completed_round + 1)
            self._dispatch()
            pending += self.grid.arrivals(timeout_s=0.2)
            if pending:
                last_take = time.monotonic()
            while pending and self.completed_round < self.config.rounds and not self.stopped:
                self._take(pending.pop(0))
                if sum(self.aggregator.carried(b.update) for b in self.buffer) >= self.async_config.buffer:
                    last = self.completed_round + 1 == self.config.rounds
                    try:
                        self.aggregator.admit(self.completed_round + 1, 1.0)  # e.g. the privacy budget
                    except StopRun as spent:
                        self._stop_early(str(spent))
                        break
                    rows.append(self._fold(buffered=len(pending) if last else 0))  # the buffer empties
            if time.monotonic() - last_take > patience:
                raise NoUpdates(f"no update accepted for {patience:.0f} s (--round-timeout + "
                                f"--fleet-timeout) at version {self.completed_round}")
        return rows

    def _stop_early(self, why: str) -> None:
        """A layer of the stack ended the run before the next version (``StopRun``)."""
        self.stopped = why
        log.warning("%s", why)
        if self.completed_round == 0:
            raise NoUpdates(why)

    # -- steps -------------------------------------------------------------------------------
    def _dispatch(self) -> None:
        """A task from the newest version for idle devices, up to ``concurrency`` training."""
        online, idle = self.grid.online(), self.grid.idle()
        busy = len(online) - len(idle)  # online devices training: one gone offline holds no slot
        idle = [d for d in idle if self._left_out.get(d.device_id) != _profile(d)]
        limit = self.async_config.concurrency or len(online)
        room = min(len(idle), limit - busy)
        if room <= 0:
            return
        chosen = self._select(idle, room if room < len(idle) else None, exclude=set())[:room]
        version = self.completed_round
        planned = self.aggregator.configure(version + 1, self.global_weights, chosen)  # edges: the global one
        given = {ins.device_id for ins in planned}
        self._left_out.update({d.device_id: _profile(d) for d in chosen  # (configure logged why, once)
                               if d.device_id not in given})
        instructions = [self._finish(self.tasks_sent + i + 1, ins) for i, ins in enumerate(planned)]  # seeds
        self.grid.submit(version, instructions, self.config.round_timeout_s)
        self.tasks_sent += len(instructions)
        self._since["tasks_sent"] += len(instructions)

    def _take(self, arrival: Arrival) -> None:
        """Into the buffer, or dropped when older than ``max_staleness`` versions. A bundle
        edge's answer joins as its members' updates, all of its base (``edge/bundle.py``)."""
        staleness = self.completed_round - arrival.base
        updates = self.aggregator.unpack([arrival.update])
        count = sum(self.aggregator.carried(u) for u in updates)  # an edge's partial: the devices behind it
        self._since["accepted"] += count
        self.consumed += 1  # registry entries, folded (by the next checkpoint) or dropped
        if self.guard and arrival.base < self.guard.rolled_back_at:  # trained before a rollback
            log.info("version %d: dropped the update of %s made from version %d, before the rollback at "
                     "version %d", self.completed_round, arrival.update.device_id, arrival.base,
                     self.guard.rolled_back_at)
            self._since["dropped_stale"] += count
            return
        if staleness > self.async_config.max_staleness:
            log.info("version %d: dropped the update of %s made from version %d (staleness %d > %d)",
                     self.completed_round, arrival.update.device_id, arrival.base, staleness,
                     self.async_config.max_staleness)
            self._since["dropped_stale"] += count
            return
        self.buffer += [BufferedUpdate(u, arrival.base, staleness) for u in updates]

    def _fold(self, buffered: int) -> dict:
        """Fold the buffer into the next version; evaluate, checkpoint, report it."""
        version = self.completed_round + 1
        batch, self.buffer = self.buffer, []
        row: dict = {"round": version, "version": version, "accepted": self._since["accepted"],
                     "selected": self._since["tasks_sent"],
                     "folded": sum(self.aggregator.carried(b.update) for b in batch),
                     "edge_results": sum(self.aggregator.is_partial(b.update) for b in batch),
                     "dropped_stale": self._since["dropped_stale"],
                     **staleness_stats(batch, self.aggregator.carried), **self.grid.counters()}
        clock = time.perf_counter()
        info = RoundInput(row=row, staleness=[b.staleness for b in batch], bases=[b.base for b in batch])
        updates = [b.update for b in batch]
        self.global_weights = self.aggregator.aggregate(version, self.global_weights, updates, info)
        row.update(self.method.aggregate_evaluate(version, updates))
        row.update(holdout_row(updates, self.tiers.devices))  # the devices' held-back splits
        aggregate_s = time.perf_counter() - clock
        clock = time.perf_counter()
        every = max(1, self.async_config.eval_every)
        if version % every == 0 or version == self.config.rounds:
            row.update(metrics := self.evaluate_global(version))
            self.check_quality(version, metrics, row)
        now = time.monotonic()
        row.update(versions_alive=len(self.grid.in_flight()), tasks_sent=self._since["tasks_sent"],
                   buffered=buffered, seconds=now - self._last_row, wall_s=now - self._started,
                   time_aggregate_s=aggregate_s, time_evaluate_s=time.perf_counter() - clock)
        row["bytes_down"], row["bytes_up"] = self.grid.traffic()
        self._last_row = now
        self._since = dict.fromkeys(self._since, 0)
        if self.run_dir is not None:
            save_checkpoint(self.run_dir, version, self.global_weights,
                            {"method_state": self.method.state_dict(), "rng": self._rng.getstate(),
                             "method": self.method.name, "mode": "async", **self.aggregator.state_dict(),
                             "async": {"consumed": self.consumed, "tasks_sent": self.tasks_sent},
                             "guard": self.guard.state_dict() if self.guard else {}},
                            keep=self.config.keep_checkpoints)
        self.completed_round = version
        self.last_updates = [b.update for b in batch]
        self.grid.open_version(version)
        log.info("version %d: folded %d updates (%d of edges; staleness mean %.2f, max %d), %d dropped as "
                 "stale", version, row["folded"], row["edge_results"], row["staleness_mean"],
                 row["staleness_max"], row["dropped_stale"])
        if self.on_round:
            self.on_round(row)
        return row


def async_stack(method: Method, norm_bound: float | None, server_lr: float = 1.0) -> Aggregator:
    """The async stack of a run with no other aggregation feature: the norm bound (when set and
    the method ``bounds_updates``) over ``StalenessFold`` over the method's aggregate."""
    stack: Aggregator = StalenessFold(MethodAggregate(method), server_lr)
    return NormBound(stack, norm_bound) if norm_bound is not None and method.bounds_updates else stack


def _profile(device) -> str:
    """A device's hello profile as a comparable string (an edge left out is tried again when it
    changes, e.g. restarted with the server's method)."""
    return repr(sorted(device.profile.items()))
