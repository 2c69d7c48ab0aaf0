"""The MQTT grid: real devices reached through an ``Endpoint`` and a fleet registry.

An exchange: export each task's programs (before the deadline starts counting against the
devices) -> persist the task record -> offer its blobs and send the task -> handle incoming
traffic until quorum, every device asked resolved, or the deadline -> pull each result,
validate it, persist it, and only then acknowledge it. Invalid input (bad messages,
unknown devices or tasks, wrong shapes, NaN, oversized or corrupt blobs, late results) is
rejected, recorded in the registry, logged and answered with an ``error``; the round goes
on. The registry (devices, tiers, revocations, tasks, updates) survives server restarts:
``accepted_before`` returns a restarted round's updates with the instructions they answered.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from export.programs import ProgramCache
from fedcore import modelspec
from sdk_device.protocol import messages as msgs
from sdk_device.protocol.blobs import check_update, decode_tensors, encode_tensors
from sdk_device.protocol.epoch import ServerEpoch, announce_window
from sdk_device.protocol.errors import ProtocolError
from sdk_device.protocol.smashed import SmashedRequest, check_smashed
from sdk_device.protocol.task_plan import plan_config
from sdk_device.transport.endpoint import Endpoint, Incoming

from ..fleet.registry import FleetRegistry
from ..methods.base import MODEL, ClientUpdate, DeviceInfo, TrainInstruction
from ..methods.records import FEATURES
from ..methods.tiers import resolve_tier
from .grid import Exchange, Grid
from .task_records import instruction_from_record, task_record

log = logging.getLogger(__name__)

ARRAYS_KEY = "arrays"  # in a stored update's metrics: {record name: blob id} of its other array records


def features_request(instruction: TrainInstruction) -> SmashedRequest | None:
    """What a ``features`` output asked by ``instruction`` must look like, or None."""
    params = instruction.reports.get(FEATURES)
    if params is None:
        return None
    spec = instruction.all_models()[params.get("model", MODEL)].spec
    features, classes = modelspec.last_linear(spec)
    return SmashedRequest(int(params["samples"]), features, classes)


@dataclass
class _Pending:
    """A task of the open round: what it asked, and what its result must look like."""

    task_id: str
    round: int
    instruction: TrainInstruction
    sent_bytes: dict[str, int]  # returned model -> bytes of the weights sent
    references: dict[str, dict]  # returned model -> {tensor name: (shape, dtype)} it must have
    features: SmashedRequest | None  # the features output asked for, if any
    answered: bool = False


class MqttGrid(Grid):
    """The devices of ``registry`` reachable through ``endpoint``.

    ``program_formats``: the program formats offered with each task; ``max_update_factor``:
    an update may be at most this times the bytes sent (+64 KiB); ``fetch_timeout_s``: how
    long pulling one result may take.
    """

    def __init__(self, endpoint: Endpoint, registry: FleetRegistry, program_formats: list[str] | None = None,
                 max_update_factor: float = 2.0, fetch_timeout_s: float = 120.0) -> None:
        self.endpoint = endpoint
        self.registry = registry
        self.programs = ProgramCache(program_formats or [modelspec.FORMAT])
        self.max_update_factor = max_update_factor
        self.fetch_timeout_s = fetch_timeout_s
        self.devices: dict[str, DeviceInfo] = {}  # online devices, by id
        self._pending: dict[str, _Pending] = {}  # tasks of the open round
        self._closed_tasks: dict[str, int] = {}  # task id -> round, for tasks of recent closed rounds
        self._open_round: int | None = None
        self._lock = threading.RLock()  # _accept rejects while holding it
        self._fetchers = ThreadPoolExecutor(max_workers=4, thread_name_prefix="fetch")
        self._resolved: set[str] = set()  # devices of the open round accepted, refused or rejected
        self._accepted: list[str] = []  # task ids accepted in the open exchange, in order
        self._rejections: dict[str, int] = {}  # code -> count in the open exchange
        self.progress: dict[str, float] = {}  # device -> last reported training progress (0..1)
        self._answers: dict[str, tuple[str, msgs.Message]] = {}  # task id -> (device, the ack/error sent)
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
        # may change them while we run).
        return sorted((DeviceInfo(d.device_id, d.num_samples, resolve_tier(self.registry.tier_of(d.device_id),
                                                                            d.profile), d.runtimes,
                                  d.profile) for d in self.devices.values()
                       if self.registry.is_known(d.device_id)), key=lambda d: d.device_id)

    def wait_for_devices(self, count: int, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while len(self.devices) < count and time.monotonic() < deadline:
            self._pump(timeout_s=0.2)
        return len(self.devices)

    def poll(self, timeout_s: float) -> None:
        self._pump(timeout_s)

    def traffic(self) -> tuple[int, int]:
        return self.endpoint.bytes_sent, self.endpoint.bytes_received

    def close(self) -> None:
        self._fetchers.shutdown(wait=False, cancel_futures=True)

    def accepted_before(self, round_number: int) -> list[ClientUpdate]:
        info = self.registry.round_info(round_number)
        if info is None or info["status"] != "open":
            return []
        return [self._load_update(row) for row in self.registry.updates(round_number)]

    def exchange(self, round_number: int, instructions: list[TrainInstruction], deadline: float,
                 quorum: int) -> Exchange:
        for instruction in instructions:  # export first: the deadline is the devices' time
            if not instruction.programs:
                self.programs.programs(instruction.spec, instruction.recipe)
        earlier = [u["device_id"] for u in self.registry.updates(round_number)]
        self.registry.open_round(round_number, sorted({*earlier, *(i.device_id for i in instructions)}), "")
        with self._lock:
            self._open_round, self._resolved, self._accepted, self._rejections = round_number, set(), [], {}
        asked = {i.device_id for i in instructions}
        for instruction in instructions:
            self._send_task(round_number, instruction, deadline)
        while len(self._accepted) < quorum and not asked <= self._resolved and time.time() < deadline:
            self._pump(timeout_s=0.1)
        with self._lock:
            self._open_round = None  # late results are now rejected as round_closed
            accepted, rejections = list(self._accepted), dict(self._rejections)
        rows = {u["task_id"]: u for u in self.registry.updates(round_number)}
        return Exchange([self._load_update(rows[t]) for t in accepted if t in rows], rejections)

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
                built = (tuple(self.programs.programs(model.spec, instruction.recipe)) if name == MODEL
                         else ((modelspec.FORMAT, modelspec.dumps(model.spec)),))
            programs[name] = [self.endpoint.offer(dev, data, "program", fmt) for fmt, data in built]
            program_blobs[name] = [(ref.format, ref.id) for ref in programs[name]]
            blob = encode_tensors(model.weights)
            arrays[name] = self.endpoint.offer(dev, blob, "weights", "safetensors")
            if name in instruction.returns:
                sent_bytes[name] = len(blob)
                references[name] = {k: (tuple(v.shape), str(v.dtype)) for k, v in model.weights.items()}
        task = msgs.Task(task_id=msgs.new_id(), round=rnd, programs=programs, arrays=arrays,
                         config=plan_config(instruction.plan()), deadline=deadline)
        self.registry.add_task(task.task_id, rnd, dev, task_record(
            instruction, {name: ref.id for name, ref in arrays.items()}, program_blobs))
        self._pending[task.task_id] = _Pending(task.task_id, rnd, instruction, sent_bytes, references,
                                               features_request(instruction))
        self.endpoint.send(dev, task)

    # -- incoming traffic ----------------------------------------------------------------------
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
            log.warning("device %s reports %s: %s", dev, message.code, message.detail)
            if message.ref in self._pending:
                self._resolved.add(dev)  # it refused its task
            self._record_rejection(self._open_round, dev, message.ref, f"device:{message.code}",
                                   message.detail)

    def _record_rejection(self, rnd: int | None, dev: str, task_id: str | None, code: str,
                          detail: str) -> None:
        self.registry.add_rejection(rnd, dev, task_id, code, detail)
        with self._lock:
            if rnd is not None and rnd == self._open_round:
                self._rejections[code] = self._rejections.get(code, 0) + 1

    def _on_status(self, dev: str, status: str) -> None:
        """Last will / reconnect of a device: leave or rejoin the pool of selectable devices."""
        if status == "offline" and dev in self.devices:
            log.warning("device %s went offline", dev)
            self.devices.pop(dev, None)
            self._resolved.add(dev)  # do not hold the round for it
            self.registry.set_status(dev, "offline")
        elif status == "online" and dev not in self.devices:
            known = self.registry.device(dev)
            if known and known["num_samples"]:  # it said hello before: it is back
                self.devices[dev] = DeviceInfo(dev, known["num_samples"],
                                               resolve_tier(known["tier"], known["profile"]),
                                               tuple(known["runtimes"] or ()), known["profile"] or {})
                self.registry.set_status(dev, "online")
                log.info("device %s is back online", dev)

    def _on_hello(self, dev: str, hello: msgs.Hello) -> None:
        if hello.device_id != dev:
            self._reject(dev, None, ProtocolError("invalid_field", "hello names another device"))
            return
        self.registry.record_hello(dev, hello.profile, hello.runtimes, hello.num_samples)
        tier = resolve_tier((self.registry.device(dev) or {}).get("tier"), hello.profile)
        self.devices[dev] = DeviceInfo(dev, hello.num_samples, tier, tuple(hello.runtimes), hello.profile)
        log.info("device %s online: %d samples, runtimes %s", dev, hello.num_samples, hello.runtimes)

    def _on_result(self, dev: str, result: msgs.Result) -> None:
        # Re-offer (protocol §9.5): a result answered before gets the same answer again and is
        # never counted twice. Keep this first; the validation below is separate.
        if self._answer_again(dev, result):
            return
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
            err = ProtocolError("invalid_field", f"task is of round {pending.round}")
            self._reject(dev, result.task_id, err)
            return
        problem = self._check_records(result, pending)
        if problem is not None:
            self._reject(dev, result.task_id, problem)
            return
        samples = result.metrics.get("samples")
        if type(samples) is not int or samples <= 0:
            self._reject(dev, result.task_id, ProtocolError("invalid_field", "metrics.samples must be > 0"))
            return
        pending.answered = True  # one result per task
        self._fetchers.submit(self._accept, dev, result, pending)

    def _answer_again(self, dev: str, result: msgs.Result) -> bool:
        """Re-send the ack a result of ``dev``'s task got (from this server instance, or for an
        update an earlier instance persisted), or the error its pulled copy got while its round
        is open; False otherwise (then the usual checks answer it, e.g. round_closed)."""
        dev_answer = self._answers.get(result.task_id)
        if dev_answer is not None and isinstance(dev_answer[1], msgs.Error) \
                and result.task_id not in self._pending:
            dev_answer = None  # its round closed: the usual round_closed
        if dev_answer is None and result.task_id not in self._pending and any(
                u["task_id"] == result.task_id and u["device_id"] == dev
                for u in self.registry.updates(result.round)):
            dev_answer = (dev, msgs.Ack(ref=result.task_id, detail="persisted"))
        if dev_answer is None or dev_answer[0] != dev:
            return False
        log.info("result of task %s from %s again: answering %s again", result.task_id[:8], dev,
                 dev_answer[1].TYPE)
        self.endpoint.send(dev, dev_answer[1])
        return True

    def _answer(self, dev: str, task_id: str | None, answer: msgs.Message) -> None:
        """Send the ack/error of a result; an ack, or the error of a pulled result, is remembered
        for repeats (a result refused before the pull is checked again when repeated)."""
        pending = self._pending.get(task_id or "")
        if pending is not None and pending.instruction.device_id == dev and (
                isinstance(answer, msgs.Ack) or pending.answered):
            self._answers[pending.task_id] = (dev, answer)
            while len(self._answers) > 100_000:
                self._answers.pop(next(iter(self._answers)))
        self.endpoint.send(dev, answer)

    def _check_records(self, result: msgs.Result, pending: _Pending) -> ProtocolError | None:
        """Which array records a result may carry, and how large they may be (before pulling)."""
        names = set(result.arrays)
        missing = sorted(set(pending.references) - names)
        if missing:
            return ProtocolError("missing_record", f"the result lacks the array records {missing}")
        allowed = set(pending.references) | ({FEATURES} if pending.features else set())
        if names - allowed:
            extra = sorted(names - allowed)
            return ProtocolError("unexpected_record", f"the task asked for no array records {extra}")
        for name, ref in result.arrays.items():
            limit = (pending.features.max_bytes() if name == FEATURES else
                     int(pending.sent_bytes[name] * self.max_update_factor) + 65536)
            if ref.size > limit:
                return ProtocolError("too_large", f"{name} of {ref.size} bytes; at most {limit} expected")
        return None

    def _accept(self, dev: str, result: msgs.Result, pending: _Pending) -> None:
        """Pull, validate and persist one result's array records, then acknowledge it (fetch thread)."""
        try:
            for name, ref in sorted(result.arrays.items()):
                data = self.endpoint.fetch(dev, ref, durable=True, timeout_s=self.fetch_timeout_s)
                tensors = decode_tensors(data)
                if name == FEATURES:
                    check_smashed(tensors, pending.features)
                else:
                    check_update(tensors, pending.references[name])
        except (ProtocolError, TimeoutError) as exc:
            err = exc if isinstance(exc, ProtocolError) else ProtocolError("timeout", str(exc))
            self._reject(dev, result.task_id, err)
            return
        with self._lock:
            if self._open_round != pending.round:
                self._reject(dev, result.task_id, ProtocolError("round_closed", "the round closed meanwhile"))
                return
            metrics = {k: v for k, v in result.metrics.items() if k != ARRAYS_KEY}  # the server's key
            metrics[ARRAYS_KEY] = {name: ref.id for name, ref in result.arrays.items() if name != MODEL}
            self.registry.add_update(pending.round, dev, result.task_id, result.arrays[MODEL].id,
                                     result.metrics["samples"], metrics)
            self._accepted.append(result.task_id)
            self._resolved.add(dev)
        self._answer(dev, result.task_id, msgs.Ack(ref=result.task_id, detail="persisted"))
        self.endpoint.withdraw(dev)
        log.info("round %d: accepted update from %s (%d samples)", pending.round, dev,
                 result.metrics["samples"])

    def _reject(self, dev: str, task_id: str | None, err: ProtocolError, rnd: int | None = None) -> None:
        """Record, log and tell the device (an Error with the reason's code, ``ref`` = task id)."""
        log.warning("rejected result from %s: %s", dev, err)
        task = self._pending.get(task_id or "")
        if task is not None:
            self._resolved.add(dev)
        rnd = rnd if rnd is not None else task.round if task else self._open_round
        self._record_rejection(rnd, dev, task_id, err.code, err.detail)
        self._answer(dev, task_id, msgs.Error(code=err.code, detail=err.detail[:500], ref=task_id))

    def _load_update(self, row: dict) -> ClientUpdate:
        """An accepted update (a registry row) with the instruction it answered."""
        weights = decode_tensors(self.endpoint.store.get(row["blob_id"]))
        pending = self._pending.get(row["task_id"])
        if pending is not None:
            instruction = pending.instruction
        else:  # accepted before a restart: the instruction as it was persisted when sent
            record = self.registry.task(row["task_id"])
            if record is None:
                raise RuntimeError(f"task {row['task_id']} of an accepted update has no record")
            instruction = instruction_from_record(record, self.endpoint.store)
        others = {name: decode_tensors(self.endpoint.store.get(blob))
                  for name, blob in row["metrics"].get(ARRAYS_KEY, {}).items()}
        metrics = {k: v for k, v in row["metrics"].items() if k != ARRAYS_KEY}
        return ClientUpdate(row["device_id"], row["num_samples"], weights, metrics, instruction, others)
