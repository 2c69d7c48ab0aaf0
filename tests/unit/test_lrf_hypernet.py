"""HypeMeFed's hypernetworks: SVD factors, learning, chained generation, and that generated
weights really reach the aggregated global model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedcore.recipe import Recipe
from fedcore.torch_model import build_model, state_numpy
from server_toolkit.methods.base import ClientUpdate, DeviceInfo
from server_toolkit.methods.exit.hypemefed import HypeMeFed, parse_rank
from server_toolkit.methods.exit.hypernet_bank import HypernetBank, conv_pairs, relative_error
from server_toolkit.methods.exit.lrf_hypernet import (
    LowRankHypernet,
    NaiveHypernet,
    conv_to_matrix,
    fit,
    generate,
    low_rank_factors,
    matrix_to_conv,
    mse,
)
from server_toolkit.models.zoo import vgg_multi_exit
from server_toolkit.submodels.exit_split import conv_segments, name_map

SPEC = vgg_multi_exit((1, 8, 8), 10, channels=(4, 8, 8, 16))


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_torch_thread):
    """Tiny tensors gain nothing from threads (see tests/conftest.py)."""


# ---- factorisation ---------------------------------------------------------------------------

def test_conv_matrix_layout_and_round_trip():
    w = torch.randn(5, 3, 3, 3)
    m = conv_to_matrix(w)
    assert m.shape == (3 * 3, 5 * 3)
    oc, ic, kh, kw = 4, 2, 1, 0
    assert m[ic * 3 + kh, oc * 3 + kw] == w[oc, ic, kh, kw]
    assert torch.equal(matrix_to_conv(m, tuple(w.shape)), w)


@pytest.mark.parametrize("shape", [(16, 8, 3, 3), (8, 16, 3, 3), (6, 4, 1, 1)])
def test_svd_factors_reconstruct_the_weight_at_full_rank(shape):
    w = torch.randn(*shape)
    a, b = low_rank_factors(w, None)
    assert a.shape[0] == shape[1] * shape[2] and b.shape[1] == shape[0] * shape[3]
    torch.testing.assert_close(matrix_to_conv(a @ b, shape), w, atol=1e-5, rtol=1e-5)


def test_truncated_factors_keep_the_top_k_components():
    w = torch.randn(16, 8, 3, 3)
    s = torch.linalg.svdvals(conv_to_matrix(w))
    for k in (1, 5, 20):
        a, b = low_rank_factors(w, k)
        assert a.shape[1] == b.shape[0] == k
        error = torch.sum((conv_to_matrix(w) - a @ b) ** 2)
        torch.testing.assert_close(error, torch.sum(s[k:] ** 2), rtol=1e-4, atol=1e-4)  # Eckart-Young
    a, _ = low_rank_factors(w, 500)  # k above the rank is clipped to the rank
    assert a.shape[1] == len(s)


def test_factor_signs_are_canonical():
    w = torch.randn(8, 8, 3, 3)
    a, b = low_rank_factors(w, None)
    biggest = a.abs().argmax(dim=0)
    assert (a[biggest, torch.arange(a.shape[1])] > 0).all()
    a_neg, b_neg = low_rank_factors(-w, None)
    torch.testing.assert_close(a_neg @ b_neg, -(a @ b), atol=1e-5, rtol=1e-5)


def test_lrf_size_does_not_depend_on_k_and_is_far_below_naive():
    sizes = {k: sum(p.numel() for p in LowRankHypernet((32, 16, 3, 3), (64, 32, 3, 3), k, 64).parameters())
             for k in (5, 25, None)}
    assert len(set(sizes.values())) == 1
    naive = sum(p.numel() for p in NaiveHypernet((32, 16, 3, 3), (64, 32, 3, 3), 64).parameters())
    assert naive > 5 * sizes[5]
    net = LowRankHypernet((128, 64, 3, 3), (256, 128, 3, 3), rank=100)
    a_rows, b_rows = net.encode(torch.randn(128, 64, 3, 3))
    assert a_rows.shape == (100, 64 * 3) and b_rows.shape == (100, 128 * 3)  # k really is 100
    assert parse_rank(100) == 100 and parse_rank("all") is None and parse_rank(0) is None


# ---- learning --------------------------------------------------------------------------------

def _synthetic_pairs(count: int, seed: int):
    """Target = P @ source matrix @ Q (a fixed linear relation between the two convs); the
    sources scatter around one weight, as clients' copies of a layer do."""
    gen = torch.Generator().manual_seed(123)
    p, q = torch.randn(8 * 3, 4 * 3, generator=gen) / 4, torch.randn(6 * 3, 10 * 3, generator=gen) / 4
    centre = torch.randn(6, 4, 3, 3, generator=gen) * 0.3
    gen = torch.Generator().manual_seed(seed)
    pairs = []
    for _ in range(count):
        source = centre + torch.randn(6, 4, 3, 3, generator=gen) * 0.1
        pairs.append((source, matrix_to_conv(p @ conv_to_matrix(source) @ q, (10, 8, 3, 3))))
    return pairs


@pytest.mark.parametrize("kind", ["lrf", "naive"])
def test_hypernetwork_trained_on_synthetic_pairs_reduces_mse(kind):
    torch.manual_seed(0)
    net = (LowRankHypernet((6, 4, 3, 3), (10, 8, 3, 3), rank=None, hidden=32) if kind == "lrf"
           else NaiveHypernet((6, 4, 3, 3), (10, 8, 3, 3), hidden=32))
    train, held_out = _synthetic_pairs(8, seed=1), _synthetic_pairs(8, seed=2)
    before_train, before_held = mse(net, train), mse(net, held_out)
    history = fit(net, train, epochs=30, lr=3e-3, seed=0)
    assert len(history) == 30 and history[-1] < history[0]
    assert mse(net, train) < 0.3 * before_train
    assert mse(net, held_out) < 0.5 * before_held  # and to clients it never saw


# ---- the bank: pairs, chained generation, state ----------------------------------------------

def _client_weights(seed: int) -> dict:
    return state_numpy(build_model(SPEC, seed=seed))


def test_bank_pairs_last_two_convs_of_a_segment_with_the_next_segments_convs():
    segments = conv_segments(SPEC)
    pairs = conv_pairs(segments)
    assert [(p.stage, p.source, p.target) for p in pairs] == [
        (0, segments[0][2][0], segments[1][0][0]), (0, segments[0][3][0], segments[1][1][0]),
        (1, segments[1][0][0], segments[2][0][0]), (1, segments[1][1][0], segments[2][1][0])]


def test_bank_trains_on_deep_clients_and_chains_generation_for_shallow_ones():
    bank = HypernetBank(conv_segments(SPEC), rank=100, hidden=32, epochs=3, seed=0, gate=False)
    segments = conv_segments(SPEC)
    shallow = _client_weights(1)
    assert bank.generate_missing(1, shallow) == {}  # nothing trained yet: nothing generated
    losses = bank.train_round([(1, shallow), (2, _client_weights(2))], round_number=1)
    assert set(losses) == {name for name, _ in segments[1]}  # tier 2 trains only stage 0 -> 1
    losses = bank.train_round([(3, _client_weights(3)), (3, _client_weights(4))], round_number=2)
    assert len(losses) == 4 and all(np.isfinite(v) for v in losses.values())

    generated = bank.generate_missing(1, shallow)
    assert set(generated) == {name for seg in segments[1:] for name, _ in seg}
    for (name, shape) in segments[1] + segments[2]:
        assert generated[name].shape == shape and generated[name].dtype == np.float32
    pair = next(p for p in bank.pairs if p.stage == 1)
    chained = generate(bank.nets[pair.target], torch.from_numpy(generated[pair.source])).numpy()
    np.testing.assert_allclose(generated[pair.target], chained, rtol=1e-5, atol=1e-7)
    # a tier-2 client gets only segment 3, generated from its own segment-2 weights
    middle = _client_weights(5)
    from_middle = bank.generate_missing(2, middle)
    assert set(from_middle) == {name for name, _ in segments[2]}
    own = generate(bank.nets[pair.target], torch.from_numpy(middle[pair.source])).numpy()
    np.testing.assert_allclose(from_middle[pair.target], own, rtol=1e-5, atol=1e-7)
    assert bank.generate_missing(3, _client_weights(6)) == {}

    restored = HypernetBank(conv_segments(SPEC), rank=100, hidden=32, epochs=3, seed=99, gate=False)
    restored.load_state_dict(bank.state_dict())
    again = restored.generate_missing(1, shallow)
    for name, value in generated.items():
        np.testing.assert_array_equal(again[name], value)


def _zeros_like(weights: dict) -> dict:
    return {k: np.zeros_like(v) for k, v in weights.items()}


def test_gated_bank_generates_only_after_beating_the_global_weights_on_fresh_pairs():
    segments = conv_segments(SPEC)
    deep, shallow = _client_weights(3), _client_weights(1)
    bank = HypernetBank(segments, rank=100, hidden=32, epochs=20, lr=5e-3, seed=0)
    bank.train_round([(3, deep)], round_number=1, global_weights=_zeros_like(deep))
    assert bank.checks == {} and bank.generate_missing(1, shallow) == {}  # trained, never checked
    # the global weights already are the clients' deep convs: no hypernetwork can beat them
    bank.train_round([(3, deep)], round_number=2, global_weights=deep)
    assert len(bank.checks) == 4 and all(c.stand_in == 0 and not c.passed for c in bank.checks.values())
    assert bank.generate_missing(1, shallow) == {}
    # zeros as the global weights: the hypernetworks, trained on this very pair, are better
    bank.train_round([(3, deep)], round_number=3, global_weights=_zeros_like(deep))
    assert all(c.stand_in == pytest.approx(1.0) and c.passed for c in bank.checks.values())
    assert set(bank.generate_missing(1, shallow)) == {name for seg in segments[1:] for name, _ in seg}
    # a round without deep clients checks nothing and keeps the verdicts
    bank.train_round([(1, shallow)], round_number=4, global_weights=deep)
    assert bank.checks == {} and len(bank.skilled) == 4


def test_residual_bank_starts_at_the_global_weights_and_learns_the_fleets_shared_correction():
    segments = conv_segments(SPEC)
    glob = _client_weights(0)
    rng = np.random.default_rng(0)
    shift = {k: 0.05 * rng.standard_normal(v.shape).astype(np.float32) for k, v in glob.items()}

    def moved(seed: int) -> dict:  # a client: the global model + the shared shift + its own noise
        noise = np.random.default_rng(seed)
        return {k: v + shift[k] + 0.005 * noise.standard_normal(v.shape).astype(np.float32)
                for k, v in glob.items()}

    bank = HypernetBank(segments, rank=100, hidden=32, epochs=15, lr=5e-3, seed=0, gate=False,
                        residual=True, memory=2)
    pair = bank.pairs[-1]
    untrained = bank.generate_one(pair, moved(1)[pair.source], glob)
    np.testing.assert_array_equal(untrained, glob[pair.target])  # no correction yet: the stand-in
    for round_number in (1, 2, 3):
        bank.train_round([(3, moved(10 * round_number)), (3, moved(10 * round_number + 1))], round_number,
                         global_weights=glob)
    assert all(len(kept) == 2 for kept in bank.kept.values())  # the last 2 rounds' pairs are kept
    assert all(len(round_pairs) == 2 for kept in bank.kept.values() for round_pairs in kept)
    fresh = [(3, moved(100))]
    bank.train_round(fresh, 4, global_weights=glob)
    assert len(bank.checks) == 4 and all(c.passed for c in bank.checks.values())  # beats the global weights
    generated = bank.generate_missing(1, moved(7), glob)
    assert set(generated) == {name for seg in segments[1:] for name, _ in seg}
    with pytest.raises(ValueError, match="global weights"):
        bank.train_round(fresh, 5)


def test_relative_error_is_one_for_zeros_and_zero_for_the_target():
    target = np.arange(1.0, 7.0).reshape(2, 3)
    assert relative_error(np.zeros_like(target), target) == pytest.approx(1.0)
    assert relative_error(target, target) == 0.0
    assert relative_error(2 * target, target) == pytest.approx(1.0)


# ---- generated weights reach the global model ------------------------------------------------

def test_generated_conv_weights_enter_the_aggregated_global_model():
    """Guard against the released code's bug (generated weights never reached aggregation)."""
    global_weights = _client_weights(0)
    options = {"hidden": 32, "hn_epochs": 3, "seed": 0, "hn_gate": False}
    with_hn, without_hn = HypeMeFed(SPEC, Recipe(), **options), HypeMeFed(SPEC, Recipe(), hypernet="none")
    samples = {"a": (1, 10), "b": (2, 30), "c": (3, 60)}
    updates = []
    for dev, (tier, n) in samples.items():
        instruction = with_hn.configure_train(1, global_weights, [DeviceInfo(dev, n, str(tier))])[0]
        trained = state_numpy(build_model(SPEC, seed=tier + 10))
        to_global = name_map(SPEC, instruction.context["tier"], list(global_weights))
        weights = {sub: trained[g] for sub, g in to_global.items()}
        updates.append(ClientUpdate(dev, n, weights, {}, instruction))
    new_hn = with_hn.aggregate_train(1, global_weights, updates)
    new_plain = without_hn.aggregate_train(1, global_weights, updates)

    segments = conv_segments(SPEC)
    client = {u.device_id: with_hn.client_tensors(global_weights, u)[1] for u in updates}
    generated_a, generated_b = (with_hn.bank.generate_missing(1, client["a"]),
                                with_hn.bank.generate_missing(2, client["b"]))
    for name, _ in segments[2]:  # deepest convs: 1 real + 2 generated contributions
        expected = (60 * client["c"][name] + 10 * generated_a[name] + 30 * generated_b[name]) / 100
        np.testing.assert_allclose(new_hn[name], expected, rtol=1e-5, atol=1e-6)
        assert not np.allclose(new_hn[name], new_plain[name])
        np.testing.assert_array_equal(new_plain[name], client["c"][name])
    for name, _ in segments[1]:
        expected = (30 * client["b"][name] + 60 * client["c"][name] + 10 * generated_a[name]) / 100
        np.testing.assert_allclose(new_hn[name], expected, rtol=1e-5, atol=1e-6)
    conv_names = {name for seg in segments for name, _ in seg}
    for name in global_weights:  # BN and classifiers are never generated
        if name not in conv_names:
            np.testing.assert_array_equal(new_hn[name], new_plain[name])
    stats = with_hn.aggregate_evaluate(1, updates)
    assert stats["generated"] == 4 + 2 and stats["hn_trained"] == 4


def test_hypemefed_state_survives_a_restart():
    method = HypeMeFed(SPEC, Recipe(), hidden=16, hn_epochs=20, hn_lr=5e-3)
    pair = _client_weights(1)
    for round_number in (1, 2, 3):  # checked in rounds 2 and 3, passes in 3 (as in the test above)
        method.bank.train_round([(3, pair)], round_number, global_weights=_zeros_like(pair))
    state = method.state_dict()
    import json

    fresh = HypeMeFed(SPEC, Recipe(), hidden=16, hn_epochs=20, hn_lr=5e-3, seed=5)
    fresh.load_state_dict(json.loads(json.dumps(state)))
    assert fresh.bank.skilled == method.bank.skilled and len(fresh.bank.skilled) == 4
    shallow = _client_weights(2)
    a, b = method.bank.generate_missing(1, shallow), fresh.bank.generate_missing(1, shallow)
    assert set(a) == set(b) and len(a) == 4
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])


def test_hypemefed_refuses_bad_options():
    with pytest.raises(ValueError, match="hypernet"):
        HypeMeFed(SPEC, Recipe(), hypernet="big")
    with pytest.raises(ValueError, match="multi-exit"):
        HypeMeFed(vgg_multi_exit((1, 8, 8), 10, channels=(4, 8), exits_after=()), Recipe())
