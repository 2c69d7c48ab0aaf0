"""The MQTT grid: real devices reached through an ``Endpoint`` and a fleet registry.

An exchange: export each task's programs (before the deadline starts counting against the
devices) -> persist the task record -> offer its blobs and send the task, with at most
``task_window`` devices pulling at once and traffic handled meanwhile (``task_pacing.py``) ->
handle incoming traffic until quorum, every device asked resolved, or the deadline -> pull each
result, validate it, persist it, and only then acknowledge it. Invalid input (bad messages,
unknown devices or tasks, wrong shapes, NaN, oversized or corrupt blobs, late results) is
rejected, recorded in the registry under its task's round, logged and answered with an
``error``; the round goes on. Garbage on a device's topics that names nothing of its own (an
envelope error, a result for a task it does not have, a ``hello`` naming another device, an
``error`` about no task of its own) is booked so at most once per (device, code) a minute, the
rest only counted (``_books``; the endpoint's ``RejectionLimit``): a flood costs a few counter
updates a message, not a committed registry row each. A rejection of the device's own data (a
record pulled from it that hashes to its id but is no valid update, or a replay) resolves the
device for the round, so the round closes when the others are in; any other rejection leaves the
task open: only an accepted result, such a rejection, a refusal or the device going offline
(mid-upload: after a grace) resolves it (``rounds/results.py``); it is sent again when its
device may have missed it (``mqtt_presence.py``). When the exchange ends, its result pulls still
running are cancelled. The registry (devices, tiers, revocations, tasks, updates) survives
server restarts: ``accepted_before`` returns a restarted round's updates with the instructions
they answered.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

from export.programs import ProgramCache
from fedcore import modelspec
from sdk_device.protocol import messages as msgs
from sdk_device.protocol.blobs import encode_tensors
from sdk_device.protocol.epoch import ServerEpoch, announce_window
from sdk_device.protocol.errors import ProtocolError
from sdk_device.protocol.task_plan import plan_config
from sdk_device.runtimes.pte_contract import PORTABLE
from sdk_device.transport.endpoint import Endpoint, Incoming

from ..fleet.registry import FleetRegistry
from ..methods.base import MODEL, ClientUpdate, DeviceInfo, TrainInstruction
from ..methods.tiers import resolve_tier
from .grid import Exchange, Grid, LiveRound
from .kernel_fallback import KernelFallback
from .mqtt_live import live_round
from .mqtt_presence import Presence
from .result_pulls import ResultPulls
from .results import PendingTask, check_records, features_request, result_key
from .task_pacing import DEFAULT_WINDOW, TaskPacer
from .task_records import stored_update, task_record

log = logging.getLogger(__name__)


class MqttGrid(ResultPulls, Presence, KernelFallback, Grid):
    """The devices of ``registry`` reachable through ``endpoint``.

    ``program_formats``: the program formats offered with each task; ``pte_kernels``: the kernel
    set of its pte/1 programs (a device that refuses it gets portable ones: ``kernel_fallback.py``);
    ``max_update_factor``:
    an update may be at most this times the bytes sent (+64 KiB); ``fetch_timeout_s``: how
    long pulling one result may take; ``task_window``: devices pulling their task's blobs at once.
    """

    def __init__(self, endpoint: Endpoint, registry: FleetRegistry, program_formats: list[str] | None = None,
                 max_update_factor: float = 2.0, fetch_timeout_s: float = 120.0,
                 task_window: int = DEFAULT_WINDOW, pte_kernels: str = PORTABLE) -> None:
        self.endpoint = endpoint
        self.registry = registry
        self.programs = ProgramCache(program_formats or [modelspec.FORMAT], kernels=pte_kernels)
        self._portable_only: set[str] = set()  # devices that refused fused programs (kernel_fallback.py)
        self.max_update_factor = max_update_factor
        self.fetch_timeout_s = fetch_timeout_s
        self.pacer = TaskPacer(task_window)
        self.devices: dict[str, DeviceInfo] = {}  # online devices, by id
        self._pending: dict[str, PendingTask] = {}  # tasks of the open round
        self._task_of: dict[str, str] = {}  # device -> id of the last task sent to it
        self._closed_tasks: dict[str, int] = {}  # task id -> round, for tasks of recent closed rounds
        self._open_round: int | None = None
        self._deadline = 0.0  # of the open round
        self._lock = threading.RLock()  # _accept rejects while holding it
        self._fetchers = ThreadPoolExecutor(max_workers=4, thread_name_prefix="fetch")
        # one pull per blob id at a time: pulls of one id share its partial file (two edges' equal
        # coverage records); blob ids hash to one of 64 locks
        self._blob_locks = [threading.Lock() for _ in range(64)]
        self._resolved: set[str] = set()  # devices of the open round accepted, refused or gone
        self._left: set[str] = set()  # devices of the open round gone offline with their task open
        self._away: dict[str, float] = {}  # of those, left mid-upload -> monotonic s it is awaited until
        self._accepted: list[str] = []  # task ids accepted in the open exchange, in order
        self._rejections: dict[str, int] = {}  # code -> count in the open exchange
        self._last_rejection: dict[str, str] = {}  # device -> code of its last rejection in it
        self._pulls: dict[tuple, tuple[str, msgs.Result, Future]] = {}  # result_key -> running pull
        self._encoded: dict[int, tuple[dict, bytes]] = {}  # (_encode)
        self.progress: dict[str, float] = {}  # device -> last reported training progress (0..1)
        self._answers: dict[str, tuple[str, msgs.Message]] = {}  # task id -> (device, ack or final error)
        self._connects_seen = self._link_connects()  # (mqtt_presence.py)
        # A new server instance, a new epoch: every connected device says hello again, spread
        # over the announce window (docs/protocol.md §3.1).
        self.epoch = ServerEpoch.new(announce_window(len(registry.devices())))
        if endpoint is not None:  # (unit tests build a grid without one)
            endpoint.announce_epoch(self.epoch)
        log.info("server epoch %s: devices re-announce within %.1f s", self.epoch.epoch[:8],
                 self.epoch.announce_window_s)

    # -- the Grid interface --------------------------------------------------------------------
    def online(self) -> list[DeviceInfo]:
        # The registry is the truth for revocations and tiers (`fedsdk-server devices revoke|retier`
        # may change them while we run); it answers from memory, without a query per device.
        return sorted((DeviceInfo(d.device_id, d.num_samples, resolve_tier(self.registry.tier_of(d.device_id),
                                                                            d.profile), d.runtimes,
                                  d.profile) for d in list(self.devices.values())
                       if self.registry.is_known(d.device_id)), key=lambda d: d.device_id)

    def wait_for_devices(self, count: int, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while len(self.devices) < count and time.monotonic() < deadline:
            self._pump(timeout_s=0.2)
        return len(self.devices)

    def poll(self, timeout_s: float) -> None:
        self._pump(timeout_s)

    def live(self) -> LiveRound | None:
        return live_round(self)  # rounds/mqtt_live.py

    def traffic(self) -> tuple[int, int]:
        return self.endpoint.bytes_sent, self.endpoint.bytes_received

    def close(self) -> None:
        self._cancel_pulls("the server is stopping")
        self._fetchers.shutdown(wait=False, cancel_futures=True)
        self.registry.flush()  # the devices' hello bookkeeping, written behind

    def accepted_before(self, round_number: int) -> list[ClientUpdate]:
        info = self.registry.round_info(round_number)
        if info is None or info["status"] != "open":
            return []
        return [self._load_update(row) for row in self.registry.updates(round_number)]

    def exchange(self, round_number: int, instructions: list[TrainInstruction], deadline: float,
                 quorum: int) -> Exchange:
        exporting = time.time()  # export first: the deadline is the devices' time, so it moves
        for instruction in (i for i in instructions if not i.programs):
            self.programs_for(instruction.device_id, instruction.spec, instruction.recipe)
        deadline += time.time() - exporting
        earlier = [u["device_id"] for u in self.registry.updates(round_number)]
        self.registry.open_round(round_number, sorted({*earlier, *(i.device_id for i in instructions)}), "")
        asked = {i.device_id for i in instructions}
        with self._lock:
            self._open_round, self._resolved, self._accepted, self._rejections = round_number, set(), [], {}
            self._left, self._deadline, self._last_rejection, self._away = set(), deadline, {}, {}
            self.progress = {d: p for d, p in self.progress.items() if d not in asked}  # a new task
        self.pacer.begin()
        self._encoded = {}  # id(weights) -> (weights, bytes): the tensors do not change in an exchange
        for instruction in instructions:  # results and refusals are handled while tasks go out
            while not self.pacer.has_room(self.endpoint, self._resolved) and time.time() < deadline:
                self._pump(timeout_s=0.02)
            self._send_task(round_number, instruction, deadline)
        # every device gone at once (a broker restart): wait for them to come back until the deadline
        while (len(self._accepted) < quorum and not (asked <= self._resolved and not asked <= self._left)
               and time.time() < deadline):
            self._pump(timeout_s=0.1)
        with self._lock:
            self._open_round = None  # late results are now rejected as round_closed
            accepted, rejections = list(self._accepted), dict(self._rejections)
            left = bool(asked) and asked <= self._resolved | self._away.keys()  # (away: offline too)
        self._cancel_pulls(f"round {round_number} closed")
        rows = {u["task_id"]: u for u in self.registry.updates(round_number)}
        return Exchange([self._load_update(rows[t]) for t in accepted if t in rows], rejections, left)

    def close_round(self, round_number: int, row: dict) -> None:
        self.registry.close_round(round_number, row)
        self._closed_tasks.update({k: p.round for k, p in self._pending.items() if p.round <= round_number})
        self._closed_tasks = {k: r for k, r in self._closed_tasks.items() if r > round_number - 10}
        self._pending = {k: p for k, p in self._pending.items() if p.round > round_number}

    # -- sending -------------------------------------------------------------------------------
    def _send_task(self, rnd: int, instruction: TrainInstruction, deadline: float) -> None:
        """Offer every model's programs and weights, persist the task, send it (protocol v2)."""
        dev = instruction.device_id
        programs, arrays, program_blobs, sent_bytes, references = {}, {}, {}, {}, {}
        for name, model in instruction.all_models().items():
            built = model.programs
            if not built:  # "model" in every format offered; other models for the torch runtime
                built = (tuple(self.programs_for(dev, model.spec, instruction.recipe)) if name == MODEL
                         else ((modelspec.FORMAT, modelspec.dumps(model.spec)),))
            programs[name] = [self.endpoint.offer(dev, data, "program", fmt) for fmt, data in built]
            program_blobs[name] = [(ref.format, ref.id) for ref in programs[name]]
            blob = self._encode(model.weights)
            arrays[name] = self.endpoint.offer(dev, blob, "weights", "safetensors")
            if name in instruction.returns:
                sent_bytes[name] = len(blob)
                references[name] = {k: (tuple(v.shape), str(v.dtype)) for k, v in model.weights.items()}
        scored = instruction.deploys if instruction.holdout and instruction.deploys != MODEL else None
        task = msgs.Task(task_id=msgs.new_id(), round=rnd, programs=programs, arrays=arrays,
                         config=plan_config(instruction.plan()), deadline=deadline,
                         holdout=instruction.holdout or None, holdout_model=scored,
                         holdout_ensemble=instruction.holdout_ensemble or None,  # set only with holdout
                         holdout_members=list(instruction.holdout_members) or None)
        self.registry.add_task(task.task_id, rnd, dev, task_record(
            instruction, {name: ref.id for name, ref in arrays.items()}, program_blobs))
        self._pending[task.task_id] = PendingTask(task.task_id, rnd, instruction, sent_bytes, references,
                                               features_request(instruction), task=task)
        self._task_of[dev] = task.task_id
        self.endpoint.send(dev, task)
        self.pacer.sent(dev, [arrays[name].id for name in instruction.returns])

    def _encode(self, weights: dict) -> bytes:
        """``encode_tensors(weights)``, once per weights object of the open exchange: a method
        sends most devices the same dict (FedAvg: all), and encoding and hashing it again for each
        task cost the edge about a tenth of its CPU per update (issue 31)."""
        cached = self._encoded.get(id(weights))
        if cached is None or cached[0] is not weights:
            cached = self._encoded[id(weights)] = (weights, encode_tensors(weights))
            while len(self._encoded) > 4:  # (async rounds send tasks outside an exchange)
                self._encoded.pop(next(iter(self._encoded)))
        return cached[1]

    # -- incoming traffic ----------------------------------------------------------------------
    def _pump(self, timeout_s: float) -> None:  # one incoming item, if any arrives within timeout_s
        self._check_reconnect()
        self._check_away()  # mqtt_presence.py
        try:
            incoming = self.endpoint.inbox.get(timeout=timeout_s)
        except queue.Empty:
            return
        self._handle(incoming)

    def _handle(self, incoming: Incoming) -> None:
        dev, message = incoming.peer, incoming.message
        if incoming.rejected is not None:  # garbage on its topic: not a reason to stop waiting for it
            rejected = incoming.rejected
            self._record_rejection(self._open_round, dev, None, rejected.code, rejected.detail)
        elif incoming.status is not None:
            self._on_status(dev, incoming.status)
        elif isinstance(message, msgs.Hello):
            self._on_hello(dev, message)
        elif isinstance(message, msgs.Result):
            self._on_result(dev, message)
        elif isinstance(message, msgs.Heartbeat):
            self.progress[dev] = message.progress
        elif isinstance(message, msgs.Error):
            self._on_device_error(dev, message)  # mqtt_presence.py

    def _round_of(self, dev: str, task_id: str | None) -> int | None:
        """The round of ``dev``'s task ``task_id`` (also of closed rounds and before a restart);
        the open round when there is no such task."""
        task = self._pending.get(task_id or "")
        if task is not None and task.instruction.device_id == dev:
            return task.round
        if task_id and task_id in self._closed_tasks:
            return self._closed_tasks[task_id]
        known = self.registry.task_round(task_id, dev) if task_id else None
        return known if known is not None else self._open_round

    def _books(self, dev: str, code: str) -> bool:
        """Whether a rejection of ``dev``'s message naming nothing of its own is booked (logged,
        answered, recorded): once per (device, code) a minute (``inbox.RejectionLimit``)."""
        return self.endpoint.rejections.admit(dev, code)

    def _record_rejection(self, rnd: int | None, dev: str, task_id: str | None, code: str,
                          detail: str) -> None:
        self.registry.add_rejection(rnd, dev, task_id, code, detail)
        with self._lock:
            if rnd is not None and rnd == self._open_round:
                self._rejections[code] = self._rejections.get(code, 0) + 1
                self._last_rejection[dev] = code

    def _on_result(self, dev: str, result: msgs.Result) -> None:
        """Check a result and start pulling it; a rejected one leaves its task open."""
        # Re-offer (protocol §9.5): a result acknowledged before gets its ack again and is never
        # counted twice. Keep this first; the validation below is separate.
        if self._answer_again(dev, result):
            return
        pending = self._pending.get(result.task_id)
        with self._lock:
            open_round = self._open_round
        if pending is None or pending.instruction.device_id != dev:
            if pending is None and (result.task_id in self._closed_tasks or self._closed_before(result, dev)):
                rnd = self._round_of(dev, result.task_id)
                self._reject(dev, result.task_id, ProtocolError("round_closed", f"round {rnd} is over"), rnd)
            elif self._books(dev, "unknown_task"):
                err = ProtocolError("unknown_task", "no such task for this device")
                self._reject(dev, result.task_id, err, open_round)
            return
        key = result_key(result)
        with self._lock:
            duplicate = pending.answered or key in self._pulls
        if duplicate:  # QoS 1 may deliver a message twice: the first one counts
            log.info("ignoring a second result for task %s from %s", result.task_id[:8], dev)
            return
        try:
            if result.round != pending.round or not self._task_open(pending):
                raise ProtocolError("invalid_field", f"task is of round {pending.round}")
            check_records(result, pending, self.max_update_factor)
        except ProtocolError as err:
            self._reject(dev, result.task_id, err, pending.round)
            return
        with self._lock:
            self._pulls[key] = (dev, result, self._fetchers.submit(self._accept, dev, result, pending, key,
                                                                   self.endpoint.comebacks.get(dev, 0)))

    def _closed_before(self, result: msgs.Result, dev: str) -> bool:
        """Whether ``dev``'s task of ``result`` is of a round the registry has closed (a task sent
        before a restart; one of a round not closed then is unknown to this server instance)."""
        rnd = self.registry.task_round(result.task_id, dev)
        return rnd is not None and (self.registry.round_info(rnd) or {}).get("status") == "closed"

    def _task_open(self, pending: PendingTask) -> bool:  # its results are taken (async: mqtt_async.py)
        return pending.round == self._open_round

    def _reject(self, dev: str, task_id: str | None, err: ProtocolError, rnd: int | None,
                tell: bool = True, pending: PendingTask | None = None) -> None:
        """Record (round ``rnd``), log, and (``tell``) send the device an Error. The task stays
        open, except when ``pending`` is given (its device's own data was bad): then it is
        refused, the device is resolved for the round and a repeat gets the same error."""
        log.warning("rejected result from %s (round %s): %s", dev, rnd, err)
        self._record_rejection(rnd, dev, task_id, err.code, err.detail)
        error = msgs.Error(code=err.code, detail=err.detail[:500], ref=task_id)
        if pending is not None:
            with self._lock:
                if not pending.answered and self._task_open(pending):
                    pending.refused = True
                    self._resolved.add(dev)
                    self._answers[pending.task_id] = (dev, error)
        if tell:
            self.endpoint.send(dev, error)

    def _answer_again(self, dev: str, result: msgs.Result) -> bool:
        """Re-send the ack of a result of ``dev``'s task accepted before (by this server instance,
        or an update an earlier instance persisted); False otherwise (then the usual checks
        answer it: a result whose pull failed is pulled again while its task is open, one of a
        closed round gets round_closed)."""
        dev_answer = self._answers.get(result.task_id)
        if dev_answer is None and result.task_id not in self._pending and any(
                u["task_id"] == result.task_id and u["device_id"] == dev
                for u in self.registry.updates(result.round)):
            dev_answer = (dev, msgs.Ack(ref=result.task_id, detail="persisted"))
        if dev_answer is None or dev_answer[0] != dev:
            return False
        log.info("result of task %s from %s again: acknowledging it again", result.task_id[:8], dev)
        self.endpoint.send(dev, dev_answer[1])
        return True

    def _acknowledge(self, dev: str, task_id: str) -> None:
        """Send the ack of an accepted result and remember it for repeats (protocol §9.5)."""
        ack = msgs.Ack(ref=task_id, detail="persisted")
        self._answers[task_id] = (dev, ack)
        while len(self._answers) > 100_000:
            self._answers.pop(next(iter(self._answers)))
        self.endpoint.send(dev, ack)

    def _load_update(self, row: dict) -> ClientUpdate:
        """An accepted update (a registry row) with the instruction it answered."""
        pending = self._pending.get(row["task_id"])
        instruction = pending.instruction if pending is not None else None  # None: from its task record
        decoded = pending.decoded if pending is not None else None
        if pending is not None:
            pending.decoded = None  # the update holds them now
        return stored_update(row, instruction, self.registry, self.endpoint.store, decoded)
