"""An edge aggregator: one process between the server and a group of devices.

FedConv puts edge servers between its server and the clients of one shrinkage ratio; in
fedsdk they are also the scale-out path. An edge speaks wire protocol v2 on both sides
and needs no edge-specific code on the server or on the devices:

* **Upward** it is an ordinary *device* of the server's fleet (``--fleet``, own device id, e.g.
  ``edge-1``). Its hello reports the group (``num_samples`` summed over its online devices,
  their ``runtimes``, ``profile`` = ``{"role": "edge", "tier": …, "devices": n, "group_fleet":
  …}``), again when the group changes; its MQTT will tells the server when it dies.
* **Downward** it is the *server* of its own fleet (``<fleet>.<edge id>`` by default,
  possibly on another broker): the round loop over an MQTT grid of its own (an
  ``Endpoint``, a registry, a blob store and checkpoints in ``--run-dir``), driving
  ``methods.fedconv.relay.EdgeRelay``.
  On brokers with per-device accounts and ACLs (``fedsdk-server security``) the edge's
  device account only reaches its own ``dev/<edge id>`` subtree upward, so its group needs
  a broker of its own (``security init --fleet <fleet>.<edge id>``, typically at the edge
  site), whose server account the edge uses (``--group-broker-security``).

For each server task: pull the task's programs and weights, and its teacher if it has one
(all forwarded as received; programs in every format offered) → a warm-up round on the
group if clustering is due → one training round on the group with the server's recipe
(round deadline = the server's, minus a margin for the way up) → one ``result`` up: the
relay's aggregate, ``samples`` = the accepted devices' samples, plus the group's loss/accuracy,
label counts, held-back accuracy and the clustering / projection figures (never smashed data).
No accepted update → the task is refused with ``device_failure``.

With ``method`` set (``--method``) the edge is *generic* instead: no clustering, no
warm-up; its group round runs the server's method over the global model the server sends
(``edge/sum_relay.py``) and it answers with a partial aggregate, ``model`` (its group's
mean) plus ``coverage`` (``edge/partial.py``), so the server's result equals the flat
aggregate. Its hello says ``aggregates: "sums"`` and the method, which is how the server
tells it apart (``edge/fold.py``). Its hello also lists its members; when the server's
method is not a sum the server plans them itself and sends a bundle task instead, which the
edge relays member by member (``edge/bundle_relay.py``).
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from fedcore import modelspec
from sdk_device.outputs import OUTPUTS
from sdk_device.protocol import messages as msgs
from sdk_device.protocol.blobs import decode_tensors, encode_tensors
from sdk_device.protocol.errors import ProtocolError
from sdk_device.protocol.task_plan import TaskPlan, parse_plan
from sdk_device.protocol.topics import FleetTopics, check_name
from sdk_device.seen_tasks import SeenTasks
from sdk_device.transport.blob_store import BlobStore
from sdk_device.transport.endpoint import SERVER, Endpoint
from sdk_device.transport.mqtt_link import BrokerAddress

from ..fleet.registry import FleetRegistry
from ..methods.base import MODEL, ModelRecord, TrainInstruction
from ..methods.fedconv.relay import TRAIN, WARMUP, EdgeOptions, EdgeRelay, ForwardedTask
from ..methods.holdout_accuracy import reported, weighted
from ..methods.records import FEATURES
from ..rounds.loop import LoopConfig, RoundLoop
from ..secagg.mqtt_grid import SecAggMqttGrid
from .bundle_relay import fit_members, hello_members, relay_bundle
from .fold import SUMS
from .partial import COVERAGE, devices_behind
from .secure_group import SECURE_EDGE, group_grid, min_group_error, round_updates
from .sum_relay import SumRelay

log = logging.getLogger(__name__)


def default_group_fleet(fleet: str, edge_id: str) -> str:
    """The fleet an edge's own devices join unless told otherwise: ``<fleet>.<edge id>``."""
    return f"{fleet}.{edge_id}"


@dataclass
class EdgeConfig:
    """Everything an edge aggregator needs. ``group_fleet`` defaults to ``<fleet>.<edge_id>``,
    ``group_broker_url`` to ``broker_url``; the group side logs in with ``group_username`` /
    ``group_password`` / ``group_ca_file`` when given (a secured group broker), else upward's."""

    broker_url: str
    fleet: str
    edge_id: str
    run_dir: Path
    tier: str | None = None
    group_fleet: str | None = None
    group_broker_url: str | None = None
    min_devices: int = 1
    devices_wait_s: float = 120.0
    clients_per_round: int | None = None  # group devices asked per group round; None: every online one
    username: str | None = None
    password: str | None = None
    ca_file: str | None = None
    group_username: str | None = None
    group_password: str | None = None
    group_ca_file: str | None = None
    insecure: bool = False  # allow plain mqtt:// to a non-loopback broker
    heartbeat_s: float = 10.0
    options: EdgeOptions = field(default_factory=EdgeOptions)
    method: str | None = None  # a generic edge for this method (edge/sum_relay.py); None: FedConv's relay
    method_options: dict = field(default_factory=dict)
    secagg: dict | None = None  # secure group rounds (edge/secure_group.py): SecAggSettings as a dict
    program_formats: list[str] | None = None  # a generic edge's group programs (None: torchspec/1)
    pte_kernels: str = "fused"  # ... the kernel set of their pte/1 ones (a refusing device: portable)

    def __post_init__(self) -> None:
        check_name("edge id", self.edge_id)
        if self.method is None and self.program_formats not in (None, [modelspec.FORMAT]):
            raise ValueError("--programs: FedConv's edge forwards the server's programs as received; "
                             "give --programs to the server (or --method for a generic edge)")
        if self.secagg is not None and (self.method is None or min_group_error(self.min_devices, "--secagg")):
            raise ValueError(min_group_error(self.min_devices, "--secagg --min-devices")
                             or "--secagg needs a generic edge (--method)")
        group_fleet = self.group_fleet or default_group_fleet(self.fleet, self.edge_id)
        self.group_fleet = check_name("group fleet", group_fleet)
        self.run_dir = Path(self.run_dir)


class EdgeAggregator:
    """See the module docstring; ``run()`` serves until ``stop()``."""

    def __init__(self, config: EdgeConfig) -> None:
        self.config = config
        self.registry = FleetRegistry(config.run_dir / "registry.sqlite")
        if not self.registry.devices():
            raise ValueError(f"no devices registered for edge {config.edge_id}: "
                             f"fedsdk-server devices add --run-dir {config.run_dir} DEVICE_ID …")
        store = BlobStore(config.run_dir / "blobs")  # one store: what comes down is offered on
        self.up = Endpoint(BrokerAddress.parse(config.broker_url), FleetTopics(config.fleet), store,
                           device_id=config.edge_id, username=config.username, password=config.password,
                           ca_file=config.ca_file, insecure=config.insecure)
        own_login = config.group_username is not None
        self.down = Endpoint(BrokerAddress.parse(config.group_broker_url or config.broker_url),
                             FleetTopics(config.group_fleet), store, is_known_peer=self.registry.is_known,
                             username=config.group_username if own_login else config.username,
                             password=config.group_password if own_login else config.password,
                             ca_file=config.group_ca_file or config.ca_file, insecure=config.insecure)
        self.sums = SumRelay(config.method, config.method_options) if config.method else None
        self.relay = EdgeRelay(config.options)
        group_method = self.sums or self.relay
        self.grid, stack = group_grid(self.down, self.registry, group_method, config.secagg,
                                      config.options.seed, program_formats=config.program_formats,
                                      pte_kernels=config.pte_kernels)
        self.group = RoundLoop(group_method, self.grid, LoopConfig(rounds=0, seed=config.options.seed,
                                                                    clients_per_round=config.clients_per_round),
                               run_dir=config.run_dir, aggregator=stack)
        self._stop = threading.Event()
        self._announced: tuple | None = None  # (devices, samples) of the last hello
        self._awaiting: str | None = None  # task whose result waits for the server's answer
        self._current: tuple[str, int] | None = None  # (task id, group round) being relayed
        self._seen = SeenTasks()  # task ids taken: a copy the server sends again is ignored
        self.tasks_done = 0

    def stop(self) -> None:
        self._stop.set()

    # -- main loop -------------------------------------------------------------------------
    def run(self, max_tasks: int | None = None) -> None:
        """Wait for the group, join the server's fleet, relay tasks until stop()."""
        c = self.config
        self.down.start()
        try:
            self.group.start(resume=True)  # clusters survive a restart
            online = self.grid.wait_for_devices(c.min_devices, c.devices_wait_s)
            if online == 0:
                raise RuntimeError(f"no device of {c.group_fleet} came online in {c.devices_wait_s:.0f} s")
            log.info("edge %s: %d device(s) of %s online", c.edge_id, online, c.group_fleet)
            self.up.start()
            self._hello()
            threading.Thread(target=self._heartbeats, daemon=True).start()
            while not self._stop.is_set() and (max_tasks is None or self.tasks_done < max_tasks):
                self.grid.poll(0.1)  # group hellos and statuses between rounds
                try:
                    incoming = self.up.inbox.get(timeout=0.1)
                except queue.Empty:
                    if self._group_state() != self._announced and self.grid.devices:
                        self._hello()
                    continue
                self._handle(incoming)
        finally:
            self._stop.set()
            self.grid.close()
            self.up.close()
            self.down.close()
            self.registry.close()

    def _handle(self, incoming) -> None:
        message = incoming.message
        if incoming.status is not None:
            log.info("server is %s", incoming.status)
            if incoming.status == "online" and self.grid.devices:
                self._hello()
        elif isinstance(message, msgs.Task) and not self._seen.first_time(message.task_id):
            log.info("task %s again: already relayed, ignored", message.task_id[:8])
        elif isinstance(message, msgs.Task):
            try:
                self._relay(message)
            except Exception as exc:  # one broken task must not end the edge
                log.exception("task %s failed", message.task_id[:8])
                self._refuse(message, "device_failure", f"{type(exc).__name__}: {exc}")
            finally:
                self._current = None
        elif isinstance(message, msgs.Ack | msgs.Error) and message.ref is not None \
                and message.ref == self._awaiting:
            log.info("server answered task %s: %s", message.ref[:8],
                     "accepted" if isinstance(message, msgs.Ack) else message.code)
            self._awaiting = None
            self.up.withdraw(SERVER)
            self.tasks_done += 1
        elif isinstance(message, msgs.Error):
            log.warning("server reports %s: %s (ref %s)", message.code, message.detail, message.ref)

    # -- one server task -------------------------------------------------------------------
    def _relay(self, task: msgs.Task) -> None:
        if task.deadline < time.time():
            self._refuse(task, "deadline_passed", "the task arrived after its deadline")
            return
        try:
            plan = parse_plan(task.config, set(task.programs), set(OUTPUTS), bundles=self.sums is not None)
            if plan.steps[-1].model != MODEL:
                raise ProtocolError("unsupported_task", f"an edge relays tasks whose last step trains "
                                                        f"{MODEL!r}")
        except ProtocolError as exc:
            self._refuse(task, exc.code, exc.detail)
            return
        if not self.grid.devices:
            self._refuse(task, "device_failure", f"no device of {self.config.group_fleet} is online")
            return
        if plan.members:  # a bundle: each member's own task, each update forwarded
            relay_bundle(self, task, plan)
            return
        if self.sums is not None:
            self._relay_sums(task, plan)
            return
        try:
            template = self._template(task, plan)
            self.relay.forward(ForwardedTask(template))
        except (ProtocolError, TimeoutError, ValueError) as exc:
            self._refuse(task, "bad_task", f"could not load the task: {exc}")
            return
        weights = template.weights
        log.info("round %d: relaying task %s to %d device(s)", task.round, task.task_id[:8],
                 len(self.grid.devices))
        started = time.time()
        budget = self._group_time(task, started)
        if self.relay.needs_warmup():  # ends when the group answered; at most half of the time
            self._group_round(task, WARMUP, weights, budget / 2)
        row = self._group_round(task, TRAIN, weights, started + budget - time.time())
        if not row["accepted"]:
            self._refuse(task, "device_failure", f"no device of {self.config.group_fleet} returned an update")
            return
        records = {MODEL: self.group.global_weights, **self.relay.returned}
        metrics = self._metrics(row, time.time() - started, "label_counts" in plan.reports)
        self._answer(task, {name: records[name] for name in plan.returns if name in records}, metrics)
        log.info("round %d: sent the aggregate of %d device(s), %d samples", task.round, row["accepted"],
                 metrics["samples"])

    def _relay_sums(self, task: msgs.Task, plan: TaskPlan) -> None:
        """A generic edge's answer: its group's mean and coverage (``edge/sum_relay.py``)."""
        if set(plan.returns) != {MODEL, COVERAGE}:
            self._refuse(task, "unsupported_task", f"a generic edge returns {MODEL!r} and {COVERAGE!r}")
            return
        if plan.steps[-1].recipe.dp_secure_clip > 0 and not isinstance(self.grid, SecAggMqttGrid):
            self._refuse(task, "unsupported_task", "dp_secure_clip: the group's clipped deltas must be "
                         "summed securely (start this edge with --secagg)")
            return
        try:
            template = self._template(task, plan)
            self.sums.forward(template.spec, template.recipe, task.round, template.reports)
            if isinstance(self.grid, SecAggMqttGrid):  # the group's secure sum, in global coordinates
                self.grid.serve(self.sums.inner, template.weights)
        except (ProtocolError, TimeoutError, ValueError) as exc:
            self._refuse(task, "bad_task", f"could not load the task: {exc}")
            return
        started = time.time()
        row = self._group_round(task, TRAIN, template.weights, self._group_time(task, started),
                                first=task.round)
        if not row["accepted"]:
            self._refuse(task, "device_failure", f"no device of {self.config.group_fleet} returned an update")
            return
        records = {MODEL: self.group.global_weights, COVERAGE: self.sums.partial.coverage(template.weights)}
        metrics = self._metrics(row, time.time() - started, "label_counts" in plan.reports)
        self._answer(task, records, metrics)
        log.info("round %d: sent the partial aggregate of %d update(s), %d samples", task.round,
                 row["accepted"], metrics["samples"])

    @staticmethod
    def _group_time(task: msgs.Task, started: float) -> float:
        """Seconds the group round(s) of ``task`` may take from ``started``: time left minus a 15 %
        (≥ 5 s) margin."""
        return task.deadline - started - max(5.0, 0.15 * (task.deadline - started))

    def _answer(self, task: msgs.Task, records: dict[str, dict], metrics: dict) -> None:
        """Offer ``records`` (array record name -> tensors) to the server and send ``task``'s one
        result; the server's ack or error for it ends the task (``_handle``)."""
        arrays = {name: self.up.offer(SERVER, encode_tensors(tensors), "weights", "safetensors")
                  for name, tensors in records.items()}
        self._awaiting = task.task_id
        result = msgs.Result(task_id=task.task_id, round=task.round, arrays=arrays, metrics=metrics)
        self.up.send(SERVER, result)

    def _template(self, task: msgs.Task, plan: TaskPlan) -> TrainInstruction:
        """The server's task as a template: each model's programs, spec (from ``torchspec/1``), weights."""
        models = {}
        for name, refs in task.programs.items():
            programs = tuple((ref.format, self.up.fetch(SERVER, ref)) for ref in refs)
            torchspec = next((data for fmt, data in programs if fmt == modelspec.FORMAT), None)
            spec = modelspec.loads(torchspec) if torchspec is not None else {}
            weights = decode_tensors(self.up.fetch(SERVER, task.arrays[name]))
            models[name] = ModelRecord(spec, weights, programs)
        main, last = models.pop(MODEL), plan.steps[-1]
        reports = {k: v for k, v in plan.reports.items() if k != FEATURES}  # an edge never sends features up
        return TrainInstruction("", main.spec, main.weights, last.recipe, models=models,
                                steps_before=plan.steps[:-1], teacher=last.teacher, returns=plan.returns,
                                reports=reports, programs=main.programs,
                                holdout_members=tuple(task.holdout_members or ()))

    def _group_round(self, task: msgs.Task, phase: str, weights, timeout_s: float, first: int = 0) -> dict:
        """One round on the group (WARMUP or TRAIN), starting from ``weights``; numbered
        ``first`` when given and free (a generic edge numbers its rounds as the server's),
        else after the last one."""
        rnd = first if first > self.group.completed_round else self.group.completed_round + 1
        while self.registry.round_info(rnd) is not None:  # never reopen a round of an old task
            rnd += 1
        self.relay.phase = phase
        self.group.global_weights, config = weights, self.group.config
        config.round_timeout_s, config.holdout = max(timeout_s, 1.0), task.holdout or 0.0  # --holdout
        config.holdout_ensemble = bool(task.holdout_ensemble)  # and how the group's devices score it
        self._current = (task.task_id, rnd)
        row = self.group.run_round(rnd)
        log.info("group round %d (%s, server round %d): %d/%d updates", rnd, phase, task.round,
                 row["accepted"], row["selected"])
        return row

    def _metrics(self, row: dict, seconds: float, label_counts: bool) -> dict:
        updates = round_updates(self.grid, self.registry, row["round"])
        metrics: dict = {"samples": sum(u["num_samples"] for u in updates), "runtime": "edge",
                         "wall_time_s": seconds,  # devices behind it, through nested edges too:
                         "edge_devices": sum(devices_behind(u["metrics"]) for u in updates)}
        if "device_loss" in row:
            metrics["loss"] = row["device_loss"]
        if "device_accuracy" in row:
            metrics["accuracy"] = row["device_accuracy"]
        held = weighted(found for u in updates if (found := reported(u["metrics"])) is not None)
        if held is not None:  # the group's held-back splits, as one device's (methods/holdout_accuracy.py)
            metrics.update(holdout_accuracy=held[0], holdout_samples=held[1])
        counts = [u["metrics"].get("label_counts") for u in updates]
        if label_counts and counts and all(isinstance(c, list) for c in counts):
            total = [0] * max(len(c) for c in counts)
            for c in counts:
                for i, n in enumerate(c):
                    total[i] += n
            metrics["label_counts"] = total
        metrics.update(self.relay.summary)
        return {k: v for k, v in metrics.items() if not (isinstance(v, float) and not math.isfinite(v))}

    # -- upward chatter --------------------------------------------------------------------
    def _group_state(self) -> tuple:
        online = self.grid.devices
        return tuple(sorted(online)), sum(d.num_samples for d in online.values())

    def _hello(self) -> None:
        online = self.grid.devices
        runtimes = sorted({r for d in online.values() for r in d.runtimes}) or ["torch"]
        profile = {"role": "edge", "devices": len(online), "group_fleet": self.config.group_fleet}
        if self.sums is not None:
            profile.update(aggregates=SUMS, method=self.sums.method_name,
                           members=hello_members(self.grid.online()))
            if self.config.secagg is not None:
                profile[SECURE_EDGE] = True
        if self.config.tier is not None:
            profile["tier"] = self.config.tier
        self._announced = self._group_state()
        self.up.send(SERVER, fit_members(msgs.Hello(device_id=self.config.edge_id, runtimes=runtimes,
                                                    num_samples=self._announced[1], profile=profile)))

    def _refuse(self, task: msgs.Task, code: str, detail: str) -> None:
        log.warning("refusing task %s: %s", task.task_id[:8], detail)
        self.up.send(SERVER, msgs.Error(code=code, detail=detail[:500], ref=task.task_id))

    def _heartbeats(self) -> None:
        """Every ``heartbeat_s``: "idle", or "relaying" with the share of the group that answered."""
        while not self._stop.wait(self.config.heartbeat_s):
            current = self._current
            try:
                if current is None:
                    self.up.send(SERVER, msgs.Heartbeat(state="idle"))
                else:
                    task_id, rnd = current
                    asked = len((self.registry.round_info(rnd) or {}).get("selected", [])) or 1
                    done = min(1.0, self.registry.count_updates(rnd) / asked)
                    self.up.send(SERVER, msgs.Heartbeat(state="relaying", task_id=task_id, progress=done))
            except Exception:  # a heartbeat is never worth dying for
                log.debug("heartbeat not sent", exc_info=True)
