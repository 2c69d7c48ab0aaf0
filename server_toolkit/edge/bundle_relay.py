"""What a generic edge does with a bundle task: relay each member's own task, forward its update.

A bundle task (``task.config.members``, docs/protocol.md "Bundle tasks", built by the
server's ``edge/bundle.py``) names, per model ``m<k>``, the group device that trains it and
its recipe. The edge re-issues each model as that device's task (its weights and spec as
received, the bundle's ``report``s but never ``features``) in one group round numbered as
the server's round, and answers ONE result: the empty ``model`` record, each answering
member's trained record under its model name, ``metrics.samples`` = their samples and
``metrics.members`` = {model name: that member's samples, loss, accuracy, label counts,
wall time}. Members offline or silent are absent; none answered: the task is refused with
``device_failure``. ``BundleRelay`` is the ``Method`` the group round loop drives meanwhile:
it hands out the members' tasks as the server stamped them (each member trains with the seed
it would have had as a direct device) and keeps their updates (no aggregation, no norm bound:
the server bounds every member against its round).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import Any

from fedcore.recipe import Recipe
from sdk_device.protocol import messages as msgs
from sdk_device.protocol.errors import ProtocolError
from sdk_device.protocol.task_plan import TaskPlan

from ..methods.base import MODEL, ClientUpdate, DeviceInfo, Method, TrainInstruction, Weights
from ..methods.fedconv.relay import TRAIN
from .layer import edge_stack

log = logging.getLogger(__name__)

MEMBER_METRICS = ("loss", "accuracy", "label_counts", "wall_time_s", "runtime",  # forwarded per member
                  "holdout_accuracy", "holdout_loss", "holdout_samples")


class BundleRelay(Method):
    """The members' tasks of one bundle for the group round loop; ``updates`` after it."""

    name = ""  # not a server method: only the edge process drives it
    folds_edges = True  # its group's devices get exactly their tasks (edge/fold.py passes through)
    bounds_updates = False  # the server bounds each member against its round's median
    stamped = True  # the members' recipes carry the server's seeds (and DP): the group loop keeps them

    def __init__(self, tasks: dict[str, TrainInstruction]) -> None:
        super().__init__({}, Recipe())
        self.tasks = tasks  # device id -> its task
        self.updates: list[ClientUpdate] = []

    def initial_weights(self, seed: int) -> Weights:
        return {}

    def configure_train(self, round_number: int, global_weights: Weights,
                        devices: list[DeviceInfo]) -> list[TrainInstruction]:
        return [self.tasks[d.device_id] for d in devices if d.device_id in self.tasks]

    def aggregate_train(self, round_number: int, global_weights: Weights,
                        updates: list[ClientUpdate]) -> Weights:
        self.updates = list(updates)
        return global_weights


def member_tasks(template: TrainInstruction, plan: TaskPlan, online: set[str],
                 holdout: float = 0.0, holdout_ensemble: bool = False) -> dict[str, TrainInstruction]:
    """{device id: its task} for the bundle's members that are online (``template``: the
    bundle as the edge loaded it, every model's spec and weights; ``holdout``,
    ``holdout_ensemble``: the bundle task's ``task.holdout*``, passed on to every member)."""
    reports = dict(template.reports)  # features already dropped by the template
    tasks = {}
    for name, entry in plan.members.items():
        if entry["device"] in online:
            record = template.models[name]
            tasks[entry["device"]] = TrainInstruction(entry["device"], record.spec, record.weights,
                                                      Recipe.from_dict(entry["recipe"]), reports=reports,
                                                      holdout=holdout, holdout_ensemble=holdout_ensemble)
    return tasks


def member_metrics(update: ClientUpdate) -> dict:
    """What the server learns of one member: its samples and the metrics it reported."""
    out: dict = {"samples": update.num_samples}
    for key in MEMBER_METRICS:
        value = update.metrics.get(key)
        if isinstance(value, float) and not math.isfinite(value):
            continue
        if value is not None:
            out[key] = value
    return out


def relay_bundle(edge: Any, task: msgs.Task, plan: TaskPlan) -> None:
    """Relay one bundle task over ``edge``'s group (an ``EdgeAggregator``; not imported: it
    imports this module) and send its one result (or refuse it)."""
    try:
        template = edge._template(task, plan)
    except (ProtocolError, TimeoutError, ValueError) as exc:
        edge._refuse(task, "bad_task", f"could not load the task: {exc}")
        return
    tasks = member_tasks(template, plan, set(edge.grid.devices), task.holdout or 0.0,
                         bool(task.holdout_ensemble))
    if not tasks:
        edge._refuse(task, "device_failure", f"none of the bundle's {len(plan.members)} member(s) is online")
        return
    relay = BundleRelay(tasks)
    started = time.time()
    group_method, edge.group.method = edge.group.method, relay
    group_stack, edge.group.aggregator = edge.group.aggregator, edge_stack(relay)  # the round's method
    try:
        row = edge._group_round(task, TRAIN, {}, edge._group_time(task, started), first=task.round)
    finally:
        edge.group.method, edge.group.aggregator = group_method, group_stack
    name_of = {entry["device"]: name for name, entry in plan.members.items()}
    answered = {name_of[u.device_id]: u for u in relay.updates if u.device_id in name_of}
    if not answered:
        edge._refuse(task, "device_failure", f"no member of the bundle returned an update "
                                             f"({row['selected']} asked)")
        return
    members = {name: member_metrics(u) for name, u in sorted(answered.items())}
    metrics = {"samples": sum(m["samples"] for m in members.values()), "runtime": "edge",
               "wall_time_s": time.time() - started, "edge_devices": len(members), "members": members}
    edge._answer(task, {MODEL: {}, **{name: u.weights for name, u in answered.items()}}, metrics)
    log.info("round %d: forwarded %d of %d member update(s), %d samples", task.round, len(members),
             len(plan.members), metrics["samples"])


def fit_members(hello: msgs.Hello) -> msgs.Hello:
    """``hello`` as a generic edge sends it: without ``profile.members`` when the list would
    push it past a control message's limit (``MAX_CONTROL_BYTES``, 64 KiB: about 400 members of
    the swarm's size). Such an edge takes partial-sum tasks only, no bundles (docs/operations.md,
    "Sizing"); a hello that is too large for another reason still raises ``too_large``."""
    try:
        msgs.encode(hello)
        return hello
    except ProtocolError as exc:
        if exc.code != "too_large" or "members" not in hello.profile:
            raise
    log.info("hello without its %d members: the list does not fit in %d bytes", len(hello.profile["members"]),
             msgs.MAX_CONTROL_BYTES)
    return dataclasses.replace(hello, profile={k: v for k, v in hello.profile.items() if k != "members"})


def hello_members(online: list[DeviceInfo]) -> list[dict]:
    """The group as a generic edge's hello lists it (``profile.members``): what the server's
    method reads of each device, its tier as this edge's registry resolved it."""
    return [{"device_id": d.device_id, "num_samples": d.num_samples, "tier": d.tier,
             "runtimes": list(d.runtimes), "profile": d.profile} for d in online]
