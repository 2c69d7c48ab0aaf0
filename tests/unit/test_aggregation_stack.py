"""The aggregation stack's combinations (``assembly.aggregation_stack``): edges under DP and a
robust rule forward each member and give the flat round; central DP noises the round's sum
once, behind edges and per async version, and the reported epsilon is the accountant's for
the same noise, sampling rates and number of releases.

Synthetic updates (weights plus seeded noise; the scripted async grid's deltas of 1.0)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fedcore.recipe import Recipe
from server_toolkit.assembly import aggregation_stack
from server_toolkit.edge.bundle import UPDATES
from server_toolkit.methods import method_class
from server_toolkit.methods.base import ClientUpdate, DeviceInfo, TrainInstruction
from server_toolkit.privacy.accountant import epsilon
from server_toolkit.privacy.round_privacy import RoundPrivacy
from server_toolkit.privacy.settings import PrivacySettings
from server_toolkit.rounds.aggregator import RoundInput
from server_toolkit.rounds.async_loop import AsyncConfig, AsyncLoop
from server_toolkit.rounds.grid import Exchange, Grid
from server_toolkit.rounds.loop import LoopConfig, RoundLoop

from .test_async_loop import SPEC as MLP
from .test_async_loop import ScriptedGrid
from .test_edge_bundles import SMALL, _devices, _edge, _edge_answer, _trained

CENTRAL = PrivacySettings(clip=0.5, noise_multiplier=0.0)
LOCAL = PrivacySettings(clip=0.5, noise_multiplier=0.0, mode="local")
MEDIAN = PrivacySettings(robust="median")


def _round(stack, devices: list[DeviceInfo], rnd: int, global_weights, rate: float = 1.0, z_row=None):
    """One round through the stack: configure, the devices' (and the edge's) answers, unpack, aggregate."""
    updates = []
    for instruction in stack.configure(rnd, global_weights, devices):
        asked = dataclasses.replace(instruction, reports={**stack.method.asks, **instruction.reports})
        finished = stack.finish(asked, lambda member: member)
        if finished.context.get("edge") == UPDATES:
            updates.append(_edge_answer(finished, rnd))
        else:
            updates.append(_trained(finished, finished.device_id, rnd))
    updates = stack.unpack(sorted(updates, key=lambda u: u.device_id))
    row = {} if z_row is None else z_row
    return stack.aggregate(rnd, global_weights, updates, RoundInput(rate, row)), updates


@pytest.mark.parametrize(("method", "tiers"), [("fedavg", (None,) * 4),
                                               ("heterofl", ("1.0", "0.5", "0.25", "1.0"))])
@pytest.mark.parametrize("privacy", [CENTRAL, LOCAL, MEDIAN], ids=["central-dp", "local-dp", "median"])
def test_behind_an_edge_dp_and_a_robust_rule_see_each_member_and_give_the_flat_round(method, tiers, privacy):
    m = method_class(method)(SMALL, Recipe())
    now = m.initial_weights(0)
    devices = _devices(tiers)
    behind, members = _round(aggregation_stack(m, privacy=privacy), [devices[0], _edge(devices[1:])], 1, now)
    flat, direct = _round(aggregation_stack(m, privacy=privacy), devices, 1, now)
    assert [u.device_id for u in members] == [u.device_id for u in direct] == ["dev0", "dev1", "dev2", "dev3"]
    moved = 0
    for name, value in flat.items():
        np.testing.assert_allclose(behind[name], value, rtol=0, atol=1e-6, err_msg=name)
        moved += not np.allclose(value, now[name])
    assert moved > len(flat) // 2


def test_label_noise_behind_an_edge_reaches_every_member_and_is_counted_once_per_round():
    m = method_class("heterofl")(SMALL, Recipe())
    now = m.initial_weights(0)
    devices = _devices(("1.0", "0.5", "0.25", "1.0"))
    stack = aggregation_stack(m, privacy=PrivacySettings(label_epsilon=2.0))
    planned = stack.configure(1, now, [devices[0], _edge(devices[1:])])
    bundle = next(i for i in planned if i.device_id == "edge-1")
    assert bundle.context["edge"] == UPDATES  # forwarded, not summed
    row: dict = {}
    behind, members = _round(stack, [devices[0], _edge(devices[1:])], 1, now, z_row=row)
    assert all(u.instruction.reports["label_counts"]["epsilon"] == 2.0 for u in members)  # the edge re-issues
    flat, _ = _round(aggregation_stack(m), devices, 1, now)
    for name, value in flat.items():
        np.testing.assert_allclose(behind[name], value, rtol=0, atol=1e-6, err_msg=name)
    assert row["label_epsilon"] == 2.0


def test_central_dp_behind_an_edge_noises_the_round_sum_once_with_std_z_c():
    m = method_class("fedavg")(SMALL, Recipe())
    now = m.initial_weights(0)
    devices = _devices((None,) * 4)
    z, clip = 2.0, 0.5
    noised = PrivacySettings(clip=clip, noise_multiplier=z)
    got, _ = _round(aggregation_stack(m, privacy=noised), [devices[0], _edge(devices[1:])], 1, now)
    clean, _ = _round(aggregation_stack(m, privacy=CENTRAL), [devices[0], _edge(devices[1:])], 1, now)
    noise = np.concatenate([(got[k].astype(np.float64) - clean[k]).ravel() * 4 for k in now])  # 4 devices
    assert noise.size > 2000 and abs(noise.std() / (z * clip) - 1) < 0.05  # once: z*C, not 2 z*C


class EdgeGrid(Grid):
    """A direct device and one edge over three members; every asked unit answers at once."""

    def __init__(self) -> None:
        self.devices = _devices((None,) * 4)

    def online(self) -> list[DeviceInfo]:
        return [self.devices[0], _edge(self.devices[1:])]

    def exchange(self, round_number: int, instructions: list[TrainInstruction], deadline: float,
                 quorum: int) -> Exchange:
        return Exchange([_edge_answer(i, round_number) if i.context.get("edge") == UPDATES
                         else _trained(i, i.device_id, round_number) for i in instructions])


def test_dp_behind_edges_reports_the_accountants_epsilon_for_its_noise_sampling_and_rounds():
    m = method_class("fedavg")(SMALL, Recipe())
    privacy = PrivacySettings(clip=0.5, noise_multiplier=1.1, delta=1e-5)
    loop = RoundLoop(m, EdgeGrid(), LoopConfig(rounds=3, clients_per_round=1, seed=0),
                     aggregator=aggregation_stack(m, privacy=privacy))
    loop.start()
    rows = loop.run()
    assert all(r["accepted"] in (1, 3) for r in rows)  # the direct device, or the edge's three members
    want = epsilon("central", 1.1, [0.5] * 3, 1e-5)  # one unit of two online per round: q = 1/2
    assert rows[-1]["dp_epsilon"] == pytest.approx(want, rel=1e-12)
    assert loop.aggregator.summary()["privacy"]["dp_rounds"] == 3


def _async(privacy: PrivacySettings, rounds: int, pace: dict[str, int], buffer: int = 2):
    m = method_class("fedavg")(MLP, Recipe())
    settings = AsyncConfig(buffer, max_staleness=4)
    loop = AsyncLoop(m, ScriptedGrid(pace), LoopConfig(rounds=rounds, norm_bound=None), settings,
                     aggregator=aggregation_stack(m, None, privacy, async_settings=settings))
    loop.start()
    return loop


def test_async_central_dp_clips_each_scaled_delta_noises_each_version_once_and_charges_q_1():
    clean = _async(PrivacySettings(clip=0.5, noise_multiplier=0.0), rounds=1, pace={"a": 1, "b": 1})
    start = clean.global_weights
    clean.run()
    size = sum(v.size for v in start.values())
    for name, value in start.items():  # two fresh deltas of 1.0 everywhere, each clipped to C
        np.testing.assert_allclose(clean.global_weights[name], value + 0.5 / np.sqrt(size), atol=1e-6)
    loop = _async(PrivacySettings(clip=0.5, noise_multiplier=1.1, delta=1e-5), rounds=4,
                  pace={"a": 1, "b": 2, "c": 3})
    rows = loop.run()
    assert len(rows) == 4
    assert rows[-1]["dp_epsilon"] == pytest.approx(epsilon("central", 1.1, [1.0] * 4, 1e-5), rel=1e-12)
    assert loop.aggregator.summary()["privacy"]["dp_assumption"].startswith("async")


def test_async_dp_stops_before_the_version_that_would_pass_the_budget():
    budget = (epsilon("central", 2.0, [1.0] * 2, 1e-5) + epsilon("central", 2.0, [1.0] * 3, 1e-5)) / 2
    loop = _async(PrivacySettings(clip=0.5, noise_multiplier=2.0, epsilon_budget=budget), rounds=6,
                  pace={"a": 1, "b": 1})
    rows = loop.run()
    assert len(rows) == 2 and "privacy budget reached" in loop.stopped


def test_a_device_with_two_updates_in_one_buffer_moves_the_sum_by_at_most_the_clip():
    m = method_class("fedavg")(MLP, Recipe())
    zeros = {k: np.zeros_like(v) for k, v in m.initial_weights(0).items()}
    (task,) = m.configure_train(1, zeros, [DeviceInfo("a", 10)])
    delta = {k: np.ones_like(v) for k, v in zeros.items()}
    twice = [ClientUpdate("a", 10, delta, {}, task), ClientUpdate("a", 10, delta, {}, task)]
    privacy = RoundPrivacy(PrivacySettings(clip=0.5, noise_multiplier=0.0), m)
    step = privacy.aggregate(1, zeros, twice, 1.0, {}, deltas=True)
    norm = np.sqrt(sum(float(np.sum((v * 2) ** 2)) for v in step.values()))  # the sum is 2 x the mean
    assert norm == pytest.approx(0.5, rel=1e-6)


def test_async_median_takes_the_median_of_the_buffers_scaled_deltas():
    loop = _async(MEDIAN, rounds=1, pace={"a": 1, "b": 1, "c": 1}, buffer=3)
    start = loop.global_weights
    loop.run()
    for name, value in start.items():  # three fresh deltas of 1.0: the median is 1.0
        np.testing.assert_allclose(loop.global_weights[name], value + 1.0, atol=1e-6)


def test_a_secure_sum_reaching_a_stack_without_its_layer_fails_loudly_instead_of_averaging_metrics():
    m = method_class("fedavg")(MLP, Recipe())
    now = m.initial_weights(0)
    secure = Exchange([], secure=lambda method, rnd, weights: {k: v + 1 for k, v in weights.items()})
    with pytest.raises(RuntimeError, match="secure-sum layer"):
        aggregation_stack(m).aggregate(1, now, [], RoundInput(exchange=secure))
    got = aggregation_stack(m, secure=True).aggregate(1, now, [], RoundInput(exchange=secure))
    assert all(np.array_equal(got[k], now[k] + 1) for k in now)
