"""Buffered asynchronous aggregation maths (rounds/staleness.py) on synthetic arrays: the
staleness weight, and a buffer of K updates folding to the stated weighted average of deltas."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedcore.recipe import Recipe
from server_toolkit.methods import method_class, methods
from server_toolkit.methods.abilities import async_refusal
from server_toolkit.methods.base import ClientUpdate, DeviceInfo, TrainInstruction
from server_toolkit.models.zoo import model_spec
from server_toolkit.rounds.staleness import BufferedUpdate, fedbuff_weight, fold_buffer, staleness_stats
from server_toolkit.submodels.width import extract

SPEC = model_spec("small_cnn", (1, 8, 8), 10)


def _update(device: str, sent: dict, returned: dict, samples: int,
            context: dict | None = None) -> ClientUpdate:
    instruction = TrainInstruction(device, SPEC, sent, Recipe(), context or {})
    return ClientUpdate(device, samples, returned, {}, instruction)


def test_fedbuff_weight_is_one_over_root_of_one_plus_staleness():
    assert fedbuff_weight(0) == 1.0
    assert fedbuff_weight(3) == pytest.approx(0.5)
    assert fedbuff_weight(8) == pytest.approx(1 / 3)
    with pytest.raises(ValueError):
        fedbuff_weight(-1)


def test_a_fedavg_buffer_folds_the_sample_and_staleness_weighted_mean_delta():
    rng = np.random.default_rng(0)
    global_now = {"w": rng.normal(size=(3, 4)).astype(np.float32), "b": rng.normal(size=4).astype(np.float32)}
    staleness, samples = [0, 1, 3], [10, 30, 20]
    buffer, expected = [], {k: np.zeros(v.shape) for k, v in global_now.items()}
    for i, (tau, n) in enumerate(zip(staleness, samples, strict=True)):
        base = {k: rng.normal(size=v.shape).astype(np.float32) for k, v in global_now.items()}  # older
        trained = {k: (v + rng.normal(size=v.shape)).astype(np.float32) for k, v in base.items()}
        buffer.append(BufferedUpdate(_update(f"d{i}", base, trained, n), base=5 - tau, staleness=tau))
        for k in expected:
            expected[k] += n / sum(samples) * (trained[k].astype(np.float64) - base[k]) / math.sqrt(1 + tau)
    method = method_class("fedavg")(SPEC, Recipe())
    for server_lr in (1.0, 0.5):
        folded = fold_buffer(method.aggregate_train, 6, global_now, buffer, server_lr=server_lr)
        for k, value in global_now.items():
            want = (value.astype(np.float64) + server_lr * expected[k]).astype(np.float32)
            np.testing.assert_allclose(folded[k], want, rtol=0, atol=1e-6)
            assert folded[k].dtype == np.float32
    assert staleness_stats(buffer) == {"staleness_mean": 4 / 3, "staleness_max": 3}


def test_fresh_updates_fold_to_exactly_the_synchronous_fedavg_round():
    rng = np.random.default_rng(1)
    global_now = {"w": rng.normal(size=(5,))}
    updates = [_update(f"d{i}", global_now, {"w": rng.normal(size=(5,))}, 7 + i) for i in range(4)]
    method = method_class("fedavg")(SPEC, Recipe())
    folded = fold_buffer(method.aggregate_train, 1, global_now, [BufferedUpdate(u, 0, 0) for u in updates])
    np.testing.assert_allclose(folded["w"], method.aggregate_train(1, global_now, updates)["w"], atol=1e-12)


def test_width_buffers_fold_per_element_over_the_updates_covering_it():
    method = method_class("heterofl")(SPEC, Recipe())
    rng = np.random.default_rng(2)
    global_now = {k: rng.normal(size=v.shape) for k, v in method.initial_weights(0).items()}
    full = method.plan_for(1, DeviceInfo("a", 1, "1.0"))
    half = method.plan_for(1, DeviceInfo("b", 1, "0.5"))
    sent_full, sent_half = extract(global_now, full.index_map), extract(global_now, half.index_map)
    delta_full = {k: rng.normal(size=v.shape) for k, v in sent_full.items()}
    delta_half = {k: rng.normal(size=v.shape) for k, v in sent_half.items()}
    buffer = [
        BufferedUpdate(_update("a", sent_full, {k: sent_full[k] + d for k, d in delta_full.items()}, 30,
                               full.context()), base=2, staleness=0),
        BufferedUpdate(_update("b", sent_half, {k: sent_half[k] + d for k, d in delta_half.items()}, 10,
                               half.context()), base=0, staleness=2),
    ]
    folded = fold_buffer(method.aggregate_train, 3, global_now, buffer)
    s = 1 / math.sqrt(3)
    for name in global_now:
        rows = half.index_map[name]
        want = global_now[name] + delta_full[name]  # elements only "a" covers: its delta alone
        block = np.ix_(*rows)
        mixed = (30 * delta_full[name][block] + 10 * s * delta_half[name]) / 40
        want[block] = global_now[name][block] + mixed
        np.testing.assert_allclose(folded[name], want, atol=1e-9, err_msg=name)


def test_methods_say_whether_they_run_asynchronously_and_the_others_refuse_in_one_line():
    able = {name for name, cls in methods().items() if async_refusal(cls) is None}
    assert {"fedavg", "fedprox", "fedavgm", "heterofl", "fedrolex", "depthfl", "fedavg-s-exit"} <= able
    assert not able & {"hypemefed", "feddm", "fedconv", "pfedhn", "mh-pfedhn", "local", "recipfl"}
    assert async_refusal(method_class("fedavg")) is None
    refusal = async_refusal(method_class("pfedhn"))
    assert refusal is not None and "pfedhn" in refusal and "\n" not in refusal and "fedavg" in refusal
