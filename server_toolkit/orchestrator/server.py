"""The orchestrator: runs rounds over the fleet.

Per round: select devices (over-selecting to absorb dropouts) -> ask the method what each
trains -> send tasks with a deadline -> pull each result, validate it, persist it, then
acknowledge it -> stop at quorum or deadline -> aggregate -> evaluate -> checkpoint.
Invalid input (bad messages, unknown devices, wrong shapes, NaN, oversized or corrupt
blobs, late results) is rejected, recorded in the registry and logged; the round goes on.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import queue
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from export.programs import ProgramCache
from sdk_device.protocol import messages as msgs
from sdk_device.protocol import modelspec
from sdk_device.protocol.blobs import check_update, decode_tensors, encode_tensors
from sdk_device.protocol.errors import ProtocolError
from sdk_device.protocol.smashed import check_smashed
from sdk_device.transport.endpoint import Endpoint, Incoming

from ..fleet.registry import FleetRegistry
from ..methods.base import TEACHER_PREFIX, ClientUpdate, DeviceInfo, Method, TrainInstruction, Weights
from .checkpoint import load_checkpoint, save_checkpoint

log = logging.getLogger(__name__)


@dataclass
class OrchestratorConfig:
    """Round settings. ``clients_per_round`` = quorum (or ``fraction`` of the online devices;
    neither: every online device);
    ``over_select`` = extra fraction of devices asked, to absorb dropouts."""

    rounds: int = 20
    clients_per_round: int | None = None
    fraction: float | None = None  # quorum as a fraction of online devices (if no count given)
    over_select: float = 0.0
    round_timeout_s: float = 120.0
    seed: int = 0
    max_update_factor: float = 2.0  # an update may be at most this x the weights sent (+64 KiB)
    program_formats: list[str] = field(default_factory=lambda: [modelspec.FORMAT])  # offered per task


@dataclass
class _Pending:
    task_id: str
    round: int
    instruction: TrainInstruction
    sent_bytes: int
    reference: dict  # name -> (shape, dtype) the update must have
    answered: bool = False


RoundCallback = Callable[[dict], None]


class Orchestrator:
    """Drives ``method`` over the devices reachable through ``endpoint``."""

    def __init__(
        self,
        method: Method,
        endpoint: Endpoint,
        registry: FleetRegistry,
        run_dir: Path,
        config: OrchestratorConfig,
        test_data: tuple[np.ndarray, np.ndarray] | None = None,
        on_round: RoundCallback | None = None,
    ) -> None:
        self.method = method
        self.endpoint = endpoint
        self.registry = registry
        self.run_dir = Path(run_dir)
        self.config = config
        self.test_data = test_data
        self.on_round = on_round
        self.online: dict[str, DeviceInfo] = {}
        self.global_weights: Weights = {}
        self.completed_round = 0
        self._rng = random.Random(config.seed)
        self._pending: dict[str, _Pending] = {}  # tasks of the open round
        self._closed_tasks: dict[str, int] = {}  # task id -> round, for tasks of closed rounds
        self._open_round: int | None = None
        self._lock = threading.Lock()
        self._fetchers = ThreadPoolExecutor(max_workers=4, thread_name_prefix="fetch")
        self._fetches: list[Future] = []
        self._progress: dict[str, float] = {}
        self._resolved: set[str] = set()  # devices of the open round accepted or rejected
        self.programs = ProgramCache(config.program_formats)

    # -- set-up ------------------------------------------------------------------------------
    def start(self, resume: bool = False) -> None:
        """Load the last checkpoint (``resume``) or make fresh global weights."""
        found = load_checkpoint(self.run_dir) if resume else None
        if found:
            self.completed_round, self.global_weights, state = found
            self.method.load_state_dict(state.get("method_state", {}))
            if "rng" in state:
                self._rng.setstate(_tuple_state(state["rng"]))
            log.info("resuming after round %d from %s", self.completed_round, state["checkpoint"])
        else:
            self.global_weights = self.method.initial_weights(self.config.seed)

    def wait_for_devices(self, count: int, timeout_s: float) -> int:
        """Handle traffic until ``count`` devices said hello (or the timeout); returns how many."""
        deadline = time.monotonic() + timeout_s
        while len(self.online) < count and time.monotonic() < deadline:
            self._pump(timeout_s=0.2)
        return len(self.online)

    def poll(self, timeout_s: float) -> None:
        """Handle incoming traffic (hellos, statuses, stray messages) for up to ``timeout_s``
        between rounds."""
        self._pump(timeout_s)

    def close(self) -> None:
        self._fetchers.shutdown(wait=False, cancel_futures=True)

    # -- rounds ------------------------------------------------------------------------------
    def run(self) -> list[dict]:
        """Run rounds ``completed_round + 1 .. config.rounds``; returns their metric rows."""
        rows = []
        for rnd in range(self.completed_round + 1, self.config.rounds + 1):
            rows.append(self.run_round(rnd))
        return rows

    def run_round(self, rnd: int) -> dict:
        started = time.monotonic()
        previous = self.registry.round_info(rnd)
        already = {u["device_id"] for u in self.registry.updates(rnd)} if previous else set()
        selected = self._select(exclude=already)
        quorum = self._quorum(len(selected) + len(already))
        global_blob = encode_tensors(self.global_weights)
        self.registry.open_round(rnd, sorted(already | {d.device_id for d in selected}), _sha(global_blob))
        asked = already | {d.device_id for d in selected}
        with self._lock:
            self._open_round = rnd
            self._resolved = set(already)
        instructions = self.method.configure_train(rnd, self.global_weights, selected)
        for instruction in instructions:  # export programs first: the deadline is the devices' time
            self.programs.programs(instruction.spec, instruction.recipe)
        deadline = time.time() + self.config.round_timeout_s
        for instruction in instructions:
            self._send_task(rnd, instruction, deadline)
        if already:
            log.info("round %d: %d updates were accepted before the restart", rnd, len(already))
        while (
            self.registry.count_updates(rnd) < quorum
            and not asked <= self._resolved
            and time.time() < deadline
        ):
            self._pump(timeout_s=0.1)
        with self._lock:
            self._open_round = None  # late results are now rejected as round_closed
        accepted = self.registry.updates(rnd)
        row = {
            "round": rnd,
            "selected": len(selected) + len(already),
            "accepted": len(accepted),
            "rejected": len(self.registry.rejections(rnd)),
        }
        if accepted:
            updates = [self._load_update(u) for u in accepted]
            self.global_weights = self.method.aggregate_train(rnd, self.global_weights, updates)
            row.update(self.method.aggregate_evaluate(rnd, updates))
        else:
            log.warning("round %d: no update arrived before the deadline; global model unchanged", rnd)
        if self.test_data is not None:
            row.update(self.method.evaluate(self.global_weights, *self.test_data))
        row["seconds"] = time.monotonic() - started
        row["bytes_down"], row["bytes_up"] = self.endpoint.bytes_sent, self.endpoint.bytes_received
        save_checkpoint(
            self.run_dir,
            rnd,
            self.global_weights,
            {
                "method_state": self.method.state_dict(),
                "rng": self._rng.getstate(),
                "method": self.method.name,
            },
        )
        self.registry.close_round(rnd, row)
        self.completed_round = rnd
        self._closed_tasks.update({k: p.round for k, p in self._pending.items() if p.round <= rnd})
        self._closed_tasks = {k: r for k, r in self._closed_tasks.items() if r > rnd - 10}
        self._pending = {k: p for k, p in self._pending.items() if p.round > rnd}
        if self.on_round:
            self.on_round(row)
        return row

    def _select(self, exclude: set[str]) -> list[DeviceInfo]:
        # The registry is the truth for revocations and tiers (`fedsdk-server devices revoke|retier`
        # may change them while we run).
        candidates = sorted(
            (dataclasses.replace(d, tier=self.registry.tier_of(d.device_id)) for d in self.online.values()
             if d.device_id not in exclude and self.registry.is_known(d.device_id)),
            key=lambda d: d.device_id,
        )
        want = self._wanted()
        if want is None:
            return candidates
        count = min(len(candidates), math.ceil(want * (1 + self.config.over_select)))
        return self._rng.sample(candidates, count)

    def _wanted(self) -> int | None:
        if self.config.clients_per_round is not None:
            return self.config.clients_per_round
        if self.config.fraction is not None:
            return max(1, math.ceil(self.config.fraction * len(self.online)))
        return None

    def _quorum(self, asked: int) -> int:
        want = self._wanted()
        return asked if want is None else min(want, asked)

    def _send_task(self, rnd: int, instruction: TrainInstruction, deadline: float) -> None:
        dev = instruction.device_id
        built = instruction.programs or self.programs.programs(instruction.spec, instruction.recipe)
        programs = [self.endpoint.offer(dev, data, "program", fmt) for fmt, data in built]
        weights_blob = encode_tensors(instruction.weights)
        weights = self.endpoint.offer(dev, weights_blob, "weights", "safetensors")
        reference = {k: (tuple(v.shape), str(v.dtype)) for k, v in instruction.weights.items()}
        expected_bytes = len(weights_blob)
        teacher = None
        if instruction.teacher is not None:  # the teacher runs on the device's torch runtime
            spec, teacher_weights = instruction.teacher.spec, instruction.teacher.weights
            teacher_blob = encode_tensors(teacher_weights)
            teacher = msgs.Teacher(
                programs=[self.endpoint.offer(dev, modelspec.dumps(spec), "program", modelspec.FORMAT)],
                weights=self.endpoint.offer(dev, teacher_blob, "weights", "safetensors"),
                train=instruction.teacher.train,
            )
            if instruction.teacher.train:
                expected_bytes += len(teacher_blob)
                reference.update({TEACHER_PREFIX + k: (tuple(v.shape), str(v.dtype))
                                  for k, v in teacher_weights.items()})
        task = msgs.Task(
            task_id=msgs.new_id(),
            round=rnd,
            programs=programs,
            weights=weights,
            recipe=instruction.recipe.to_dict(),
            deadline=deadline,
            teacher=teacher,
            smashed=instruction.smashed.samples if instruction.smashed else 0,
        )
        self._pending[task.task_id] = _Pending(task.task_id, rnd, instruction, expected_bytes, reference)
        self.endpoint.send(dev, task)

    # -- incoming traffic --------------------------------------------------------------------
    def _pump(self, timeout_s: float) -> None:
        """Handle one incoming item (if any arrives within ``timeout_s``)."""
        try:
            incoming = self.endpoint.inbox.get(timeout=timeout_s)
        except queue.Empty:
            return
        self._handle(incoming)

    def _handle(self, incoming: Incoming) -> None:
        dev, message = incoming.peer, incoming.message
        if incoming.rejected is not None:
            self._resolved.add(dev)  # nothing more is expected from a device sending garbage
            self.registry.add_rejection(
                self._open_round, dev, None, incoming.rejected.code, incoming.rejected.detail
            )
        elif incoming.status is not None:
            self._on_status(dev, incoming.status)
        elif isinstance(message, msgs.Hello):
            self._on_hello(dev, message)
        elif isinstance(message, msgs.Result):
            self._on_result(dev, message)
        elif isinstance(message, msgs.Heartbeat):
            self._progress[dev] = message.progress
        elif isinstance(message, msgs.Error):
            log.warning("device %s reports %s: %s", dev, message.code, message.detail)
            if message.ref in self._pending:
                self._resolved.add(dev)  # it refused its task
            self.registry.add_rejection(
                self._open_round, dev, message.ref, f"device:{message.code}", message.detail
            )

    def _on_status(self, dev: str, status: str) -> None:
        """Last will / reconnect of a device: leave or rejoin the pool of selectable devices."""
        if status == "offline" and dev in self.online:
            log.warning("device %s went offline", dev)
            self.online.pop(dev, None)
            self._resolved.add(dev)  # do not hold the round for it
            self.registry.set_status(dev, "offline")
        elif status == "online" and dev not in self.online:
            known = self.registry.device(dev)
            if known and known["num_samples"]:  # it said hello before: it is back
                self.online[dev] = DeviceInfo(
                    dev,
                    known["num_samples"],
                    known["tier"],
                    tuple(known["runtimes"] or ()),
                    known["profile"] or {},
                )
                self.registry.set_status(dev, "online")
                log.info("device %s is back online", dev)

    def _on_hello(self, dev: str, hello: msgs.Hello) -> None:
        if hello.device_id != dev:
            self._reject(dev, None, ProtocolError("invalid_field", "hello names another device"))
            return
        self.registry.record_hello(dev, hello.profile, hello.runtimes, hello.num_samples)
        tier = (self.registry.device(dev) or {}).get("tier")
        self.online[dev] = DeviceInfo(dev, hello.num_samples, tier, tuple(hello.runtimes), hello.profile)
        log.info("device %s online: %d samples, runtimes %s", dev, hello.num_samples, hello.runtimes)

    def _on_result(self, dev: str, result: msgs.Result) -> None:
        pending = self._pending.get(result.task_id)
        with self._lock:
            open_round = self._open_round
        if result.task_id in self._closed_tasks:
            rnd = self._closed_tasks[result.task_id]
            self._reject(dev, result.task_id, ProtocolError("round_closed", f"round {rnd} is over"), rnd)
            return
        if pending is None or pending.instruction.device_id != dev:
            self._reject(dev, result.task_id, ProtocolError("unknown_task", "no such task for this device"))
            return
        if pending.answered:  # QoS 1 may deliver a message twice: the first one counts
            log.info("ignoring a second result for task %s from %s", result.task_id[:8], dev)
            return
        if result.round != pending.round or pending.round != open_round:
            self._reject(
                dev, result.task_id, ProtocolError("invalid_field", f"task is of round {pending.round}")
            )
            return
        limit = int(pending.sent_bytes * self.config.max_update_factor) + 65536
        if result.weights.size > limit:
            self._reject(
                dev,
                result.task_id,
                ProtocolError(
                    "too_large", f"update of {result.weights.size} bytes; at most {limit} expected"
                ),
            )
            return
        samples = result.metrics.get("samples")
        if type(samples) is not int or samples <= 0:
            self._reject(dev, result.task_id, ProtocolError("invalid_field", "metrics.samples must be > 0"))
            return
        pending.answered = True  # one result per task
        self._fetches.append(self._fetchers.submit(self._accept, dev, result, pending))

    def _accept(self, dev: str, result: msgs.Result, pending: _Pending) -> None:
        """Pull, validate and persist one result, then acknowledge it (fetch thread)."""
        try:
            data = self.endpoint.fetch(
                dev, result.weights, durable=True, timeout_s=self.config.round_timeout_s
            )
            check_update(decode_tensors(data), pending.reference)
            smashed_id = self._accept_smashed(dev, result, pending)
        except (ProtocolError, TimeoutError) as exc:
            err = exc if isinstance(exc, ProtocolError) else ProtocolError("timeout", str(exc))
            self._reject(dev, result.task_id, err)
            return
        with self._lock:
            if self._open_round != pending.round:
                self._reject(dev, result.task_id, ProtocolError("round_closed", "the round closed meanwhile"))
                return
            metrics = {k: v for k, v in result.metrics.items() if k != "smashed_blob"}  # the server's key
            if smashed_id:
                metrics["smashed_blob"] = smashed_id
            self.registry.add_update(
                pending.round, dev, result.task_id, result.weights.id, result.metrics["samples"], metrics
            )
            self._resolved.add(dev)
        self.endpoint.send(dev, msgs.Ack(ref=result.task_id, detail="persisted"))
        self.endpoint.withdraw(dev)
        log.info(
            "round %d: accepted update from %s (%d samples)", pending.round, dev, result.metrics["samples"]
        )

    def _accept_smashed(self, dev: str, result: msgs.Result, pending: _Pending) -> str | None:
        """Pull and check the smashed data the task asked for (fetch thread); its blob id.
        Smashed data nobody asked for is not pulled; a device may send none."""
        request = pending.instruction.smashed
        if result.smashed is None or request is None:
            return None
        if result.smashed.size > request.max_bytes():
            raise ProtocolError(
                "too_large", f"smashed data of {result.smashed.size} bytes; at most {request.max_bytes()}"
            )
        data = self.endpoint.fetch(dev, result.smashed, durable=True, timeout_s=self.config.round_timeout_s)
        check_smashed(decode_tensors(data), request)
        return result.smashed.id

    def _reject(self, dev: str, task_id: str | None, err: ProtocolError, rnd: int | None = None) -> None:
        """Record, log and tell the device (an Error with the reason's code, ``ref`` = task id)."""
        log.warning("rejected result from %s: %s", dev, err)
        task = self._pending.get(task_id or "")
        if task is not None:
            self._resolved.add(dev)
        rnd = rnd if rnd is not None else task.round if task else self._open_round
        self.registry.add_rejection(rnd, dev, task_id, err.code, err.detail)
        self.endpoint.send(dev, msgs.Error(code=err.code, detail=err.detail[:500], ref=task_id))

    def _load_update(self, row: dict) -> ClientUpdate:
        weights = decode_tensors(self.endpoint.store.get(row["blob_id"]))
        pending = self._pending.get(row["task_id"])
        if pending is not None:
            instruction = pending.instruction
        else:  # accepted before a restart: the instruction is re-planned for this round
            instruction = next(
                i
                for i in self.method.configure_train(
                    row["round"],
                    self.global_weights,
                    [self.online.get(row["device_id"]) or DeviceInfo(row["device_id"], row["num_samples"])],
                )
            )
        smashed_id = row["metrics"].get("smashed_blob")
        smashed = decode_tensors(self.endpoint.store.get(smashed_id)) if smashed_id else None
        return ClientUpdate(
            row["device_id"], row["num_samples"], weights, row["metrics"], instruction, smashed
        )


def _sha(data: bytes) -> str:
    from sdk_device.protocol.blobs import sha256_hex

    return sha256_hex(data)


def _tuple_state(state):
    """JSON turns random.getstate()'s tuples into lists; turn them back."""
    return tuple(_tuple_state(s) if isinstance(s, list) else s for s in state)
