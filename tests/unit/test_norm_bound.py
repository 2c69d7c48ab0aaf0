"""The norm bound: one device's outsized update cannot drag the global model away (real torch
training on digits), and the clipping itself (integer tensors and unsent records untouched)."""

from __future__ import annotations

import dataclasses
import math
import statistics

import numpy as np

from fedcore.recipe import Recipe
from server_toolkit.data.datasets import load_dataset
from server_toolkit.methods import method_class
from server_toolkit.methods.base import ClientUpdate, DeviceInfo, TrainInstruction
from server_toolkit.models.zoo import model_spec
from server_toolkit.rounds.inprocess_grid import InProcessGrid
from server_toolkit.rounds.local_device import LocalDevice
from server_toolkit.rounds.loop import LoopConfig, RoundLoop
from server_toolkit.rounds.norm_bound import bound_updates, delta_norm, delta_rms

BOOST = 1e9


class BoostingGrid(InProcessGrid):
    """Device "evil" returns its honest delta times BOOST (a forged ×10⁹ update)."""

    def exchange(self, round_number, instructions, deadline, quorum):
        exchange = super().exchange(round_number, instructions, deadline, quorum)
        self.honest_norms = [delta_norm(u.instruction.weights, u.weights) for u in exchange.updates
                             if u.device_id != "evil"]
        for i, u in enumerate(exchange.updates):
            if u.device_id == "evil":
                sent = u.instruction.weights
                boosted = {k: (sent[k] + BOOST * (v - sent[k])).astype(v.dtype) if v.dtype.kind == "f" else v
                           for k, v in u.weights.items()}
                exchange.updates[i] = dataclasses.replace(u, weights=boosted)
        return exchange


def _run(norm_bound: float | None) -> tuple[RoundLoop, list[dict], dict, dict, list[float]]:
    data = load_dataset("digits", seed=0)
    devices = [LocalDevice(DeviceInfo(name, 60, None), data.x_train[i * 60:(i + 1) * 60],
                           data.y_train[i * 60:(i + 1) * 60])
               for i, name in enumerate(["evil", "good0", "good1", "good2"])]
    spec = model_spec("small_cnn", data.input_shape, data.num_classes)
    recipe = Recipe(epochs=5, batch_size=16, optimizer="sgd", lr=0.05, momentum=0.9)
    method = method_class("fedavg")(spec, recipe)
    grid = BoostingGrid(devices)
    loop = RoundLoop(method, grid, LoopConfig(rounds=2, seed=0, norm_bound=norm_bound),
                     test_data=(data.x_test, data.y_test))
    loop.start()
    before = dict(loop.global_weights)
    first = loop.run_round(1)
    after_first = dict(loop.global_weights)
    honest_norms = grid.honest_norms
    second = loop.run_round(2)
    return loop, [first, second], before, after_first, honest_norms


def test_a_billionfold_update_moves_the_global_model_no_further_than_the_bound():
    factor = 10.0
    loop, rows, before, after_first, honest = _run(factor)
    moved = delta_norm(before, after_first)
    bound = factor * statistics.median_low([*honest, math.inf])  # the round's 4 updates
    assert rows[0]["clipped"] == 1
    assert moved <= bound * (1 + 1e-6), (moved, bound)
    # the next round's honest devices train from a sane model: nothing diverges
    assert (rows[1]["accepted"], rows[1]["rejected"]) == (4, 0)
    assert all(np.isfinite(w).all() for w in loop.global_weights.values())
    print(f"bounded: global moved {moved:.3g} (bound {bound:.3g}; honest deltas {honest}); "
          f"round 2 accepted {rows[1]['accepted']}, accuracy {rows[1]['accuracy']:.3f}")


def test_without_the_bound_the_same_update_makes_the_next_round_diverge():
    loop, rows, before, after_first, honest = _run(None)
    moved = delta_norm(before, after_first)
    assert moved > 1e6 * max(honest)
    assert rows[1]["rejected"] >= 3, rows[1]  # every honest device's training turns non-finite
    print(f"unbounded: global moved {moved:.3g} (honest deltas {honest}); round 2 accepted "
          f"{rows[1]['accepted']}, rejected {rows[1]['rejected']}")


def _update(device: str, sent: dict, returned: dict, others: dict | None = None) -> ClientUpdate:
    instruction = TrainInstruction(device_id=device, spec={}, weights=sent, recipe=Recipe())
    return ClientUpdate(device, 10, returned, {}, instruction, others or {})


def test_clipping_scales_float_deltas_and_leaves_integer_tensors_and_unsent_records_alone():
    sent = {"w": np.zeros(4, np.float32), "steps": np.array(3, np.int64)}
    small = [_update(f"d{i}", sent, {"w": np.full(4, 0.5 * (i + 1), np.float32), "steps": np.array(5)})
             for i in range(3)]
    huge = _update("huge", sent, {"w": np.full(4, 1e6, np.float32), "steps": np.array(99)},
                   others={"features": {"f": np.full(2, 7.0, np.float32)}})
    out, clipped = bound_updates(1, [*small, huge], factor=10.0)
    assert clipped == 1
    median = delta_norm(sent, small[1].weights)  # lower median of 1, 2, 3, 2e6 (x 0.5 x 2) is 2
    assert abs(delta_norm(sent, out[3].weights) - 10 * median) < 1e-3
    assert out[3].weights["steps"] == 99  # an integer tensor is not a delta
    assert np.array_equal(out[3].others["features"]["f"], np.full(2, 7.0))  # never sent: not clipped
    assert all(out[i] is small[i] for i in range(3))


def test_a_larger_model_taking_the_same_step_per_weight_is_not_clipped():
    """Devices of one round may train models of different sizes (width tiers, personalised
    architectures): the bound compares steps per weight, not whole-model norms."""
    small_sent, large_sent = {"w": np.zeros(10, np.float32)}, {"w": np.zeros(10_000, np.float32)}
    updates = [_update(f"s{i}", small_sent, {"w": np.full(10, 0.01, np.float32)}) for i in range(3)]
    updates.append(_update("large", large_sent, {"w": np.full(10_000, 0.01, np.float32)}))  # norm 31x
    out, clipped = bound_updates(1, updates, factor=10.0)
    assert clipped == 0 and out[3] is updates[3]
    updates[3] = _update("large", large_sent, {"w": np.full(10_000, 0.5, np.float32)})  # 50x per weight
    out, clipped = bound_updates(1, updates, factor=10.0)
    assert clipped == 1 and abs(delta_rms(large_sent, out[3].weights) - 0.1) < 1e-6


def test_a_narrow_model_is_measured_against_the_narrow_models_of_the_round_not_the_wide_ones():
    """HeteroFL with also_narrowest: a width-0.125 device's own "model" and the wide devices'
    "narrow" copies have one shape; they are each other's peers, whatever their record."""
    from server_toolkit.methods.base import ModelRecord

    wide_sent, narrow_sent = {"w": np.zeros(1000, np.float32)}, {"w": np.zeros(10, np.float32)}
    updates = []
    for i in range(3):  # wide devices: tiny steps per weight, and a narrow copy moving like a narrow model
        instruction = TrainInstruction(device_id=f"w{i}", spec={}, weights=wide_sent, recipe=Recipe(),
                                       models={"narrow": ModelRecord({}, narrow_sent)})
        updates.append(ClientUpdate(f"w{i}", 10, {"w": np.full(1000, 0.001, np.float32)}, {}, instruction,
                                    {"narrow": {"w": np.full(10, 0.04, np.float32)}}))
    updates.append(_update("tiny", narrow_sent, {"w": np.full(10, 0.05, np.float32)}))
    out, clipped = bound_updates(1, updates, factor=10.0)
    assert clipped == 0 and out[3] is updates[3]  # 0.05 against its peers' 0.04, not the wide 0.001
    updates[3] = _update("tiny", narrow_sent, {"w": np.full(10, 5.0, np.float32)})  # a forged narrow model
    out, clipped = bound_updates(1, updates, factor=10.0)
    assert clipped == 1 and abs(delta_rms(narrow_sent, out[3].weights) - 0.4) < 1e-6
