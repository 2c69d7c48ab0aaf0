"""Secure aggregation with local DP and with label-histogram noise, in process: each device
noises its own delta (the real task-runner maths, ``noised_delta``) and masks it with weight 1
(the real device code, ``noised_for_sum`` and ``SecAggClient``; the real server state machine,
``secagg/inprocess.py``); the server's result equals local DP's unweighted mean of the same
noised updates, and epsilon is local DP's. Noised label histograms are counted under secure
aggregation as without it, and a secure edge passes the noise parameters to its group."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fedcore.recipe import Recipe
from fedcore.secagg.layout import CLASSES, Layout, Placement
from sdk_device.privacy import noised_delta
from sdk_device.secagg_sessions import SecAggSessions, noised_for_sum
from server_toolkit.assembly import aggregation_stack
from server_toolkit.edge.sum_relay import SumRelay
from server_toolkit.methods import method_class
from server_toolkit.methods.base import ClientUpdate, DeviceInfo
from server_toolkit.models.zoo import model_spec
from server_toolkit.privacy.accountant import epsilon
from server_toolkit.privacy.round_privacy import RoundPrivacy
from server_toolkit.privacy.settings import PrivacySettings
from server_toolkit.rounds.aggregator import RoundInput
from server_toolkit.rounds.grid import Exchange
from server_toolkit.secagg.aggregate import UnmaskedSum, layout_for
from server_toolkit.secagg.inprocess import run_secure_round

SPEC = model_spec("mlp", (1, 4, 4), 3)
CLIP, Z = 0.5, 0.8
LOCAL = PrivacySettings(clip=CLIP, noise_multiplier=Z, mode="local", delta=1e-5)
TOLERANCE = 1e-5  # fixed point: 0.5 / 2**20 per value, 6 devices
METHODS = [("fedavg", {}, (None,) * 6),
           ("heterofl", {"tier_ratios": {"a": 1.0, "b": 0.5}}, ("a", "b", "b", "a", "b", "a"))]


def _method(name: str, options: dict):
    return method_class(name)(SPEC, Recipe(), **options)


def _instructions(stack, before, tiers):
    """The stack's stamped tasks, the method's outputs asked as the round loop asks them."""
    devices = [DeviceInfo(f"d{i}", 10 + 7 * i, tier=t) for i, t in enumerate(tiers)]
    asks = stack.method.asks
    return [stack.finish(dataclasses.replace(i, reports={**asks, **i.reports}), lambda x: x)
            for i in stack.configure(1, before, devices)]


def _noised(instruction, i: int) -> dict[str, np.ndarray]:
    """Device i trains (a random step) and noises its delta as the task runner does."""
    rng = np.random.default_rng(i)
    trained = {k: v + rng.normal(0, 0.2, v.shape).astype(v.dtype) for k, v in instruction.weights.items()}
    r = instruction.recipe
    return noised_delta(instruction.weights, trained, r.dp_clip, r.dp_noise, np.random.default_rng(100 + i))


@pytest.mark.parametrize(("name", "options", "tiers"), METHODS, ids=[m[0] for m in METHODS])
def test_local_dp_under_secagg_averages_the_noised_deltas_unweighted_as_local_dp_does(name, options, tiers):
    method = _method(name, options)
    before = method.initial_weights(0)
    stack = aggregation_stack(method, privacy=LOCAL, secure=True)
    instructions = _instructions(stack, before, tiers)
    assert all(i.recipe.dp_clip == CLIP and i.recipe.dp_noise == pytest.approx(Z * CLIP)
               and i.recipe.dp_secure_clip == 0 for i in instructions)
    layouts = {i.device_id: layout_for(method, before, i) for i in instructions}
    masked, plain = {}, []
    for n, ins in enumerate(instructions):
        noised = _noised(ins, n)
        masked[ins.device_id] = (noised_for_sum(layouts[ins.device_id], ins.weights, noised), 1, None)
        plain.append(ClientUpdate(ins.device_id, 10 + 7 * n, noised, {}, ins))
    first = instructions[0]
    unmasked = UnmaskedSum(run_secure_round(1, layouts, masked).total, layouts[first.device_id], first,
                           before)
    assert unmasked.of_deltas
    row: dict = {}
    metrics_only = [dataclasses.replace(u, weights={}) for u in plain]
    info = RoundInput(0.5, row, Exchange(metrics_only, secure=unmasked))
    got = stack.aggregate(1, before, metrics_only, info)
    want_row: dict = {}
    want = RoundPrivacy(LOCAL, method).aggregate(1, before, plain, 0.5, want_row)
    moved = max(np.abs(want[k].astype(np.float64) - before[k]).max() for k in want)
    assert moved > 0.05  # the noise and the steps moved the model
    assert max(np.abs(got[k].astype(np.float64) - want[k]).max() for k in want) <= TOLERANCE
    assert row["dp_epsilon"] == want_row["dp_epsilon"] == epsilon("local", Z, [0.5], 1e-5)
    summary = stack.summary()["privacy"]
    assert "clip and noise under secure aggregation" in summary["dp_assumption"]


def test_a_per_class_layout_cannot_weigh_a_device_one_and_is_refused_before_training():
    layout = Layout(6, {"w": Placement(0, (3, 2), (), CLASSES)}, per_element=True)
    with pytest.raises(ValueError, match="weighs a tensor per class"):
        noised_for_sum(layout, {"w": np.zeros((3, 2), np.float32)}, {"w": np.ones((3, 2), np.float32)})
    sessions = SecAggSessions("d0", endpoint=None)
    sessions.setups[4] = {"layout": layout.to_json()}
    assert "weighs a tensor per class" in sessions.refusal(4, Recipe(dp_clip=1.0, dp_noise=0.5))
    assert "weighs a tensor per class" in sessions.refusal(4, Recipe(dp_secure_clip=1.0))
    assert sessions.refusal(4, Recipe()) is None


def test_label_noise_under_secagg_counts_the_noised_histograms_and_keeps_the_secure_mean():
    method = _method("heterofl", {"tier_ratios": {"a": 1.0, "b": 0.5}})
    before = method.initial_weights(0)
    stack = aggregation_stack(method, privacy=PrivacySettings(label_epsilon=2.0), secure=True)
    assert stack.layers()[:2] == ["PrivateAggregate", "SecureSum"]
    instructions = _instructions(stack, before, ("a", "b", "a", "b"))
    assert all(i.reports["label_counts"] == {"epsilon": 2.0, "classes": 3} for i in instructions)
    layouts = {i.device_id: layout_for(method, before, i) for i in instructions}
    trained = {i.device_id: {k: v + 0.01 * (n + 1) for k, v in i.weights.items()}
               for n, i in enumerate(instructions)}
    masked = {d: (t, 10, None) for d, t in trained.items()}
    first = instructions[0]
    unmasked = UnmaskedSum(run_secure_round(1, layouts, masked).total, layouts[first.device_id], first,
                           before)
    updates = [ClientUpdate(i.device_id, 10, {}, {"label_counts": [3, 4, 3]}, i) for i in instructions]
    rows = []
    for rnd in (1, 2):
        row: dict = {}
        got = stack.aggregate(rnd, before, updates, RoundInput(1.0, row, Exchange(updates, secure=unmasked)))
        rows.append(row)
    assert [r["label_epsilon"] for r in rows] == [2.0, 4.0]
    want = unmasked(method, 2, before)  # the secure mean, as without label noise
    assert all(np.array_equal(got[k], want[k]) for k in want)
    assert stack.summary()["privacy"]["label_epsilon"] == 4.0


def test_a_secure_edge_passes_the_label_noise_parameters_to_its_group_tasks():
    relay = SumRelay("heterofl", {"tier_ratios": {"a": 1.0, "b": 0.5}})
    noised = {"label_counts": {"epsilon": 1.5, "classes": 3}}
    relay.forward(SPEC, Recipe(), 1, noised)
    assert relay.asks == noised
    relay.forward(SPEC, Recipe(), 2, {})  # a task without the noise asks for plain counts again
    assert relay.asks == {"label_counts": {}}
