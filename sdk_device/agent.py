"""The device agent: receive task -> pull blobs -> train -> upload -> wait.

Training happens on the agent's own thread, never inside an MQTT callback (paho only
acknowledges a message after its callback returns).
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedcore import modelspec
from fedcore.recipe import Recipe

from .data.npz import load_npz
from .local_training import TEACHER_PREFIX, LocalTensors, train_with_teacher
from .profile import device_profile, peak_rss_mb
from .protocol import messages as msgs
from .protocol.blobs import DEFAULT_CHUNK_BYTES, decode_tensors, encode_tensors
from .protocol.errors import ProtocolError
from .protocol.smashed import encode_smashed
from .protocol.topics import FleetTopics
from .runtime_choice import RuntimeChooser, trainable_offers
from .runtimes.registry import available_runtimes, create_runtime, pick_runtime
from .transport.blob_store import BlobStore
from .transport.endpoint import SERVER, Endpoint
from .transport.mqtt_link import BrokerAddress

log = logging.getLogger(__name__)


@dataclass
class AgentConfig:
    """Everything a device agent needs to run."""

    broker_url: str
    fleet: str
    device_id: str
    data_path: Path
    work_dir: Path
    runtimes: list[str] | None = None  # allowed runtimes; None = all installed
    username: str | None = None
    password: str | None = None
    ca_file: str | None = None
    insecure: bool = False  # allow plain mqtt:// to a non-loopback broker
    client_id: str | None = None  # MQTT client id (None: fedsdk-dev-<fleet>-<device id>)
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    heartbeat_s: float = 10.0
    extra_profile: dict = field(default_factory=dict)
    share_smashed: bool = True  # send last-layer inputs when a task asks (protocol.smashed)


class DeviceAgent:
    """Runs tasks from the server until ``stop()`` (or ``max_tasks`` tasks are done)."""

    def __init__(self, config: AgentConfig, endpoint: Endpoint | None = None) -> None:
        self.config = config
        self.x, self.y = load_npz(config.data_path)
        self.endpoint = endpoint or Endpoint(
            BrokerAddress.parse(config.broker_url),
            FleetTopics(config.fleet),
            BlobStore(Path(config.work_dir) / "blobs"),
            device_id=config.device_id,
            chunk_bytes=config.chunk_bytes,
            username=config.username,
            password=config.password,
            ca_file=config.ca_file,
            insecure=config.insecure,
            client_id=config.client_id,
        )
        self.chooser = RuntimeChooser(Path(config.work_dir))
        self.local = LocalTensors(Path(config.work_dir) / "local_state")  # tensors kept on the device
        self._teacher: tuple[object, str] | None = None  # (torch runtime, teacher program id)
        self._stop = threading.Event()
        self._runtimes: dict[str, object] = {}
        self._loaded_program: dict[str, str] = {}  # runtime -> program blob id loaded
        self._last_beat = 0.0
        self._awaiting: str | None = None  # task whose result waits for the server's ack or error
        self.tasks_done = 0

    def stop(self) -> None:
        self._stop.set()

    def run(self, max_tasks: int | None = None) -> None:
        """Connect, say hello, then serve tasks. Returns after stop() or max_tasks."""
        runtimes = [
            r for r in available_runtimes() if self.config.runtimes is None or r in self.config.runtimes
        ]
        if not runtimes:
            raise RuntimeError("no training runtime is installed here: pip install 'fedsdk[torch]'")
        self._runtime(runtimes[0])  # import the engine now, not in the first round
        self.endpoint.start()
        log.info(
            "device %s connected to %s (runtimes: %s, %d samples)",
            self.config.device_id,
            self.config.broker_url,
            ", ".join(runtimes),
            len(self.y),
        )
        self._hello = msgs.Hello(
            device_id=self.config.device_id,
            runtimes=runtimes,
            num_samples=len(self.y),
            profile={**device_profile(runtimes), **self.config.extra_profile},
        )
        self.endpoint.send(SERVER, self._hello)
        try:
            while not self._stop.is_set() and (max_tasks is None or self.tasks_done < max_tasks):
                try:
                    incoming = self.endpoint.inbox.get(timeout=0.5)
                except queue.Empty:
                    self._heartbeat("idle")
                    continue
                self._handle(incoming)
        finally:
            self.endpoint.close()

    # -- messages --------------------------------------------------------------------------
    def _handle(self, incoming) -> None:
        message = incoming.message
        if incoming.status is not None:
            log.info("server is %s", incoming.status)
            if incoming.status == "online":  # a (re)started server learns who is here
                self.endpoint.send(SERVER, self._hello)
        elif isinstance(message, msgs.Task):
            try:
                self._run_task(message)
            except Exception as exc:  # one broken task must not end the agent
                log.exception("task %s failed", message.task_id[:8])
                self._refuse(message, "device_failure", f"{type(exc).__name__}: {exc}")
        elif isinstance(message, msgs.Ack) and message.ref == self._awaiting:
            log.info("server accepted the result of task %s", message.ref[:8])
            self._finish_task()
        elif isinstance(message, msgs.Error):
            log.warning("server reports %s: %s (ref %s)", message.code, message.detail, message.ref)
            if message.ref is not None and message.ref == self._awaiting:  # our result was refused
                self._finish_task()

    def _run_task(self, task: msgs.Task) -> None:
        started = time.time()
        if task.deadline < started:
            self._refuse(task, "deadline_passed", "the task arrived after its deadline")
            return
        try:
            recipe = Recipe.from_dict(task.recipe)
            if recipe.needs_teacher and task.teacher is None:
                raise ValueError(f"loss {recipe.loss!r} needs a teacher model and the task has none")
            runtime_name, fmt = pick_runtime([p.format for p in task.programs], self.config.runtimes)
        except ValueError as exc:
            self._refuse(task, "unsupported_task", str(exc))
            return
        self.chooser.remember_task(task)
        offers = trainable_offers(task, self.config.runtimes)
        try:  # the fastest runtime that passes parity on this very program, tested once
            chosen = self.chooser.choose(task, offers, lambda ref: self.endpoint.fetch(SERVER, ref),
                                         self.x[:256], self.y[:256])
        except Exception:  # a failing self-test must not cost the round
            log.exception("runtime self-test failed; using the preference order")
            chosen = None
        if chosen is not None:
            runtime_name, fmt = chosen, offers[chosen]
        program_ref = next(p for p in task.programs if p.format == fmt)
        log.info("round %d: task %s with %s (%s)", task.round, task.task_id[:8], runtime_name, fmt)
        try:
            runtime = self._runtime(runtime_name)
            fetch_started = time.perf_counter()
            if self._loaded_program.get(runtime_name) != program_ref.id:
                runtime.load_program(self.endpoint.fetch(SERVER, program_ref), fmt)
                self._loaded_program[runtime_name] = program_ref.id
            weights = decode_tensors(self.endpoint.fetch(SERVER, task.weights))
            runtime.set_weights(self.local.complete(program_ref.id, weights, runtime.get_weights()))
            teacher = self._load_teacher(task.teacher) if task.teacher else None
            fetch_s = time.perf_counter() - fetch_started
        except (ProtocolError, TimeoutError, ValueError, KeyError, RuntimeError) as exc:
            self._refuse(task, "bad_task", f"could not load the task: {exc}")
            return
        train_started = time.perf_counter()
        stats, teacher_run = train_with_teacher(
            runtime, self.x, self.y, recipe,
            teacher=teacher[0] if teacher else None,
            train_teacher=bool(task.teacher and task.teacher.train),
            progress=lambda f: self._heartbeat("training", task.task_id, f),
        )
        train_s = time.perf_counter() - train_started
        upload = self.local.remember(program_ref.id, weights, runtime.get_weights())
        if teacher and teacher_run.weights is not None:
            _, teacher_program, teacher_sent = teacher
            trained_teacher = self.local.remember(teacher_program, teacher_sent, teacher_run.weights)
            upload.update({TEACHER_PREFIX + k: v for k, v in trained_teacher.items()})
        if not all(np.isfinite(v).all() for v in upload.values() if v.dtype.kind == "f"):
            log.warning("training diverged (NaN/Inf); uploading anyway, the server will refuse it")
        blob_ref = self.endpoint.offer(SERVER, encode_tensors(upload), "weights", "safetensors")
        smashed_ref = self._smashed(task, runtime, recipe.seed)
        loss = stats.loss if math.isfinite(stats.loss) else None  # JSON has no NaN
        metrics = {
            "samples": stats.samples,
            "loss": loss,
            "accuracy": stats.accuracy,
            "wall_time_s": train_s,
            "fetch_s": fetch_s,
            "peak_rss_mb": peak_rss_mb(),
            "runtime": runtime_name,
            # the label histogram (never the data): FedDM's similarity tree and RecipFL's
            # client descriptor need it
            "label_counts": np.bincount(self.y).tolist(),
        }
        if teacher_run.stats is not None:
            teacher_loss = teacher_run.stats.loss
            metrics["teacher_loss"] = teacher_loss if math.isfinite(teacher_loss) else None
            metrics["teacher_accuracy"] = teacher_run.stats.accuracy
        self._awaiting = task.task_id
        self.endpoint.send(
            SERVER,
            msgs.Result(task_id=task.task_id, round=task.round, weights=blob_ref, metrics=metrics,
                        smashed=smashed_ref),
        )
        log.info(
            "round %d: trained %d samples in %.2f s, loss %.4f, acc %.3f",
            task.round,
            stats.samples,
            train_s,
            stats.loss,
            stats.accuracy,
        )

    def _load_teacher(self, ref: msgs.Teacher) -> tuple[object, str, dict[str, np.ndarray]]:
        """Fetch and load a task's teacher into the torch runtime (it needs ``predict``);
        returns (runtime, its program blob id, the weights the server sent)."""
        program = next((p for p in ref.programs if p.format == modelspec.FORMAT), None)
        if program is None or "torch" not in available_runtimes():
            raise ValueError("the task's teacher needs the torch runtime and a torchspec/1 program")
        if self._teacher is None or self._teacher[1] != program.id:
            teacher_runtime = create_runtime("torch")
            teacher_runtime.load_program(self.endpoint.fetch(SERVER, program), modelspec.FORMAT)
            self._teacher = (teacher_runtime, program.id)
        teacher_runtime = self._teacher[0]
        sent = decode_tensors(self.endpoint.fetch(SERVER, ref.weights))
        teacher_runtime.set_weights(self.local.complete(program.id, sent, teacher_runtime.get_weights()))
        return teacher_runtime, program.id, sent

    def _smashed(self, task: msgs.Task, runtime, seed: int) -> msgs.BlobRef | None:
        """Offer the smashed data ``task`` asks for: the last linear layer's inputs of at most
        ``task.smashed`` local samples (a seeded random subset). None when it asks for none,
        this device does not share them, or its runtime cannot compute them."""
        predict = getattr(runtime, "predict", None)
        if task.smashed <= 0 or not self.config.share_smashed or not len(self.y):
            return None
        pick = np.sort(np.random.default_rng(seed).permutation(len(self.y))[: task.smashed])
        try:
            out = predict(self.x[pick]) if predict else None  # (logits, features (n, F))
            if not (isinstance(out, tuple) and len(out) == 2):
                raise ValueError(f"the {runtime.name} runtime gives no layer inputs")
            data = encode_smashed(np.asarray(out[1]).reshape(len(pick), -1), self.y[pick])
        except Exception as exc:  # the weights still go up; the aggregator copes without these
            log.warning("no smashed data for task %s: %s", task.task_id[:8], exc)
            return None
        return self.endpoint.offer(SERVER, data, "smashed", "safetensors")

    def _finish_task(self) -> None:
        self._awaiting = None
        self.endpoint.withdraw(SERVER)  # the server has what it wanted (or refused it)
        self.tasks_done += 1

    def _runtime(self, name: str):
        if name not in self._runtimes:
            self._runtimes[name] = create_runtime(name)
        return self._runtimes[name]

    def _refuse(self, task: msgs.Task, code: str, detail: str) -> None:
        log.warning("refusing task %s: %s", task.task_id[:8], detail)
        self.endpoint.send(SERVER, msgs.Error(code=code, detail=detail[:500], ref=task.task_id))

    def _heartbeat(self, state: str, task_id: str | None = None, progress: float = 0.0) -> None:
        now = time.monotonic()
        if now - self._last_beat < self.config.heartbeat_s and progress < 1.0:
            return
        self._last_beat = now
        try:
            self.endpoint.send(SERVER, msgs.Heartbeat(state=state, task_id=task_id, progress=progress))
        except Exception:  # a heartbeat is never worth dying for
            log.debug("heartbeat not sent", exc_info=True)
