"""Secure aggregation with central DP, in process: each device clips its own delta and masks it
with weight 1 (the real device code: ``secagg_sessions.clipped_for_sum`` and ``SecAggClient``,
the real server state machine: ``secagg/inprocess.py``), the server noises the unmasked sum
once. The result equals central DP's for the same clipped updates and the same noise draw,
flat and behind secure edges; the reported epsilon is the accountant's for the same noise,
sampling and releases, in rounds, behind edges and in async mode."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fedcore.recipe import Recipe
from fedcore.secagg.fixed_point import encode, rounding_norm
from sdk_device.privacy import delta_l2
from sdk_device.secagg_sessions import clipped_for_sum
from server_toolkit.assembly import aggregation_stack
from server_toolkit.edge.fold import edge_instruction
from server_toolkit.edge.layer import EdgeFold
from server_toolkit.edge.partial import COVERAGE
from server_toolkit.edge.secure_group import SecureGroupSum
from server_toolkit.edge.sum_relay import SumRelay
from server_toolkit.methods import method_class
from server_toolkit.methods.base import ClientUpdate, DeviceInfo, TrainInstruction
from server_toolkit.models.zoo import model_spec
from server_toolkit.privacy.accountant import epsilon
from server_toolkit.privacy.layer import PrivateAggregate
from server_toolkit.privacy.round_privacy import RoundPrivacy
from server_toolkit.privacy.settings import PrivacySettings
from server_toolkit.rounds.aggregator import MethodAggregate, RoundInput
from server_toolkit.rounds.async_loop import AsyncConfig, AsyncLoop
from server_toolkit.rounds.grid import Exchange, Grid
from server_toolkit.rounds.loop import LoopConfig, RoundLoop
from server_toolkit.secagg.aggregate import UnmaskedSum, layout_for
from server_toolkit.secagg.inprocess import run_secure_round
from server_toolkit.secagg.mqtt_grid import SECURE_EDGE

from .test_async_loop import ScriptedGrid

SPEC = model_spec("mlp", (1, 4, 4), 3)
CLIP, Z = 0.5, 1.3
PRIVACY = PrivacySettings(clip=CLIP, noise_multiplier=Z, delta=1e-5)
TOLERANCE = 1e-5  # fixed point (0.5 / 2**20 per value) and the device's slack under C
METHODS = [("fedavg", {}, (None,) * 6),
           ("heterofl", {"tier_ratios": {"a": 1.0, "b": 0.5}}, ("a", "b", "b", "a", "b", "a"))]


def _method(name: str, options: dict):
    return method_class(name)(SPEC, Recipe(), **options)


def _trained(instruction: TrainInstruction, i: int) -> dict[str, np.ndarray]:
    """Device i's weights: half of the devices move far past the clip, half stay within it."""
    rng = np.random.default_rng(i)
    step = 0.2 if i % 2 else 0.001
    return {k: v + rng.normal(0, step, v.shape).astype(v.dtype) for k, v in instruction.weights.items()}


def _secure_round(method, before, instructions) -> tuple[UnmaskedSum, list[ClientUpdate]]:
    """The devices' clipped deltas masked and unmasked; the same deltas as plain updates."""
    layouts = {i.device_id: layout_for(method, before, i) for i in instructions}
    masked, plain = {}, []
    for n, ins in enumerate(instructions):
        clip = ins.recipe.dp_secure_clip
        delta = clipped_for_sum(layouts[ins.device_id], ins.weights, _trained(ins, n), clip)
        assert delta_l2({k: 0 * v for k, v in delta.items()}, delta) <= CLIP
        masked[ins.device_id] = (delta, 1, None)
        clipped = {k: np.asarray(ins.weights[k], np.float64) + d for k, d in delta.items()}
        plain.append(ClientUpdate(ins.device_id, 10 + n, clipped, {}, ins))
    total = run_secure_round(1, layouts, masked).total
    first = instructions[0]
    return UnmaskedSum(total, layouts[first.device_id], first, before), plain


def _seeded(stack, seed: int):
    layer = stack
    while not isinstance(layer, PrivateAggregate):
        layer = layer.inner
    layer.privacy._rng = np.random.default_rng(seed)
    return layer.privacy


def _central(method, before, plain, rate: float, seed: int) -> tuple[dict, dict]:
    """Central DP over the same clipped updates, the same noise draw."""
    privacy = RoundPrivacy(PRIVACY, method)
    privacy._rng = np.random.default_rng(seed)
    row: dict = {}
    return privacy.aggregate(1, before, plain, rate, row), row


def _assert_close(got, want, before):
    moved = max(np.abs(want[k].astype(np.float64) - before[k]).max() for k in want)
    assert moved > 0.01
    assert max(np.abs(got[k].astype(np.float64) - want[k]).max() for k in want) <= TOLERANCE


def test_a_device_clips_its_delta_so_that_its_fixed_point_encoding_stays_within_the_clip():
    method = _method("fedavg", {})
    before = method.initial_weights(0)
    (ins,) = method.configure_train(1, before, [DeviceInfo("d0", 10)])
    delta = clipped_for_sum(layout_for(method, before, ins), ins.weights, _trained(ins, 1), CLIP)
    encoded = np.concatenate([encode(v.ravel()).view(np.int64) for v in delta.values()]) / 2.0**20
    assert np.linalg.norm(encoded) <= CLIP < np.linalg.norm(encoded) + 2 * rounding_norm(encoded.size)
    with pytest.raises(ValueError, match="below the fixed-point rounding"):
        clipped_for_sum(layout_for(method, before, ins), ins.weights, _trained(ins, 1), 1e-6)


@pytest.mark.parametrize(("name", "options", "tiers"), METHODS, ids=[m[0] for m in METHODS])
def test_secure_dp_noises_the_unmasked_sum_as_central_dp_noises_the_same_clipped_updates(name, options,
                                                                                         tiers):
    method = _method(name, options)
    before = method.initial_weights(0)
    stack = aggregation_stack(method, privacy=PRIVACY, secure=True)
    devices = [DeviceInfo(f"d{i}", 10, tier=t) for i, t in enumerate(tiers)]
    instructions = [stack.finish(i, lambda x: x) for i in stack.configure(1, before, devices)]
    assert all(i.recipe.dp_secure_clip == CLIP and i.recipe.to_dict()["dp_secure_clip"] == CLIP
               for i in instructions)
    unmasked, plain = _secure_round(method, before, instructions)
    assert unmasked.of_deltas
    _seeded(stack, 11)
    row: dict = {}
    metrics_only = [dataclasses.replace(u, weights={}) for u in plain]
    info = RoundInput(0.5, row, Exchange(metrics_only, secure=unmasked))
    got = stack.aggregate(1, before, metrics_only, info)
    want, want_row = _central(method, before, plain, 0.5, seed=11)
    _assert_close(got, want, before)
    assert row["dp_epsilon"] == want_row["dp_epsilon"] == epsilon("central", Z, [0.5], 1e-5)
    assert row["dp_clip"] == CLIP and "dp_clipped" not in row  # nobody's norm is seen


def _edge_answer(edge_id: str, name: str, options: dict, before, devices, instructions_of) -> tuple:
    """A secure edge's answer (its group's clipped deltas summed securely, sent up as a partial)
    and its members' plain clipped updates."""
    relay = SumRelay(name, options)
    server = aggregation_stack(_method(name, options), privacy=PRIVACY, secure=True)
    edge = server.finish(edge_instruction(_method(name, options), before, edge_id), lambda x: x)
    relay.forward(SPEC, edge.recipe, 1)
    instructions = relay.configure_train(1, before, devices)
    instructions_of += instructions
    unmasked, plain = _secure_round(relay.inner, before, instructions)
    group = SecureGroupSum(EdgeFold(MethodAggregate(relay)))
    metrics_only = [dataclasses.replace(u, weights={}) for u in plain]
    info = RoundInput(exchange=Exchange(metrics_only, secure=unmasked))
    mean = group.aggregate(1, before, metrics_only, info)
    answer = ClientUpdate(edge_id, len(plain), mean, {"edge_devices": len(plain)}, edge,
                          others={COVERAGE: relay.partial.coverage(before)})
    return answer, plain


@pytest.mark.parametrize(("name", "options", "tiers"), METHODS, ids=[m[0] for m in METHODS])
def test_behind_secure_edges_the_server_noises_the_fold_once_as_central_dp_would(name, options, tiers):
    method = _method(name, options)
    before = method.initial_weights(0)
    devices = [DeviceInfo(f"d{i}", 10, tier=t) for i, t in enumerate(tiers)]
    answers, plain, sent = [], [], []
    for k, edge_id in enumerate(("edge-1", "edge-2")):
        answer, members = _edge_answer(edge_id, name, options, before, devices[k::2], sent)
        answers.append(answer)
        plain += members
    assert all(i.recipe.dp_secure_clip == CLIP for i in sent)  # the edges passed the clip on
    stack = aggregation_stack(method, privacy=PRIVACY, secure=True)
    _seeded(stack, 5)
    row: dict = {}
    got = stack.aggregate(1, before, answers, RoundInput(1.0, row, Exchange(answers)))
    want, want_row = _central(method, before, plain, 1.0, seed=5)
    _assert_close(got, want, before)
    assert row["dp_epsilon"] == want_row["dp_epsilon"] == epsilon("central", Z, [1.0], 1e-5)


SECURE = {"role": "edge", "aggregates": "sums", "method": "fedavg", SECURE_EDGE: True}


def _partial(update: ClientUpdate) -> ClientUpdate:
    """A secure edge's answer to ``update``'s task: three devices' clipped deltas of norm C,
    summed with weight 1 and sent up as a partial (``model`` = sent + mean delta, ``coverage`` 3)."""
    sent = update.instruction.weights
    size = sum(v.size for v in sent.values())
    mean = {k: v + (np.float32(CLIP / np.sqrt(size)) if v.dtype.kind == "f" else 0) for k, v in sent.items()}
    three = {k: np.full(v.shape, 3.0, np.float32) for k, v in mean.items()}
    return dataclasses.replace(update, num_samples=30, weights=mean, metrics={"edge_devices": 3},
                               others={COVERAGE: three})


class SecureEdgeRounds(Grid):
    """Two secure edges; each asked edge answers its round at once."""

    def online(self) -> list[DeviceInfo]:
        return [DeviceInfo(e, 30, profile=SECURE) for e in ("edge-1", "edge-2")]

    def exchange(self, round_number: int, instructions: list[TrainInstruction], deadline: float,
                 quorum: int) -> Exchange:
        assert all(i.recipe.dp_secure_clip == CLIP and COVERAGE in i.returns for i in instructions)
        return Exchange([_partial(ClientUpdate(i.device_id, 30, {}, {}, i)) for i in instructions])


def test_behind_secure_edges_sync_rounds_report_the_accountants_epsilon_for_their_sampling_rate():
    m = method_class("fedavg")(SPEC, Recipe())
    config = LoopConfig(rounds=2, clients_per_round=1, seed=0, norm_bound=None)
    loop = RoundLoop(m, SecureEdgeRounds(), config,
                     aggregator=aggregation_stack(m, None, PRIVACY, secure=True))
    loop.start()
    rows = loop.run()
    want = [epsilon("central", Z, [0.5] * i, 1e-5) for i in (1, 2)]  # one edge of two per round
    assert [r["dp_epsilon"] for r in rows] == pytest.approx(want, rel=1e-12)


class SecureEdgeGrid(ScriptedGrid):
    """Two secure edges of three devices (answering with a partial of clipped deltas of 1.0
    everywhere, weighted 1) and one direct device, which must get no task."""

    def online(self) -> list[DeviceInfo]:
        return [DeviceInfo("direct", 10)] + [DeviceInfo(e, 30, profile=SECURE) for e in ("edge-1", "edge-2")]

    def submit(self, version: int, instructions: list[TrainInstruction], timeout_s: float) -> None:
        assert all(i.recipe.dp_secure_clip == CLIP and COVERAGE in i.returns for i in instructions)
        super().submit(version, instructions, timeout_s)

    def arrivals(self, timeout_s: float):
        return [dataclasses.replace(a, update=_partial(a.update)) for a in super().arrivals(timeout_s)]


def test_async_behind_secure_edges_charges_one_release_per_version_at_q_1_and_skips_direct_devices():
    m = method_class("fedavg")(SPEC, Recipe())
    settings = AsyncConfig(buffer=3, max_staleness=4)
    grid = SecureEdgeGrid({"direct": 1, "edge-1": 1, "edge-2": 2})
    stack = aggregation_stack(m, None, PRIVACY, secure=True, async_settings=settings)
    assert stack.layers()[:3] == ["SecureSum", "StalenessFold", "PrivateAggregate"]
    loop = AsyncLoop(m, grid, LoopConfig(rounds=4, norm_bound=None), settings, aggregator=stack)
    loop.start()
    rows = loop.run()
    assert len(rows) == 4 and all(r["folded"] >= 3 for r in rows)  # partials, three devices each
    assert "direct" not in {a.update.device_id for a in grid.accepted}  # it would send in the clear
    for i, row in enumerate(rows, start=1):
        assert row["dp_epsilon"] == pytest.approx(epsilon("central", Z, [1.0] * i, 1e-5), rel=1e-12)
    summary = loop.aggregator.summary()["privacy"]
    assert summary["dp_rounds"] == 4 and "secure aggregation" in summary["dp_assumption"]


def test_adaptive_clipping_is_refused_under_secure_aggregation_with_its_reason():
    adaptive = PrivacySettings(clip=1.0, adaptive_quantile=0.5, noise_multiplier=1.0)
    with pytest.raises(ValueError, match="needs each device's norm in the clear"):
        aggregation_stack(method_class("fedavg")(SPEC, Recipe()), privacy=adaptive, secure=True)
