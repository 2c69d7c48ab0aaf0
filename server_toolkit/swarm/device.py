"""One simulated device of the swarm: the device side of the protocol without training.

It speaks what ``sdk_device/agent.py`` speaks, with the same message classes, topics and
chunk frames (``sdk_device.protocol``) and the same re-announce rules: the agent's own
``sdk_device.announce.Announcer`` decides when to say hello and when to offer a result again
(docs/protocol.md §3.1, §9.5) -- one hello at start; after a random delay within the
announce window only when the server's epoch changes; a result re-offered until the server
answers it, after a reconnect, the server coming back online and the hello to a new epoch.
For a task, it pulls the returned models' array records (and, once per program id, the
``torchspec/1`` program of the trained model, as a real device caches it) in windows of
``blob_request``s, answers with the sent weights plus a small seeded delta (float32 stays
float32, same names and shapes), offers those blobs, serves the server's ``blob_request``s for
them, and withdraws them on ``ack``/``error``. Idle heartbeats every ``heartbeat_s`` seconds,
like the agent: QoS 0, and none while the server's status is ``offline`` (§9.4).

It never trains and reports no outputs (a task asking for ``label_counts`` is refused with
``unsupported_task``; ``features`` is declined, which the protocol allows). Everything runs on
the shard's event-loop thread (the announcer's delayed hellos too: ``schedule``).
"""

from __future__ import annotations

import hashlib
import math
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from fedcore import modelspec
from sdk_device.announce import Announcer, Schedule, thread_timer
from sdk_device.protocol import messages as msgs
from sdk_device.protocol.blobs import (
    DEFAULT_CHUNK_BYTES,
    chunk_count,
    decode_chunk,
    decode_tensors,
    encode_chunk,
    encode_tensors,
    sha256_hex,
)
from sdk_device.protocol.epoch import ServerEpoch
from sdk_device.protocol.errors import ProtocolError
from sdk_device.protocol.task_plan import TaskPlan, parse_plan
from sdk_device.protocol.topics import FleetTopics
from sdk_device.seen_tasks import SeenTasks

from .counters import Counters

Publish = Callable[..., object]  # (topic, payload, qos=1)
WINDOW = 16  # chunks asked per blob_request, as the reference endpoint
IDLE_S = 5.0  # seconds without a chunk before asking again (the reference's idle_s)
MAX_STALLS = 4  # then the task is refused with bad_task, as the reference gives up


def device_seed(device_id: str, salt: int = 0) -> int:
    """A stable 32-bit seed for ``device_id`` (same on every run and machine)."""
    return int.from_bytes(hashlib.sha256(f"{salt}/{device_id}".encode()).digest()[:4], "big")


def perturbed(tensors: dict[str, np.ndarray], seed: int, scale: float = 0.01) -> dict[str, np.ndarray]:
    """``tensors`` plus a seeded normal delta of std ``scale`` on every floating-point tensor
    (dtype and shape kept; integer tensors unchanged)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name in sorted(tensors):
        arr = tensors[name]
        if arr.dtype.kind == "f":
            delta = rng.standard_normal(arr.shape, dtype=np.float32) * np.float32(scale)
            out[name] = (arr + delta.astype(arr.dtype)).astype(arr.dtype)
        else:
            out[name] = arr.copy()
    return out


@dataclass
class _Transfer:
    """One blob being pulled from the server."""

    ref: msgs.BlobRef
    chunk_bytes: int
    chunks: dict[int, bytes] = field(default_factory=dict)
    missing: deque[int] = field(default_factory=deque)
    outstanding: set[int] = field(default_factory=set)
    last_progress: float = 0.0  # monotonic seconds
    stalls: int = 0


@dataclass
class _Job:
    """The task in hand: what it asked and the blobs pulled so far."""

    task: msgs.Task
    plan: TaskPlan
    to_pull: deque[msgs.BlobRef]
    started: float  # monotonic seconds
    pulled: dict[str, bytes] = field(default_factory=dict)
    transfer: _Transfer | None = None


class SwarmDevice:
    """The protocol state of one simulated device; ``publish(topic, payload)`` sends."""

    def __init__(self, device_id: str, topics: FleetTopics, counters: Counters, *, heartbeat_s: float = 10.0,
                 pull_programs: bool = True, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 on_task: Callable[[SwarmDevice], bool] | None = None, announce_window_s: float | None = None,
                 schedule: Schedule = thread_timer) -> None:
        self.device_id = device_id
        self.topics = topics
        self.counters = counters
        self.heartbeat_s = heartbeat_s
        self.pull_programs = pull_programs
        self.chunk_bytes = chunk_bytes
        self.on_task = on_task  # fault hook: return False to drop the task (the device "died")
        self.publish: Publish = lambda topic, payload: None
        self.link = None  # the device's SwarmLink (set by its shard)
        seed = device_seed(device_id)
        self.num_samples = 50 + seed % 151  # 50..200 local samples
        self.connected = False
        self.dead = False
        self._hello = msgs.Hello(device_id=device_id, runtimes=["torch"], num_samples=self.num_samples,
                                 profile={"system": "swarm", "arch": "simulated", "runtimes": ["torch"],
                                          "num_samples": self.num_samples, "swarm": True})
        self.announcer = Announcer(self._announce, self._hello, announce_window_s, random.Random(seed),
                                   schedule)  # the agent's hello and re-offer rules
        self._job: _Job | None = None
        self._offered: dict[str, bytes] = {}  # blob id -> bytes the server may pull
        self._awaiting: str | None = None  # task whose result waits for ack/error
        self._seen = SeenTasks()  # task ids taken: a copy the server sends again is ignored
        self._programs_seen: set[str] = set()  # program blob ids already pulled (cached)
        self._next_beat = time.monotonic() + (seed % 1000) / 1000 * heartbeat_s  # staggered

    # -- connection events (from the link) -------------------------------------------------------
    def on_connected(self, first: bool) -> None:
        """After a CONNACK: hello once at start (as the agent after connecting); a reconnect
        re-offers a result still waiting for its answer."""
        self.connected = True
        self.counters.connects += 1
        if first:
            self.announcer.say_hello()
        else:
            self.announcer.on_event("connected", True, False)

    def on_disconnected(self) -> None:
        self.connected = False

    # -- incoming ---------------------------------------------------------------------------------
    def on_message(self, topic: str, payload: bytes, retained: bool = False) -> None:
        """Route one MQTT message (called on the loop thread)."""
        if self.dead:
            return
        if topic == self.topics.server_status:
            self.announcer.on_event("status", payload.decode("utf-8", "replace"), retained)
        elif topic == self.topics.server_epoch:
            try:
                self.announcer.on_event("epoch", ServerEpoch.decode(payload), retained)
            except ProtocolError:
                self.counters.errors += 1
        elif topic == self.topics.down_chunk(self.device_id):
            self._on_chunk(payload)
        elif topic == self.topics.down(self.device_id):
            try:
                message = msgs.decode(payload)
            except ProtocolError as err:
                self.counters.errors += 1
                if b'"error"' not in payload:  # never answer an error with an error
                    self._send(msgs.Error(code=err.code, detail=err.detail[:500]))
                return
            self._on_control(message)

    def _on_control(self, message: msgs.Message) -> None:
        if isinstance(message, msgs.Task) and not self._seen.first_time(message.task_id):
            return  # a copy of a task taken (the server sends open tasks again after reconnects)
        if isinstance(message, msgs.Task):
            self._on_task(message)
        elif isinstance(message, msgs.BlobRequest):
            self._serve(message)
        elif isinstance(message, msgs.ServerStatus):  # the answer to our status_request (§3.2)
            epoch = ServerEpoch.of_status(message.epoch, message.started_at, message.announce_window_s)
            self.announcer.on_event("epoch", epoch, True)
            self.announcer.on_event("status", "online", True)
        elif isinstance(message, msgs.Ack) and message.ref == self._awaiting:
            self.counters.accepted += 1
            self._finish_task()
        elif isinstance(message, msgs.Error):
            if message.ref is not None and message.ref == self._awaiting:
                self.counters.rejected += 1
                self._finish_task()
            elif self._job and self._job.transfer and message.ref == self._job.transfer.ref.id:
                self._refuse(self._job.task, "bad_task", f"could not load the task: {message.code}")
            else:
                self.counters.errors += 1

    def _on_task(self, task: msgs.Task) -> None:
        self.counters.tasks += 1
        if self.on_task is not None and not self.on_task(self):
            return
        if task.deadline < time.time():
            self._refuse(task, "deadline_passed", "the task arrived after its deadline")
            return
        try:
            plan = parse_plan(task.config, set(task.programs) & set(task.arrays), {"features"})
        except ProtocolError as exc:
            self._refuse(task, exc.code, exc.detail)
            return
        refs = deque(task.arrays[name] for name in plan.returns)
        main = plan.steps[-1].model
        program = next((p for p in task.programs.get(main, []) if p.format == modelspec.FORMAT), None)
        if self.pull_programs and program is not None and program.id not in self._programs_seen:
            refs.appendleft(program)
        self._job = _Job(task, plan, refs, time.monotonic())  # a newer task replaces an older one
        self._pull_next()

    # -- pulling the task's blobs ----------------------------------------------------------------
    def _pull_next(self) -> None:
        job = self._job
        if job is None:
            return
        if not job.to_pull:
            self._answer(job)
            return
        ref = job.to_pull.popleft()
        transfer = _Transfer(ref, self.chunk_bytes, last_progress=time.monotonic())
        transfer.missing.extend(range(chunk_count(ref.size, self.chunk_bytes)))
        job.transfer = transfer
        self._request(transfer)

    def _request(self, transfer: _Transfer) -> None:
        """Ask for the next window of chunks when at most half the window is outstanding."""
        if not transfer.missing or len(transfer.outstanding) > WINDOW // 2:
            return
        batch = [transfer.missing.popleft()
                 for _ in range(min(len(transfer.missing), WINDOW - len(transfer.outstanding)))]
        transfer.outstanding.update(batch)
        self._send(msgs.BlobRequest(blob=transfer.ref.id, indices=batch, chunk_bytes=transfer.chunk_bytes))

    def _on_chunk(self, payload: bytes) -> None:
        job = self._job
        transfer = job.transfer if job else None
        try:
            chunk = decode_chunk(payload)
        except ProtocolError:
            self.counters.errors += 1
            return
        if (transfer is None or chunk.blob != transfer.ref.id or chunk.index not in transfer.outstanding
                or chunk.size != transfer.ref.size or chunk.chunk_bytes != transfer.chunk_bytes):
            return  # a duplicate after a re-request, or not what we asked for
        transfer.outstanding.discard(chunk.index)
        transfer.chunks[chunk.index] = chunk.data
        transfer.last_progress, transfer.stalls = time.monotonic(), 0
        if transfer.missing or transfer.outstanding:
            self._request(transfer)
            return
        data = b"".join(transfer.chunks[i] for i in range(len(transfer.chunks)))
        if sha256_hex(data) != transfer.ref.id:
            self._refuse(job.task, "bad_task", f"blob {transfer.ref.id[:12]} does not match its id")
            return
        job.pulled[transfer.ref.id] = data
        if transfer.ref.kind == "program":
            self._programs_seen.add(transfer.ref.id)
        job.transfer = None
        self._pull_next()

    # -- answering --------------------------------------------------------------------------------
    def _answer(self, job: _Job) -> None:
        """The result: every returned model's weights plus a delta seeded by the task's seed."""
        task, plan = job.task, job.plan
        seed = plan.steps[-1].recipe.seed
        try:
            arrays = {}
            for name in plan.returns:
                tensors = perturbed(decode_tensors(job.pulled[task.arrays[name].id]), seed)
                data = encode_tensors(tensors)
                ref = msgs.BlobRef(id=sha256_hex(data), size=len(data), kind="weights", format="safetensors")
                self._offered[ref.id] = data
                arrays[name] = ref
        except ProtocolError as exc:
            self._refuse(task, "bad_task", f"could not load the task: {exc.detail}")
            return
        loss = 2.3 * math.exp(-0.15 * task.round) + (seed % 100) / 1000
        metrics = {"samples": self.num_samples, "loss": loss, "accuracy": max(0.0, 1.0 - loss / 2.5),
                   "wall_time_s": 0.0, "fetch_s": time.monotonic() - job.started, "runtime": "swarm"}
        self._job = None
        self._awaiting = task.task_id
        result = msgs.Result(task_id=task.task_id, round=task.round, arrays=arrays, metrics=metrics)
        self.announcer.awaiting(result)  # offered again until the server answers it
        self._send(result)
        self.counters.results += 1

    def _serve(self, request: msgs.BlobRequest) -> None:
        data = self._offered.get(request.blob)
        if data is None:
            self._send(msgs.Error(code="not_offered", detail=f"blob {request.blob[:12]} was not offered",
                                  ref=request.blob))
            return
        count = chunk_count(len(data), request.chunk_bytes)
        topic = self.topics.up_chunk(self.device_id)
        for index in request.indices:
            if not 0 <= index < count:
                self._send(msgs.Error(code="invalid_field", detail=f"chunk index {index} out of range",
                                      ref=request.blob))
                return
            part = data[index * request.chunk_bytes:(index + 1) * request.chunk_bytes]
            self.publish(topic, encode_chunk(request.blob, index, len(data), request.chunk_bytes, part))
            self.counters.chunks_served += 1

    def _finish_task(self) -> None:
        self._awaiting = None
        self.announcer.awaiting(None)
        self._offered.clear()  # withdraw: the server has what it wanted (or refused it)

    def _refuse(self, task: msgs.Task, code: str, detail: str) -> None:
        self._job = None
        self.counters.refused += 1
        self._send(msgs.Error(code=code, detail=detail[:500], ref=task.task_id))

    # -- timers -----------------------------------------------------------------------------------
    def tick(self, now: float) -> None:
        """Once a second (monotonic ``now``): idle heartbeats, stalled pulls asked again."""
        if not self.connected or self.dead:
            return
        transfer = self._job.transfer if self._job else None
        if transfer is not None and now - transfer.last_progress > IDLE_S:
            transfer.stalls += 1
            transfer.last_progress = now
            if transfer.stalls > MAX_STALLS:
                self._refuse(self._job.task, "bad_task", f"blob {transfer.ref.id[:12]}: no chunk arrived")
                return
            transfer.missing.extendleft(sorted(transfer.outstanding, reverse=True))
            transfer.outstanding.clear()
            self._request(transfer)
        if self.heartbeat_s > 0 and now >= self._next_beat and self.announcer.server_online:
            self._next_beat = now + self.heartbeat_s
            task_id = self._job.task.task_id if self._job else None
            self._send(msgs.Heartbeat(state="training" if task_id else "idle", task_id=task_id), qos=0)

    def _send(self, message: msgs.Message, qos: int = 1) -> None:
        self.publish(self.topics.up(self.device_id), msgs.encode(message), qos=qos)

    def _announce(self, message: msgs.Message) -> None:
        """The announcer's sends: a hello, a status request, or a result offered again."""
        if self.dead:
            return
        self._send(message)
        if isinstance(message, msgs.Hello):
            self.counters.hellos += 1
        elif isinstance(message, msgs.Result):
            self.counters.reoffers += 1
