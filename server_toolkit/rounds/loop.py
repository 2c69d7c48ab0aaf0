"""The round loop: the one place where a federated round happens.

Per round: select devices from the grid (over-selecting to absorb dropouts) -> ask the
method what each trains (``configure_train``) -> stamp each task's training seed (and the
outputs the method asks of every task) -> let
the grid exchange tasks for results until quorum or deadline -> ``aggregate_train`` ->
``aggregate_evaluate`` -> central ``evaluate`` (and any extra evaluators) -> checkpoint ->
one metrics row (with the seconds the method spent in each step: ``time_configure_s``,
``time_aggregate_s`` (aggregate_train and aggregate_evaluate), ``time_evaluate_s``).
``fedsdk-server run``, ``simulate`` (either grid), edge aggregators and
every benchmark drive their rounds through this class.

Fleet: ``run`` starts a round only with at least ``min_devices`` online; until then it waits,
logging why every ``status_every_s``, and raises ``FleetLost`` after ``fleet_timeout_s``. A
run in which no round accepted any update raises ``NoUpdates``: never a silent success.
Aggregation is the aggregation stack's (``rounds/aggregator.py``), built once by the server
assembly (``assembly.py:aggregation_stack``) from the run's options: the method's aggregate
under the layers the run asks for (norm bound, privacy, secure sum, edges, async buffering).
The loop calls it and knows no feature by name; a layer may end the run before a round
(``StopRun``, e.g. a spent ``--dp-epsilon`` budget; ``stopped`` says why). Without a stack
the loop builds the plain one: the method's aggregate under the norm bound
(``rounds/norm_bound.py``, ``LoopConfig.norm_bound``). The quality guard
(``rounds/quality_guard.py``, ``LoopConfig.on_divergence``) judges each central evaluation:
it keeps the best weights and, when the model diverges, puts them back (and scales the devices'
lr down) or stops the run.

Seeds: the selection draws from ``random.Random(seed)`` (its state is checkpointed); each
task trains with ``task_seed(seed, round, device)``, so a device shuffles its data alike on
the in-process and the MQTT grid, and differently in every round.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..methods.base import ClientUpdate, DeviceInfo, Method, TrainInstruction, Weights
from ..methods.holdout_accuracy import holdout_row
from ..methods.tier_accuracy import TierAccuracy
from ..methods.tiers import with_tier_overrides
from .aggregator import Aggregator, MethodAggregate, RoundInput, StopRun
from .checkpoint import load_checkpoint, save_checkpoint
from .grid import Grid
from .norm_bound import DEFAULT_FACTOR, NormBound
from .quality_guard import QualityGuard

log = logging.getLogger(__name__)

RoundCallback = Callable[[dict], None]
Evaluator = Callable[[int, Weights], dict]  # (round, global weights) -> metrics for the row


@dataclass
class LoopConfig:
    """Round settings. ``clients_per_round`` = quorum (else ``fraction`` of the online
    devices; neither: every online device); ``over_select`` = extra fraction of devices
    asked, to absorb dropouts; ``round_timeout_s`` = the devices' time per round;
    ``min_devices`` = devices online before ``run`` starts a round, waiting at most
    ``fleet_timeout_s``; ``norm_bound`` = an update's delta may be at most this times the
    round's median delta (None: no bound)."""

    rounds: int = 20
    clients_per_round: int | None = None
    fraction: float | None = None
    over_select: float = 0.0
    round_timeout_s: float = 120.0
    seed: int = 0
    keep_checkpoints: int = 3  # the newest checkpoints kept in the run directory (>= 1)
    tier_map: dict[str, str] = dataclasses.field(default_factory=dict)  # device id -> tier, overrides
    min_devices: int = 1
    fleet_timeout_s: float = 600.0
    status_every_s: float = 30.0
    norm_bound: float | None = DEFAULT_FACTOR  # read by the plain stack (plain_stack)
    on_divergence: str = "rollback"  # --on-divergence: rollback, stop or continue (rounds/quality_guard.py)
    holdout: float = 0.0  # --holdout: task.holdout of every task (sdk_device/holdout.py)
    # task.holdout_ensemble of every task (with holdout > 0) even when the method does not deploy an
    # ensemble: an edge's group relays its server's (edge/aggregator.py)
    holdout_ensemble: bool = False


class FleetLost(RuntimeError):
    """Fewer than ``min_devices`` devices came back within ``fleet_timeout_s``."""


class NoUpdates(RuntimeError):
    """Rounds ran, and not one of them accepted an update."""


def task_seed(run_seed: int, round_number: int, device_id: str) -> int:
    """The seed one device trains one round's task with, in [0, 2**31)."""
    digest = hashlib.sha256(f"{run_seed}/{round_number}/{device_id}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


class RoundLoop:
    """Drives ``method`` over the devices of ``grid``.

    ``run_dir``: where checkpoints go (None: no checkpoints, e.g. a benchmark);
    ``test_data``: (x, y) for the method's central ``evaluate``; ``evaluators``: more
    per-round measurements merged into each row; ``on_round``: called with each row;
    ``aggregator``: the aggregation stack over ``method`` (None: ``plain_stack``).
    """

    def __init__(self, method: Method, grid: Grid, config: LoopConfig, run_dir: Path | None = None,
                 test_data: tuple[np.ndarray, np.ndarray] | None = None,
                 on_round: RoundCallback | None = None, evaluators: tuple[Evaluator, ...] = (),
                 aggregator: Aggregator | None = None) -> None:
        self.method = method
        self.grid = grid
        self.config = config
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.test_data = test_data
        self.on_round = on_round
        self.evaluators = evaluators
        self.tiers = TierAccuracy()  # the devices seen online, for accuracy_tier_<tier>
        self.global_weights: Weights = {}
        self.completed_round = 0
        self.last_updates: list[ClientUpdate] = []
        self._rng = random.Random(config.seed)
        self.aggregator = aggregator if aggregator is not None else plain_stack(method, config.norm_bound)
        if self.aggregator.method is not method:
            raise ValueError("the aggregation stack was built over another method than the loop's")
        self.stopped: str | None = None  # why the run ended early (a spent privacy budget, a divergence)
        # the model-quality guard watches the server's evaluation: none without test data (an edge)
        self.guard = QualityGuard(config.on_divergence, self.run_dir) if test_data is not None else None

    # -- set-up ------------------------------------------------------------------------------
    def start(self, resume: bool = False) -> None:
        """Load the last checkpoint (``resume``, when there is one) or make fresh weights."""
        found = load_checkpoint(self.run_dir) if resume and self.run_dir is not None else None
        if found:
            self.completed_round, self.global_weights, state = found
            self.method.load_state_dict(state.get("method_state", {}))
            if "rng" in state:
                self._rng.setstate(_tuple_state(state["rng"]))
            self.aggregator.load_state_dict(state)
            if self.guard:
                self.guard.load_state_dict(state.get("guard", {}))
            log.info("resuming after round %d from %s", self.completed_round, state["checkpoint"])
        else:
            self.global_weights = self.method.initial_weights(self.config.seed)

    # -- rounds ------------------------------------------------------------------------------
    def run(self) -> list[dict]:
        """Run rounds ``completed_round + 1 .. config.rounds``, each once ``min_devices`` are
        online; their metric rows. Raises ``FleetLost`` or ``NoUpdates`` (module docstring)."""
        rows = []
        for rnd in range(self.completed_round + 1, self.config.rounds + 1):
            self.wait_for_fleet(rnd)
            try:
                rows.append(self.run_round(rnd))
            except StopRun as spent:
                self.stopped = str(spent)
                log.warning("%s", spent)
                if self.completed_round == 0:
                    raise NoUpdates(str(spent)) from None
                break
            if self.stopped:  # the quality guard stopped the run
                break
        if rows and not any(r["accepted"] for r in rows):
            raise NoUpdates(f"rounds {rows[0]['round']}-{rows[-1]['round']} accepted no update; "
                            "the global model never changed")
        return rows

    def wait_for_fleet(self, rnd: int) -> None:
        """Return once ``min_devices`` are online; ``FleetLost`` after ``fleet_timeout_s``."""
        need, timeout = self.config.min_devices, self.config.fleet_timeout_s
        online = len(self.grid.online())
        if online >= need:
            return
        started = time.monotonic()
        last_status = -math.inf
        while online < need:
            waited = time.monotonic() - started
            if waited >= timeout:
                raise FleetLost(f"round {rnd}: only {online}/{need} devices (--min-devices) came back "
                                f"within {timeout:.0f} s (--fleet-timeout); stopping")
            if waited - last_status >= self.config.status_every_s:
                log.warning("round %d waits: %d devices online, need %d (--min-devices); %.0f s "
                            "left of --fleet-timeout", rnd, online, need, timeout - waited)
                last_status = waited
            self.grid.wait_for_devices(need, timeout_s=min(1.0, timeout - waited))
            online = len(self.grid.online())
        log.info("round %d: %d devices online after %.0f s; going on", rnd, online,
                 time.monotonic() - started)

    def run_round(self, rnd: int) -> dict:
        """One round (see the module docstring); returns its metrics row."""
        started = time.monotonic()
        already = self.grid.accepted_before(rnd)
        online = self.grid.online()  # once per round: a fleet of 10,000 builds 10,000 DeviceInfo
        wanted = self._wanted(len(online))
        selected = [] if wanted is not None and len(already) >= wanted else \
            self._select(online, wanted, exclude={u.device_id for u in already})
        quorum = len(selected) + len(already) if wanted is None else min(wanted, len(selected) + len(already))
        rate = min(1.0, quorum / max(len(online), 1))  # the sampling rate the privacy accountant charges
        self.aggregator.admit(rnd, rate)
        clock = time.perf_counter()
        instructions = [self._finish(rnd, i) for i in
                        self.aggregator.configure(rnd, self.global_weights, selected)] if selected else []
        configure_s = time.perf_counter() - clock
        deadline = time.time() + self.config.round_timeout_s
        log.info("round %d opens: %d device(s) asked of %d online, %d update(s) needed", rnd, len(selected),
                 len(online), quorum - len(already))
        exchange = self.grid.exchange(rnd, instructions, deadline, max(0, quorum - len(already)))
        if already:
            log.info("round %d: %d updates were accepted before the restart", rnd, len(already))
        # arrival order differs between grids and runs; the aggregate must not depend on it
        updates = self.aggregator.unpack(sorted(already + exchange.updates, key=lambda u: u.device_id))
        row: dict = {"round": rnd, "selected": len(selected) + len(already), "accepted": len(updates),
                     "rejected": exchange.rejected,
                     "refused_policy": exchange.rejections.get("device:policy", 0)}  # fedsdk run --only-when
        clock = time.perf_counter()
        if updates:
            self.global_weights = self.aggregator.aggregate(rnd, self.global_weights, updates,
                                                            RoundInput(rate, row, exchange))
            row.update(self.method.aggregate_evaluate(rnd, updates))
            row.update(holdout_row(updates, self.tiers.devices))  # the devices' held-back splits
        else:
            log.warning("round %d: no update accepted (%s); global model unchanged", rnd,
                        _why_empty(selected, exchange, deadline))
        aggregate_s = time.perf_counter() - clock
        clock = time.perf_counter()
        row.update(metrics := self.evaluate_global(rnd))
        self.check_quality(rnd, metrics, row)
        evaluate_s = time.perf_counter() - clock
        row["seconds"] = time.monotonic() - started
        row["bytes_down"], row["bytes_up"] = self.grid.traffic()
        row.update(time_configure_s=configure_s, time_aggregate_s=aggregate_s, time_evaluate_s=evaluate_s)
        if self.run_dir is not None:
            save_checkpoint(self.run_dir, rnd, self.global_weights,
                            {"method_state": self.method.state_dict(), "rng": self._rng.getstate(),
                             "method": self.method.name, "privacy": {}, **self.aggregator.state_dict(),
                             "guard": self.guard.state_dict() if self.guard else {}},
                            keep=self.config.keep_checkpoints)
        self.grid.close_round(rnd, row)
        self.completed_round = rnd
        self.last_updates = updates
        if self.on_round:
            self.on_round(row)
        return row

    def evaluate_global(self, rnd: int) -> dict:
        """The global model's metrics for a row: the method's evaluation on the test data, each
        tier's deployable accuracy (``methods/tier_accuracy.py``), then every extra evaluator's
        (``rnd`` = round, or version in async mode)."""
        metrics: dict = {}
        if self.test_data is not None:
            metrics.update(self.method.evaluate(self.global_weights, *self.test_data))
            metrics.update(self.tiers.evaluate(self.method, self.global_weights, *self.test_data))
        for evaluator in self.evaluators:
            metrics.update(evaluator(rnd, self.global_weights))
        return metrics

    def check_quality(self, rnd: int, metrics: dict, row: dict) -> None:
        """The quality guard's turn, after the evaluation and before the checkpoint: it may put
        the best weights (and the method's state then) back or stop the run
        (``rounds/quality_guard.py``); ``row`` gets the device lr scale its tasks trained with
        when that is not 1."""
        if self.guard is None or not metrics:
            return
        if self.guard.lr_scale != 1.0:
            row["lr_scale"] = self.guard.lr_scale
        self.guard.observe(rnd, metrics, self.global_weights, row, self.method.state_dict)
        if self.guard.restore is not None:
            self.global_weights = self.guard.restore
            self.method.load_state_dict(self.guard.restore_state)
        self.stopped = self.guard.stop or self.stopped

    def _finish(self, rnd: int, instruction: TrainInstruction) -> TrainInstruction:
        """``instruction`` with this round's seed for this device in every step's recipe, and
        the outputs the method asks of every task (``Method.asks``). An edge relaying a bundle's
        member tasks (``Method.stamped``) keeps the server's stamps. After a rollback the quality
        guard's ``lr_scale`` multiplies every recipe's ``lr``."""
        if self.method.stamped:
            return instruction
        seed = task_seed(self.config.seed, rnd, instruction.device_id)
        scale = self.guard.lr_scale if self.guard else 1.0
        before = tuple(dataclasses.replace(s, recipe=dataclasses.replace(s.recipe, seed=seed,
                                                                          lr=s.recipe.lr * scale))
                       for s in instruction.steps_before)
        recipe = dataclasses.replace(instruction.recipe, seed=seed, lr=instruction.recipe.lr * scale)
        ensemble = self.config.holdout > 0 and (self.config.holdout_ensemble
                                                or bool(getattr(self.method, "deploys_ensemble", False)))
        instruction = self._with_members(instruction) if self.config.holdout > 0 \
            else dataclasses.replace(instruction, holdout_members=())
        out = dataclasses.replace(instruction, recipe=recipe, holdout=self.config.holdout,
                                  holdout_ensemble=ensemble, steps_before=before,
                                  reports={**self.method.asks, **instruction.reports})
        return self.aggregator.finish(out, lambda member: self._finish(rnd, member))  # a bundle's members

    def _with_members(self, instruction: TrainInstruction) -> TrainInstruction:
        """``instruction`` with the models its device scores beside the deployed one on its
        held-back split (``Method.holdout_members``), unless it names them already (an edge's
        relayed task) or is a bundle (its members get one model each: they score their own)."""
        device = self.tiers.devices.get(instruction.device_id)
        hook = getattr(self.method, "holdout_members", None)  # test doubles need not be Methods
        if instruction.holdout_members or device is None or hook is None or instruction.context.get("edge"):
            return instruction
        extra, names = hook(self.global_weights, device, instruction)
        return dataclasses.replace(instruction, models={**instruction.models, **extra}, holdout_members=names)

    def _select(self, online: list[DeviceInfo], want: int | None, exclude: set[str]) -> list[DeviceInfo]:
        """Devices for this round out of ``online`` (tiers final: the grid's, then ``tier_map``'s;
        ``methods/tiers.py``); ``want`` None: all of them."""
        tiered = with_tier_overrides(online, self.config.tier_map)
        self.tiers.see(tiered)
        candidates = [d for d in tiered if d.device_id not in exclude]
        if want is None:
            return candidates
        count = min(len(candidates), math.ceil(want * (1 + self.config.over_select)))
        return self._rng.sample(candidates, count)

    def _wanted(self, online: int) -> int | None:
        """The round's quorum for ``online`` devices (None: every one of them)."""
        if self.config.clients_per_round is not None:
            return self.config.clients_per_round
        if self.config.fraction is not None:
            return max(1, math.ceil(self.config.fraction * online))
        return None


def plain_stack(method: Method, norm_bound: float | None = DEFAULT_FACTOR) -> Aggregator:
    """The stack of a run with no aggregation feature: the method's aggregate under the norm
    bound (when ``norm_bound`` is set and the method ``bounds_updates``)."""
    bottom = MethodAggregate(method)
    return NormBound(bottom, norm_bound) if norm_bound is not None and method.bounds_updates else bottom


def _why_empty(selected: list[DeviceInfo], exchange, deadline: float) -> str:
    """Why a round closed with no update, in words."""
    if not selected:
        return "no device was selected"
    if exchange.left:
        return f"all {len(selected)} selected devices went offline or refused"
    if time.time() >= deadline:
        return "no update arrived before the deadline"
    return "every result was rejected"


def _tuple_state(state):
    """JSON turns random.getstate()'s tuples into lists; turn them back."""
    return tuple(_tuple_state(s) if isinstance(s, list) else s for s in state)
