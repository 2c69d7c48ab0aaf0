"""Bundle edges: the server plans and aggregates every member itself, so methods that are not
sums (FedDM's similarity tree, HypeMeFed's hypernetworks) give the flat result behind edges.

Synthetic updates (the instruction's weights plus noise seeded by the device id, random
label counts). The flat run configures and aggregates every device directly; the bundled
run goes through the round loop's ``configure`` / ``unpack`` / ``aggregate`` with a direct
device and one edge whose hello lists three members of different tiers, and the edge's
answer is built as it travels (one record per member, ``metrics.members``).
"""

from __future__ import annotations

import json
import zlib

import numpy as np
import pytest

from fedcore.recipe import Recipe
from sdk_device.protocol import messages as msgs
from sdk_device.protocol.errors import ProtocolError
from sdk_device.protocol.task_plan import parse_plan, plan_config
from server_toolkit.edge.bundle import UPDATES, unpack
from server_toolkit.edge.fold import SUMS, aggregate, configure
from server_toolkit.methods import method_class
from server_toolkit.methods.base import MODEL, ClientUpdate, DeviceInfo, TrainInstruction
from server_toolkit.models.zoo import model_spec, vgg_multi_exit
from server_toolkit.rounds.results import PendingTask, check_records

SMALL = model_spec("small_cnn", (1, 8, 8), 10)
EXITS = vgg_multi_exit((1, 8, 8), 10, channels=(4, 8, 8, 16))
CASES = {  # method -> (model, options, tiers of dev0..dev3)
    "feddm": (SMALL, {"tree": True, "tree_levels": 2, "reference_size": 8}, ("1.0", "0.5", "0.25", "1.0")),
    "hypemefed": (EXITS, {"hypernet": "lrf", "hn_epochs": 2, "hidden": 16, "rank": 4, "hn_gate": False},
                  ("3", "1", "2", "3")),
}


def _devices(tiers) -> list[DeviceInfo]:
    return [DeviceInfo(f"dev{i}", 20 + 7 * i, tier) for i, tier in enumerate(tiers)]


def _edge(members: list[DeviceInfo], aggregates: str = SUMS) -> DeviceInfo:
    listed = [{"device_id": d.device_id, "num_samples": d.num_samples, "tier": d.tier, "runtimes": ["torch"],
               "profile": {}} for d in members]
    profile = {"role": "edge", "aggregates": aggregates, "method": "x", "members": listed}
    return DeviceInfo("edge-1", sum(d.num_samples for d in members), None, profile=profile)


def _trained(instruction: TrainInstruction, device_id: str, rnd: int) -> ClientUpdate:
    rng = np.random.default_rng(zlib.crc32(f"{device_id}:{rnd}".encode()))
    weights = {k: (v + rng.normal(0, 0.1, v.shape)).astype(v.dtype) for k, v in instruction.weights.items()}
    samples = 20 + 7 * int(device_id[3:])
    counts = [int(c) for c in rng.integers(0, 9, 10)]
    return ClientUpdate(device_id, samples, weights, {"samples": samples, "label_counts": counts,
                                                      "loss": 1.0}, instruction)


def _edge_answer(bundle: TrainInstruction, rnd: int, silent: set[str] = frozenset()) -> ClientUpdate:
    """What the edge sends up: each answering member's record and metrics (JSON round trip)."""
    members = bundle.context["members"]
    others, per = {}, {}
    for name, member in members.items():
        if member["device"] in silent:
            continue
        record = bundle.models[name]
        asked = TrainInstruction(member["device"], record.spec, record.weights, Recipe())
        update = _trained(asked, member["device"], rnd)
        others[name] = update.weights
        per[name] = dict(update.metrics)
    metrics = json.loads(json.dumps({"samples": sum(m["samples"] for m in per.values()), "members": per}))
    return ClientUpdate(bundle.device_id, metrics["samples"], {}, metrics, bundle, others)


def _state(method) -> str:
    return json.dumps(method.state_dict(), sort_keys=True)


def _run(name: str, bundled: bool, rounds: int = 2, silent: set[str] = frozenset()):
    spec, options, tiers = CASES[name]
    method = method_class(name)(spec, Recipe(), **options)
    weights = method.initial_weights(0)
    devices = _devices(tiers)
    fleet = [devices[0], _edge(devices[1:])] if bundled else devices
    sent = {}
    for rnd in range(1, rounds + 1):
        instructions = configure(method, rnd, weights, fleet)
        updates = []
        for instruction in instructions:
            if instruction.context.get("edge") == UPDATES:
                updates.append(_edge_answer(instruction, rnd, silent))
                sent.update({m["device"]: instruction.models[n].weights
                             for n, m in instruction.context["members"].items()})
            elif instruction.device_id not in silent:
                updates.append(_trained(instruction, instruction.device_id, rnd))
                sent[instruction.device_id] = instruction.weights
        updates = unpack(sorted(updates, key=lambda u: u.device_id))  # as the round loop does
        weights = aggregate(method, rnd, weights, updates)
    return weights, _state(method), sent


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_bundle_edge_gives_the_flat_global_model_and_method_state(name):
    flat, flat_state, flat_sent = _run(name, bundled=False)
    edged, edged_state, edged_sent = _run(name, bundled=True)
    assert flat_state == edged_state  # FedDM slots and personal layers; HypeMeFed's hypernetwork bank
    assert json.loads(edged_state)["personal" if name == "feddm" else "hypernets"]  # state that can differ
    assert set(flat) == set(edged)
    for key in flat:
        np.testing.assert_array_equal(flat[key], edged[key], err_msg=key)
    for dev, weights in flat_sent.items():  # round 2's members got their personal (FedDM) sub-models
        assert all(np.array_equal(weights[k], edged_sent[dev][k]) for k in weights), dev
    start = method_class(name)(CASES[name][0], Recipe(), **CASES[name][1]).initial_weights(0)
    assert any(not np.array_equal(flat[k], v) for k, v in start.items())  # the rounds moved the model


def test_a_member_that_did_not_answer_is_left_out_as_if_it_were_absent_in_the_flat_round():
    flat, flat_state, _ = _run("feddm", bundled=False, rounds=1, silent={"dev2"})
    edged, edged_state, _ = _run("feddm", bundled=True, rounds=1, silent={"dev2"})
    assert flat_state == edged_state
    assert all(np.array_equal(flat[k], edged[k]) for k in flat)


def test_the_bundle_task_travels_as_members_and_a_device_refuses_it():
    spec, options, tiers = CASES["feddm"]
    method = method_class("feddm")(spec, Recipe(), **options)
    devices = _devices(tiers)
    instructions = configure(method, 1, method.initial_weights(0), [devices[0], _edge(devices[1:])])
    bundle = next(i for i in instructions if i.device_id == "edge-1")
    config = plan_config(bundle.plan())
    assert [m["device"] for m in config["members"].values()] == ["dev1", "dev2", "dev3"]
    assert config["return"] == [MODEL, "m0", "m1", "m2"] and bundle.weights == {}
    plan = parse_plan(json.loads(json.dumps(config)), set(bundle.all_models()), set(), bundles=True)
    assert plan.members == config["members"]
    with pytest.raises(ProtocolError, match="unsupported_task"):
        parse_plan(config, set(bundle.all_models()), set())


def _pending(bundle: TrainInstruction) -> PendingTask:
    refs = {n: {k: (v.shape, str(v.dtype)) for k, v in m.weights.items()}
            for n, m in bundle.all_models().items()}
    return PendingTask("t", 1, bundle, {n: 10**6 for n in refs}, refs, None)


def _result(arrays: list[str], metrics: dict) -> msgs.Result:
    ref = msgs.BlobRef(id="b" * 64, size=10, kind="weights", format="safetensors")
    return msgs.Result(task_id="t", round=1, arrays={n: ref for n in arrays}, metrics=metrics)


def test_a_bundle_result_needs_member_metrics_that_add_up():
    spec, options, tiers = CASES["feddm"]
    method = method_class("feddm")(spec, Recipe(), **options)
    devices = _devices(tiers)
    bundle = next(i for i in configure(method, 1, method.initial_weights(0), [devices[0], _edge(devices[1:])])
                  if i.device_id == "edge-1")
    pending = _pending(bundle)
    check_records(_result([MODEL, "m1"], {"samples": 5, "members": {"m1": {"samples": 5}}}), pending, 2.0)
    with pytest.raises(ProtocolError, match="sum of metrics.members"):
        check_records(_result([MODEL, "m1"], {"samples": 6, "members": {"m1": {"samples": 5}}}), pending, 2.0)
    with pytest.raises(ProtocolError, match="entry for each returned member"):
        check_records(_result([MODEL, "m0", "m1"], {"samples": 5, "members": {"m1": {"samples": 5}}}),
                      pending, 2.0)
    with pytest.raises(ProtocolError, match="no member"):
        check_records(_result([MODEL], {"samples": 5, "members": {}}), pending, 2.0)


def test_a_member_that_is_itself_an_edge_is_left_out():
    spec, options, tiers = CASES["feddm"]
    method = method_class("feddm")(spec, Recipe(), **options)
    devices = _devices(tiers)
    edge = _edge(devices[1:])
    edge.profile["members"][0]["profile"] = {"role": "edge"}
    bundle = next(i for i in configure(method, 1, method.initial_weights(0), [devices[0], edge])
                  if i.device_id == "edge-1")
    assert [m["device"] for m in bundle.context["members"].values()] == ["dev2", "dev3"]


def test_each_member_of_a_bundle_gets_its_own_seed_and_the_local_dp_stamp_of_a_device():
    """(DP needs a sum method: FedAvg, behind an edge that only forwards updates.)"""
    from server_toolkit.assembly import aggregation_stack
    from server_toolkit.privacy.settings import PrivacySettings
    from server_toolkit.rounds.loop import LoopConfig, RoundLoop, task_seed

    method = method_class("fedavg")(SMALL, Recipe())
    devices = _devices((None, None, None))
    privacy = PrivacySettings(clip=1.5, noise_multiplier=0.5, mode="local")
    loop = RoundLoop(method, None, LoopConfig(rounds=1, seed=7),
                     aggregator=aggregation_stack(method, privacy=privacy))
    edge = _edge(devices[1:], aggregates=UPDATES)
    bundle = next(i for i in configure(method, 3, method.initial_weights(0), [devices[0], edge])
                  if i.device_id == "edge-1")
    finished = loop._finish(3, bundle)
    for member in finished.context["members"].values():
        recipe = Recipe.from_dict(member["recipe"])
        assert recipe.seed == task_seed(7, 3, member["device"])  # the flat run's seed for that device
        assert (recipe.dp_clip, recipe.dp_noise) == (1.5, 0.75)
    assert plan_config(finished.plan())["members"]["m0"]["recipe"]["dp_clip"] == 1.5
