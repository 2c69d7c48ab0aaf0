"""The maths of client-level DP, label noise and robust aggregation on synthetic arrays:
clipping, noise per element scaled by coverage, the accountant against dp-accounting's
other accountant, adaptive clipping, Laplace label counts, median / trimmed mean per element."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import pld_privacy_accountant

from sdk_device.privacy import clip_delta, delta_l2, noised_delta, noised_label_counts
from server_toolkit.methods import method_class
from server_toolkit.privacy.accountant import central_epsilon, local_epsilon, noise_for_epsilon
from server_toolkit.privacy.adaptive import next_clip, update_noise_multiplier
from server_toolkit.privacy.clipping import clipped_deltas, noised_window_mean
from server_toolkit.privacy.settings import PrivacySettings
from server_toolkit.rounds.robust import coverage_robust

ROWS = 4000


def test_clipping_scales_a_long_delta_to_norm_c_and_keeps_a_short_one_and_integer_tensors():
    sent = {"w": np.zeros((3, 4), np.float32), "b": np.ones(4, np.float32), "steps": np.array(7, np.int64)}
    long = {"w": np.full((3, 4), 2.0, np.float32), "b": np.full(4, 3.0, np.float32), "steps": np.array(9)}
    clipped, norm = clip_delta(sent, long, 1.5)
    assert norm == pytest.approx(math.sqrt(12 * 4 + 4 * 4))
    assert delta_l2(sent, clipped) == pytest.approx(1.5, rel=1e-6)
    assert clipped["steps"] == 7  # an integer tensor goes back as sent: not part of the bounded delta
    assert np.allclose(clipped["w"] / 2.0, (clipped["b"] - 1) / 2.0)  # one factor for the whole update
    short = {"w": np.full((3, 4), 0.01, np.float32), "b": np.ones(4, np.float32), "steps": np.array(7)}
    kept, _ = clip_delta(sent, short, 1.5)
    assert np.array_equal(kept["w"], short["w"])


def test_a_device_noises_its_clipped_delta_with_the_stated_std_from_fresh_entropy():
    sent = {"w": np.zeros(200_000, np.float32)}
    returned = {"w": np.full(200_000, 1.0, np.float32)}
    first, second = noised_delta(sent, returned, 2.0, 0.3), noised_delta(sent, returned, 2.0, 0.3)
    noise = first["w"] - 2.0 / math.sqrt(200_000)
    assert np.std(noise) == pytest.approx(0.3, rel=0.02) and abs(np.mean(noise)) < 0.01
    assert not np.array_equal(first["w"], second["w"])  # never the task's seed


def _windows(rows_each: list[int]) -> list[dict]:
    return [{"w": (np.arange(rows),)} for rows in rows_each]


def test_noise_on_each_element_of_the_average_is_sigma_over_its_coverage():
    """Two devices cover rows 0..999, one more covers every row: the averaged noise has std
    sigma / 3 on the first rows and sigma on the rest; the noise on the sum is sigma everywhere."""
    global_weights = {"w": np.zeros((ROWS, 8), np.float32)}
    windows = _windows([1000, 1000, ROWS])
    deltas = [{"w": np.zeros((len(w["w"][0]), 8))} for w in windows]
    out = noised_window_mean(global_weights, list(zip(deltas, windows, strict=True)), 0.6,
                             np.random.default_rng(1))["w"]
    assert np.std(out[:1000]) == pytest.approx(0.6 / 3, rel=0.05)
    assert np.std(out[1000:]) == pytest.approx(0.6, rel=0.05)


def test_without_noise_each_element_is_the_mean_of_its_covering_clipped_deltas():
    global_weights = {"w": np.ones((6, 2), np.float32), "n": np.array(3, np.int64)}
    windows = [{"w": (np.arange(6),), "n": ()}, {"w": (np.array([0, 1]),), "n": ()}]
    sent = [{"w": np.ones((6, 2), np.float32)}, {"w": np.ones((2, 2), np.float32)}]
    returned = [{"w": np.full((6, 2), 1.2, np.float32)}, {"w": np.full((2, 2), 101.0, np.float32)}]
    deltas, norms = clipped_deltas(list(zip(sent, returned, strict=True)), 1.0)
    assert norms[1] == pytest.approx(200.0)
    out = noised_window_mean(global_weights, list(zip(deltas, windows, strict=True)), 0.0,
                             np.random.default_rng(0))
    second = 1.0 / 2.0  # device 2's delta clipped to norm 1 over its 4 elements
    assert np.allclose(out["w"][:2], 1 + (0.2 + second) / 2)  # device 1: norm 0.69, kept
    assert np.allclose(out["w"][2:], 1.2)
    assert out["n"] == 3


def test_central_epsilon_grows_with_rounds_falls_with_noise_and_agrees_with_the_pld_accountant():
    eps = [central_epsilon(1.2, [0.1] * t, 1e-5) for t in (1, 5, 20, 50)]
    assert all(a < b for a, b in zip(eps, eps[1:], strict=False))
    assert central_epsilon(2.0, [0.1] * 20, 1e-5) < eps[2]
    pld = pld_privacy_accountant.PLDAccountant()
    pld.compose(dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(1.2)), 20)
    tight = pld.get_epsilon(1e-5)
    assert tight <= eps[2] <= 1.35 * tight, (tight, eps[2])  # RDP is an upper bound, and close
    assert central_epsilon(0.0, [0.1], 1e-5) == math.inf


def test_local_epsilon_is_the_gaussian_mechanism_with_sensitivity_2c_composed_every_round():
    # classic RDP of the Gaussian mechanism: alpha * T * (2C)^2 / (2 (zC)^2); the library's
    # conversion to (eps, delta) is at least as tight as the classic one
    z, rounds, delta = 8.0, 10, 1e-5
    orders = np.linspace(1.01, 200, 20000)
    classic = min(a * rounds * 2 / z ** 2 + math.log(1 / delta) / (a - 1) for a in orders)
    assert 0.8 * classic <= local_epsilon(z, rounds, delta) <= classic


def test_noise_for_epsilon_finds_the_multiplier_that_spends_the_target():
    z = noise_for_epsilon(3.0, "central", 0.1, 10, 1e-5)
    assert central_epsilon(z, [0.1] * 10, 1e-5) <= 3.0 < central_epsilon(0.98 * z, [0.1] * 10, 1e-5)


def test_adaptive_clipping_splits_the_noise_and_moves_c_towards_the_quantile():
    z, count_std = 1.0, 5.0
    z_updates = update_noise_multiplier(z, count_std)
    assert z_updates ** -2 + (2 * count_std) ** -2 == pytest.approx(z ** -2)
    rng = np.random.default_rng(0)
    assert next_clip(1.0, [0.1] * 100, 0.5, 0.0, rng) == pytest.approx(math.exp(-0.2 * 0.5))
    assert next_clip(1.0, [5.0] * 100, 0.5, 0.0, rng) == pytest.approx(math.exp(0.2 * 0.5))


def test_noised_label_counts_cover_every_class_are_non_negative_and_unbiased_for_large_counts():
    y = np.repeat(np.arange(3), 500)
    draws = np.array([noised_label_counts(y, 10, 0.5) for _ in range(400)])
    assert draws.shape == (400, 10) and (draws >= 0).all()
    assert np.allclose(draws[:, :3].mean(axis=0), 500, atol=1.0)
    assert np.std(draws[:, :3]) == pytest.approx(math.sqrt(2) / 0.5, rel=0.15)  # Laplace(1/eps)


def test_median_and_trimmed_mean_per_element_use_only_the_covering_devices():
    current = {"w": np.zeros((4, 2), np.float32)}
    values = [np.full((4, 2), 1.0), np.full((4, 2), 2.0), np.full((2, 2), 1e9), np.full((2, 2), 3.0),
              np.full((2, 2), 4.0)]
    windows = [{"w": (np.arange(4),)}, {"w": (np.arange(4),)}, {"w": (np.array([0, 1]),)},
               {"w": (np.array([0, 1]),)}, {"w": (np.array([2, 3]),)}]
    contributions = [(({"w": v}), w, 1.0) for v, w in zip(values, windows, strict=True)]
    median = coverage_robust(current, contributions, "median")["w"]
    assert np.allclose(median[:2], 2.5)  # rows 0-1: 1, 2, 3, 1e9: mean of the middle two
    assert np.allclose(median[2:], 2.0)  # rows 2-3: 1, 2, 4
    # rows 0-1: 4 values, 0.25 -> one cut from each end: mean(2, 3); rows 2-3: 3 values, none cut
    trimmed = coverage_robust(current, contributions, "trimmed-mean", 0.25)["w"]
    assert np.allclose(trimmed[:2], 2.5) and np.allclose(trimmed[2:], 7 / 3)
    nobody = coverage_robust({"w": np.full(3, 9.0, np.float32), "v": np.ones(2, np.float32)},
                             [({"w": np.ones(2)}, {"w": (np.array([0, 1]),)}, 1.0)], "median")
    assert nobody["w"].tolist() == [1.0, 1.0, 9.0] and nobody["v"].tolist() == [1.0, 1.0]


@pytest.mark.parametrize(("settings", "method", "says"), [
    (PrivacySettings(clip=1.0, noise_multiplier=1.0), "pfedhn", "not supported by pfedhn"),
    (PrivacySettings(clip=1.0, noise_multiplier=1.0), "fedavgm", "not supported by fedavgm"),
    (PrivacySettings(clip=1.0, noise_multiplier=1.0, adaptive_quantile=0.5, mode="local"), "fedavg",
     "needs --dp-mode central"),
    (PrivacySettings(clip=1.0, robust="median"), "fedavg", "do not combine"),
    (PrivacySettings(label_epsilon=1.0), "fedavg", "asks devices for no label histograms"),
    (PrivacySettings(robust="median"), "depthfl", "not supported by depthfl"),
    (PrivacySettings(noise_multiplier=1.0), "fedavg", "need --dp-clip"),
])
def test_settings_that_a_method_cannot_honour_are_refused_in_one_line(settings, method, says):
    with pytest.raises(ValueError, match=says) as caught:
        settings.check(method_class(method))
    assert "\n" not in str(caught.value)


def test_supported_settings_pass_for_fedavg_and_the_width_methods():
    for name in ("fedavg", "fedprox", "heterofl", "fedrolex"):
        PrivacySettings(clip=1.0, noise_multiplier=1.0, epsilon_budget=8.0).check(method_class(name), 0.1)
        PrivacySettings(robust="trimmed-mean", trim_fraction=0.2).check(method_class(name))
    PrivacySettings(label_epsilon=2.0).check(method_class("recipfl"))
    with pytest.raises(ValueError, match="spent by one round"):
        PrivacySettings(clip=1.0, noise_multiplier=0.3, epsilon_budget=0.5).check(method_class("fedavg"), 0.5)
