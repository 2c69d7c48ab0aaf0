"""Bundle edges: an edge that forwards each member's update, for methods that are not sums.

FedDM (window slots per tier, per-device subtree layers, a similarity tree over the clients'
own outputs and label counts) and HypeMeFed with hypernetworks (trained on, and generating
from, each client's own conv weights) cannot be pre-added by an edge: no per-tier sum
reproduces a nonlinear function of every client's own tensors. For them the *server* plans
and aggregates every member as if it were a direct device, and the edge is only a relay:

* ``expand`` (in ``configure``): a bundle edge is replaced by its members, read from its
  hello (``profile.members``: device id, samples, tier, runtimes, profile, as the edge's own
  registry resolved them); the method plans direct devices and members together, so its
  plan (tiers, FedDM's slots and personal layers) is the flat one.
* ``pack``: the members' instructions of one edge become ONE instruction for the edge:
  ``model`` = an empty placeholder record (a task must train ``model`` and every result
  returns it), one model ``m<k>`` per member (its spec, weights and programs), ``returns`` =
  all of them, ``context = {"edge": "updates", "members": {m<k>: {device, recipe, context}}}``
  (the wire carries ``device`` and ``recipe`` as ``task.config.members``,
  ``sdk_device/protocol/task_plan.py``). A member task with more than one model (steps
  before, a teacher, other records or reports of its own) is not carried: that member is
  left out with an error in the log.
* ``finish_members`` (the round loop's ``_finish``): each member's recipe gets the seed and
  privacy stamp a direct device's would; the edge keeps them (``edge/bundle_relay.py``).
* ``check_result`` (``rounds/bundle_results.py``; before pulling, ``rounds/results.py``): a
  bundle result may lack the records of members that did not answer; each record it has
  needs ``metrics.members[m<k>]`` with ``samples`` > 0, and those add up to ``metrics.samples``.
* ``unpack`` (before the norm bound and ``aggregate_train``): a bundle update becomes one
  ``ClientUpdate`` per member that answered, with the member's instruction and metrics; the
  method's own aggregate then runs over direct and member updates: exact by construction.

Which edges are bundle edges: a hello profile with ``role: "edge"`` and a ``members`` list,
whose ``aggregates`` is ``"updates"``, or is ``"sums"`` while the server's method is not a
sum (a generic edge answers both kinds of task). Decisions: members that are edges
themselves are left out (no bundles of bundles: an edge's members must be devices; the
reason is logged); a member id announced twice (another edge, a direct device) is left out
behind the later edge.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from fedcore import modelspec
from fedcore.recipe import Recipe
from sdk_device.protocol.topics import check_name

from ..methods.base import MODEL, ClientUpdate, DeviceInfo, Method, ModelRecord, TrainInstruction
from ..methods.summands import refusal
from ..rounds.bundle_results import UPDATES, is_bundle

log = logging.getLogger(__name__)



def is_bundle_edge(method: Method, device: DeviceInfo, forward: bool = False) -> bool:
    """Whether the server plans ``device``'s members itself (see the module docstring);
    ``forward``: every edge that lists members (a layer needs each device's own update: DP,
    robust rules)."""
    p = device.profile
    if p.get("role") != "edge" or not isinstance(p.get("members"), list):
        return False
    return p.get("aggregates") == UPDATES or (p.get("aggregates") == "sums"
                                               and (forward or refusal(method) is not None))


def members_of(edge: DeviceInfo) -> list[DeviceInfo]:
    """The members an edge announced (ValueError, one line, on a malformed entry)."""
    out = []
    for entry in edge.profile["members"]:
        if not isinstance(entry, dict):
            raise ValueError("profile.members must list objects")
        try:
            device_id = check_name("member id", entry.get("device_id"))
        except ValueError as exc:
            raise ValueError(str(exc)) from None
        samples, tier = entry.get("num_samples"), entry.get("tier")
        runtimes, profile = entry.get("runtimes", ["torch"]), entry.get("profile", {})
        if type(samples) is not int or samples <= 0 or not (tier is None or isinstance(tier, str)) \
                or not isinstance(runtimes, list) or not isinstance(profile, dict):
            raise ValueError(f"member {device_id}: num_samples > 0, tier, runtimes and profile expected")
        out.append(DeviceInfo(device_id, samples, tier, tuple(str(r) for r in runtimes), profile))
    return out


def expand(method: Method, rnd: int, devices: list[DeviceInfo],
           forward: bool = False) -> tuple[list[DeviceInfo], dict[str, str]]:
    """``devices`` with every bundle edge replaced by its members (sorted by id, as the grid
    lists devices); and {member id: its edge id}."""
    if method.folds_edges or not any(is_bundle_edge(method, d, forward) for d in devices):
        return devices, {}
    plain = [d for d in devices if not is_bundle_edge(method, d, forward)]
    if not method.bundles:  # its tasks have several models: a bundle cannot carry them
        for edge in (d for d in devices if is_bundle_edge(method, d, forward)):
            log.error("round %d: edge %s left out: edges do not support %s: %s", rnd, edge.device_id,
                      method.name, method.not_a_sum)
        return plain, {}
    taken = {d.device_id for d in plain}
    owners: dict[str, str] = {}
    for edge in (d for d in devices if is_bundle_edge(method, d, forward)):
        try:
            members = members_of(edge)
        except ValueError as exc:
            log.error("round %d: edge %s left out: %s", rnd, edge.device_id, exc)
            continue
        for member in members:
            if member.profile.get("role") == "edge":
                log.error("round %d: member %s of edge %s left out: it is an edge, and bundles of "
                          "bundles are not supported (connect it to the server)", rnd, member.device_id,
                          edge.device_id)
            elif member.device_id in taken:
                log.error("round %d: member %s of edge %s left out: that id is already in the round", rnd,
                          member.device_id, edge.device_id)
            else:
                taken.add(member.device_id)
                owners[member.device_id] = edge.device_id
                plain.append(member)
    return sorted(plain, key=lambda d: d.device_id), owners


def pack(method: Method, rnd: int, instructions: list[TrainInstruction],
         owners: dict[str, str]) -> list[TrainInstruction]:
    """The direct instructions as they are; one bundle instruction per edge for its members'."""
    if not owners:
        return instructions
    out = [i for i in instructions if i.device_id not in owners]
    groups: dict[str, list[TrainInstruction]] = {}
    for instruction in instructions:
        if instruction.device_id in owners:
            why = _not_carried(instruction)
            if why:
                log.error("round %d: member %s of edge %s left out: its task has %s; a bundle carries one "
                          "model per member", rnd, instruction.device_id, owners[instruction.device_id], why)
            else:
                groups.setdefault(owners[instruction.device_id], []).append(instruction)
    return out + [bundle_instruction(method, edge, members) for edge, members in groups.items()]


def _not_carried(instruction: TrainInstruction) -> str:
    parts = [what for what, present in (("other models", instruction.models),
                                        ("steps before", instruction.steps_before),
                                        ("a teacher", instruction.teacher),
                                        ("reports of its own", instruction.reports),
                                        ("other returns", instruction.returns != (MODEL,))) if present]
    return ", ".join(parts)


def bundle_instruction(method: Method, edge_id: str, members: list[TrainInstruction]) -> TrainInstruction:
    """One edge's task: the placeholder ``model`` and ``m<k>`` = the k-th member (by id)."""
    spec = method.global_spec
    members = sorted(members, key=lambda i: i.device_id)
    names = [f"m{k}" for k in range(len(members))]
    context = {"edge": UPDATES, "members": {
        name: {"device": i.device_id, "recipe": i.recipe.to_dict(), "context": i.context}
        for name, i in zip(names, members, strict=True)}}
    models = {name: ModelRecord(i.spec, i.weights, i.programs)
              for name, i in zip(names, members, strict=True)}
    return TrainInstruction(edge_id, spec, {}, method.recipe, context=context, models=models,
                            returns=(MODEL, *names), programs=((modelspec.FORMAT, modelspec.dumps(spec)),))


def finish_members(bundle: TrainInstruction,
                   finish: Callable[[TrainInstruction], TrainInstruction]) -> TrainInstruction:
    """``bundle`` with ``finish`` (the round loop's per-task seed and privacy stamp, e.g. local
    DP's clip and noise) applied to each member's recipe as to a direct device's; other
    instructions unchanged."""
    if not is_bundle(bundle):
        return bundle
    members = {}
    for name, member in bundle.context["members"].items():
        record = bundle.models[name]
        done = finish(TrainInstruction(member["device"], record.spec, record.weights,
                                       Recipe.from_dict(member["recipe"]), context=member["context"]))
        members[name] = {**member, "recipe": done.recipe.to_dict()}
    return dataclasses.replace(bundle, context={**bundle.context, "members": members})


def unpack(updates: list[ClientUpdate]) -> list[ClientUpdate]:
    """Every bundle update as its members' updates (sorted by device id, as the round loop
    orders updates); other updates unchanged. Idempotent."""
    if not any(is_bundle(u.instruction) for u in updates):
        return updates
    out = [u for u in updates if not is_bundle(u.instruction)]
    for update in (u for u in updates if is_bundle(u.instruction)):
        bundle = update.instruction
        for name, member in bundle.context["members"].items():
            if name not in update.others:
                continue  # the member did not answer its edge
            record = bundle.models[name]
            metrics = dict(update.metrics["members"][name])
            instruction = TrainInstruction(member["device"], record.spec, record.weights,
                                           Recipe.from_dict(member["recipe"]), context=member["context"],
                                           reports=bundle.reports, programs=record.programs)
            out.append(ClientUpdate(member["device"], metrics["samples"], update.others[name], metrics,
                                    instruction))
    return sorted(out, key=lambda u: u.device_id)
