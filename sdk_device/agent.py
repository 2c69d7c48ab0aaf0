"""The device agent: receive task -> pull blobs -> train -> upload -> wait.

Training happens on the agent's own thread, never inside an MQTT callback (paho only
acknowledges a message after its callback returns).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from fedcore import modelspec

from .announce import Announcer
from .data.npz import load_npz
from .holdout import check_members, split_holdout
from .local_tensors import LocalTensors
from .outputs import OUTPUTS, check_reports
from .policy import DevicePolicy
from .profile import device_profile, peak_rss_mb
from .protocol import messages as msgs
from .protocol.blobs import DEFAULT_CHUNK_BYTES, decode_tensors, encode_tensors
from .protocol.clock import seconds_left
from .protocol.errors import RETRYABLE_RESULT_CODES, ProtocolError
from .protocol.task_plan import TaskPlan, parse_plan
from .protocol.topics import FleetTopics
from .runtime_choice import RuntimeChooser, trainable_offers
from .runtimes.pte_contract import UnsupportedKernels
from .runtimes.registry import available_runtimes, create_runtime, pick_runtime
from .secagg_sessions import SecAggSessions
from .seen_tasks import SeenTasks
from .task_runner import LoadedModel, run_task
from .transport.backoff import connect_patiently
from .transport.blob_store import BlobStore
from .transport.endpoint import SERVER, Endpoint
from .transport.mqtt_link import BrokerAddress, BrokerRefused

log = logging.getLogger(__name__)
MAX_RESENDS = 3  # a result rejected for a retryable reason (checksum_mismatch, timeout) is sent again


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
    heartbeat_s: float = 10.0  # QoS 0, and none while the server's status is "offline"
    announce_window_s: float | None = None  # hello spread after a server restart; None: the server's
    extra_profile: dict = field(default_factory=dict)
    share_smashed: bool = True  # send the "features" output (last-layer inputs) when a task asks
    # simulation knob (stragglers): after training sleep (slowdown - 1) x the training time; not after
    # the process's first task, whose time is mostly the runtime's warm-up (~10x a later task's)
    slowdown: float = 1.0
    policy: DevicePolicy | None = None  # train only while its conditions hold (else refuse: policy)
    connect_timeout_s: float | None = None  # give up waiting for the broker after this; None: never


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
        self._stop = threading.Event()
        self._runtimes: dict[tuple[str, str], object] = {}  # (model name, runtime) -> its runtime
        self._loaded_program: dict[tuple[str, str], str] = {}  # (model name, runtime) -> program blob id
        self._last_beat = 0.0
        self._awaiting: str | None = None  # task whose result waits for the server's ack or error
        self._resends = 0  # the awaited result sent again after retryable rejections
        self.announcer: Announcer | None = None  # made by run(): hellos and result re-offers
        self.tasks_done = 0
        self.secagg = SecAggSessions(config.device_id, self.endpoint)  # secure rounds (--secagg)
        self._trained = 0  # tasks trained by this process
        self._seen = SeenTasks()  # task ids taken: a copy the server sends again is ignored

    def stop(self) -> None:
        self._stop.set()

    def run(self, max_tasks: int | None = None) -> None:
        """Connect, say hello, then serve tasks. Returns after stop() or max_tasks."""
        runtimes = [
            r for r in available_runtimes() if self.config.runtimes is None or r in self.config.runtimes
        ]
        if not runtimes:
            raise RuntimeError("no training runtime is installed here: pip install 'fedsdk[torch]'")
        self._runtimes[("model", runtimes[0])] = create_runtime(runtimes[0])  # import the engine now
        hello = msgs.Hello(
            device_id=self.config.device_id,
            runtimes=runtimes,
            num_samples=len(self.y),
            profile={**device_profile(runtimes), **self.config.extra_profile},
        )
        self.announcer = Announcer(lambda m: self.endpoint.send(SERVER, m), hello,
                                   self.config.announce_window_s)
        self.endpoint.on_server_event = self.announcer.on_event  # before connecting: retained copies
        try:  # a broker that is not up yet is waited for (transport/backoff.py)
            if not connect_patiently(self.endpoint.start, self._stop, self.config.connect_timeout_s):
                return  # stopped while waiting
        except BaseException:  # gave up, refused, or Ctrl-C while waiting
            self.announcer.close()
            self.endpoint.close()
            raise
        log.info(
            "device %s connected to %s (runtimes: %s, %d samples)",
            self.config.device_id,
            self.config.broker_url,
            ", ".join(runtimes),
            len(self.y),
        )
        self.announcer.say_hello()
        try:
            while not self._stop.is_set() and (max_tasks is None or self.tasks_done < max_tasks):
                if self.endpoint.link.refused:  # a reconnect was refused: the credentials are gone
                    raise BrokerRefused(f"MQTT broker at {self.config.broker_url} refused us: "
                                        f"{self.endpoint.link.refused}")
                try:
                    incoming = self.endpoint.inbox.get(timeout=0.5)
                except queue.Empty:
                    self._heartbeat("idle")
                    continue
                self._handle(incoming)
        finally:
            self.announcer.close()
            self.endpoint.close()

    # -- messages --------------------------------------------------------------------------
    def _handle(self, incoming) -> None:
        message = incoming.message
        if incoming.status is not None:  # hellos after a server restart: the announcer's job
            log.info("server is %s", incoming.status)
        elif isinstance(message, msgs.Task) and not self._seen.first_time(message.task_id):
            log.info("task %s again: already taken, ignored", message.task_id[:8])
        elif isinstance(message, msgs.Task):
            try:
                self._run_task(message, incoming.arrived)
            except Exception as exc:  # one broken task must not end the agent
                log.exception("task %s failed", message.task_id[:8])
                self._refuse(message, "device_failure", f"{type(exc).__name__}: {exc}")
        elif isinstance(message, msgs.Ack) and message.ref == self._awaiting:
            log.info("server accepted the result of task %s", message.ref[:8])
            self._finish_task()
        elif isinstance(message, msgs.SecAgg):
            self._on_secagg(message)
        elif isinstance(message, msgs.Error):
            log.warning("server reports %s: %s (ref %s)", message.code, message.detail, message.ref)
            if message.ref is not None and message.ref == self._awaiting:  # our result was refused
                if message.code in RETRYABLE_RESULT_CODES and self._resends < MAX_RESENDS:
                    self._resends += 1  # not our data's fault: the very same result again (§9.5)
                    self.announcer.reoffer(f"the server's pull ended in {message.code}")
                else:
                    self._finish_task()

    def _run_task(self, task: msgs.Task, arrived: float) -> None:
        """Train ``task`` (``arrived``: monotonic seconds when it reached this device)."""
        left = seconds_left(task.deadline, task.server_time, time.monotonic() - arrived)
        if left <= 0:
            rule = "from its server_time" if task.server_time is not None else "by this device's clock"
            self._refuse(task, "deadline_passed", f"the task arrived after its deadline ({-left:.1f} s late, "
                         f"{rule})")
            return
        blocked = self.config.policy.blocked() if self.config.policy is not None else None
        if blocked is not None:
            self._refuse(task, "policy", f"this device may not train now: {blocked}")
            return
        try:
            plan = parse_plan(task.config, set(task.programs), set(OUTPUTS))
            plan = replace(plan, reports=check_reports(plan.reports, set(task.programs)))
            if task.holdout_model is not None and task.holdout_model not in task.programs:
                raise ProtocolError("invalid_field", f"task.holdout_model names {task.holdout_model!r}, "
                                                     "which the task lacks")
            try:
                members = check_members(task.holdout_members, set(task.programs),
                                        task.holdout_model or plan.steps[-1].model)
            except ValueError as exc:
                raise ProtocolError("invalid_field", str(exc)) from None
            why = self.secagg.refusal(task.round, plan.steps[-1].recipe)  # DP it cannot honour masked
            if why is not None:
                raise ValueError(why)
            placement = self._place(task, plan)
        except ProtocolError as exc:
            self._refuse(task, exc.code, exc.detail)
            return
        except ValueError as exc:
            self._refuse(task, "unsupported_task", str(exc))
            return
        main = plan.steps[-1].model
        log.info("round %d: task %s, %s with %s (%s)", task.round, task.task_id[:8], main, *placement[main])
        try:
            fetch_started = time.perf_counter()
            loaded = {name: self._load(name, task, *placement[name]) for name in sorted(task.programs)}
            fetch_s = time.perf_counter() - fetch_started
        except UnsupportedKernels as exc:  # a program needing kernels this runtime lacks
            self._refuse(task, exc.code, str(exc))
            return
        except (ProtocolError, TimeoutError, ValueError, KeyError, RuntimeError) as exc:
            self._refuse(task, "bad_task", f"could not load the task: {exc}")
            return
        train_started = time.perf_counter()
        output = run_task(plan, loaded, self.x, self.y, self.local,
                          progress=lambda f: self._heartbeat("training", task.task_id, f),
                          share_features=self.config.share_smashed, holdout=task.holdout or 0.0,
                          holdout_model=task.holdout_model, holdout_ensemble=bool(task.holdout_ensemble),
                          holdout_members=members)
        train_s = time.perf_counter() - train_started
        if self.config.slowdown > 1.0 and self._trained:  # a simulated straggler (not while warming up)
            self._stop.wait((self.config.slowdown - 1.0) * train_s)
        self._trained += 1
        for name, tensors in output.arrays.items():
            if not all(np.isfinite(v).all() for v in tensors.values() if v.dtype.kind == "f"):
                log.warning("%s holds NaN/Inf (training diverged?); sent anyway, the server refuses it", name)
        metrics = {**output.metrics, "wall_time_s": train_s, "fetch_s": fetch_s, "peak_rss_mb": peak_rss_mb(),
                   "runtime": placement[main][0]}
        if self.secagg.expects(task.round):  # a secure round: the update leaves masked (secagg_client.py)
            trained = self.y[split_holdout(self.y, task.holdout)[0]] if task.holdout else self.y
            self.secagg.start(task.round, output.arrays[main], metrics["samples"], trained, metrics,
                              loaded[main].sent, plan.steps[-1].recipe.dp_secure_clip,
                              local_dp=plan.steps[-1].recipe.dp_clip > 0)
            return
        refs = {name: self.endpoint.offer(SERVER, encode_tensors(tensors), "weights", "safetensors")
                for name, tensors in output.arrays.items()}
        self._awaiting, self._resends = task.task_id, 0
        result = msgs.Result(task_id=task.task_id, round=task.round, arrays=refs, metrics=metrics)
        self.announcer.awaiting(result)  # offered again after a reconnect or a server restart
        self.endpoint.send(SERVER, result)
        log.info("round %d: trained %d samples in %.2f s, loss %s, acc %.3f", task.round, metrics["samples"],
                 train_s, metrics["loss"], metrics["accuracy"])

    def _place(self, task: msgs.Task, plan: TaskPlan) -> dict[str, tuple[str, str]]:
        """model name -> (runtime, program format). The model the last step trains goes to the
        fastest runtime that passed its self-test (or the preference order); every other model
        (a teacher, a model trained first) to the torch runtime, which can also predict."""
        main = plan.steps[-1].model
        placement = {}
        # the self-test's samples: never a held-back one (sdk_device/holdout.py)
        sample = split_holdout(self.y, task.holdout)[0][:256] if task.holdout else slice(0, 256)
        for name, programs in task.programs.items():
            formats = [p.format for p in programs]
            if name != main:
                if "torch" not in available_runtimes() or modelspec.FORMAT not in formats:
                    raise ValueError(f"model {name!r} needs the torch runtime and a {modelspec.FORMAT} "
                                     "program")
                placement[name] = ("torch", modelspec.FORMAT)
                continue
            runtime_name, fmt = pick_runtime(formats, self.config.runtimes)
            offers = trainable_offers(programs, self.config.runtimes)
            try:  # the fastest runtime that passes parity on this very program, tested once
                chosen = self.chooser.choose(programs, task.arrays[name], plan.steps[-1].recipe, offers,
                                             lambda ref: self.endpoint.fetch(SERVER, ref), self.x[sample],
                                             self.y[sample])
            except Exception:  # a failing self-test must not cost the round
                log.exception("runtime self-test failed; using the preference order")
                chosen = None
            placement[name] = (chosen, offers[chosen]) if chosen is not None else (runtime_name, fmt)
        self.chooser.remember_task(task)
        return placement

    def _load(self, name: str, task: msgs.Task, runtime_name: str, fmt: str) -> LoadedModel:
        """Model ``name`` of ``task`` in a runtime of its own, with its weights (completed by
        the tensors this device keeps)."""
        key = (name, runtime_name)
        if key not in self._runtimes:
            self._runtimes[key] = create_runtime(runtime_name)
        runtime = self._runtimes[key]
        program = next(p for p in task.programs[name] if p.format == fmt)
        if self._loaded_program.get(key) != program.id:
            runtime.load_program(self.endpoint.fetch(SERVER, program), fmt)
            self._loaded_program[key] = program.id
        sent = decode_tensors(self.endpoint.fetch(SERVER, task.arrays[name]))
        runtime.set_weights(self.local.complete(program.id, sent, runtime.get_weights()))
        return LoadedModel(runtime, program.id, sent)

    def _on_secagg(self, message: msgs.SecAgg) -> None:
        """One stage of a secure round; an Error to the server when this device refuses it."""
        try:
            if self.secagg.on_message(message):
                self._finish_task()
        except Exception as exc:  # a bad request must not end the agent
            log.warning("secure round %d, stage %s refused: %s", message.round, message.stage, exc)
            self.endpoint.send(SERVER, msgs.Error(code="secagg_refused", detail=str(exc)[:500], ref=None))

    def _finish_task(self) -> None:
        self._awaiting = None
        self.announcer.awaiting(None)
        self.endpoint.withdraw(SERVER)  # the server has what it wanted (or refused it)
        self.tasks_done += 1

    def _refuse(self, task: msgs.Task, code: str, detail: str) -> None:
        log.warning("refusing task %s: %s", task.task_id[:8], detail)
        self.endpoint.send(SERVER, msgs.Error(code=code, detail=detail[:500], ref=task.task_id))

    def _heartbeat(self, state: str, task_id: str | None = None, progress: float = 0.0) -> None:
        now = time.monotonic()
        if now - self._last_beat < self.config.heartbeat_s and progress < 1.0:
            return
        if self.announcer is not None and not self.announcer.server_online:
            return  # nobody listens; QoS 0 would not queue it anyway
        self._last_beat = now
        try:  # QoS 0: never queued in an offline server's session
            self.endpoint.send(SERVER, msgs.Heartbeat(state=state, task_id=task_id, progress=progress), qos=0)
        except Exception:  # a heartbeat is never worth dying for
            log.debug("heartbeat not sent", exc_info=True)
