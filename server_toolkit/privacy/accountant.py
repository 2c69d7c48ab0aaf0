"""The privacy accountant: epsilon for a given delta, from Google's ``dp-accounting`` (RDP).

Central DP (a trusted server adds the noise): every round is a sampled Gaussian mechanism
with noise multiplier z (noise std / clipping norm on the sum of clipped deltas). The
sampling is accounted as Poisson sampling with rate q = devices per round / devices online
(the loop actually draws a fixed-size uniform sample; accounting it as Poisson with the same
expected size is the usual approximation of DP-FedAvg, TFF and Opacus). Rounds compose.

Local DP (each device adds its own noise): the guarantee is the one a device has against
the server itself, which knows who took part, so there is no amplification by sampling;
two datasets of one device can give clipped deltas up to 2C apart, so each report is a
Gaussian mechanism with multiplier z/2; worst case, the device takes part in every round.
"""

from __future__ import annotations

import logging
import math

import dp_accounting
from dp_accounting import rdp


def _epsilon(events: list[tuple[dp_accounting.DpEvent, int]], delta: float) -> float:
    accountant = rdp.RdpAccountant()
    absl = logging.getLogger("absl")  # it warns for every RDP order whose series it cuts short
    level, absl.level = absl.level, logging.ERROR
    try:
        for event, count in events:
            accountant.compose(event, count)
        return float(accountant.get_epsilon(delta))
    finally:
        absl.level = level


def _runs(rates: list[float]) -> list[tuple[float, int]]:
    """Consecutive equal rates as (rate, count)."""
    out: list[tuple[float, int]] = []
    for q in rates:
        if out and out[-1][0] == q:
            out[-1] = (q, out[-1][1] + 1)
        else:
            out.append((q, 1))
    return out


def central_epsilon(noise_multiplier: float, rates: list[float], delta: float) -> float:
    """Epsilon after rounds with these sampling rates (each in (0, 1]); inf without noise."""
    if not rates:
        return 0.0
    if noise_multiplier <= 0:
        return math.inf
    gaussian = dp_accounting.GaussianDpEvent(noise_multiplier)
    events = [(dp_accounting.PoissonSampledDpEvent(min(q, 1.0), gaussian), n) for q, n in _runs(rates)]
    return _epsilon(events, delta)


def local_epsilon(noise_multiplier: float, rounds: int, delta: float) -> float:
    """A device's epsilon against the server after ``rounds`` noised reports (module docstring)."""
    if rounds <= 0:
        return 0.0
    if noise_multiplier <= 0:
        return math.inf
    return _epsilon([(dp_accounting.GaussianDpEvent(noise_multiplier / 2), rounds)], delta)


def epsilon(mode: str, noise_multiplier: float, rates: list[float], delta: float) -> float:
    """Epsilon after the rounds with ``rates`` in ``mode`` ("central" or "local")."""
    if mode == "local":
        return local_epsilon(noise_multiplier, len(rates), delta)
    return central_epsilon(noise_multiplier, rates, delta)


def noise_for_epsilon(target: float, mode: str, rate: float, rounds: int, delta: float) -> float:
    """The smallest noise multiplier (to 0.1 %) whose epsilon after ``rounds`` rounds at
    ``rate`` is at most ``target`` (bisection; epsilon falls as the noise grows)."""
    low, high = 0.01, 1.0
    while epsilon(mode, high, [rate] * rounds, delta) > target:
        low, high = high, high * 2
        if high > 1e5:
            raise ValueError(f"no noise multiplier reaches epsilon {target} in {rounds} rounds")
    while high - low > 1e-3 * high:
        mid = (low + high) / 2
        low, high = (mid, high) if epsilon(mode, mid, [rate] * rounds, delta) > target else (low, mid)
    return high
