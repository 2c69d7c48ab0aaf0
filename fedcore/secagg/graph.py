"""The neighbour graph of SecAgg+: a Harary graph on a seeded random permutation of the
devices. Each device neighbours the ``k // 2`` devices before and after it on the permuted
ring, so every device has exactly ``k`` neighbours (k even, k < n) and cost per device is
O(k) instead of O(n). With ``k >= n - 1`` it is the complete graph. ``default_degree`` sizes k
so that a round survives ``DROPOUT`` of its devices dropping (module constants)."""

from __future__ import annotations

import math
import random

DROPOUT = 0.3  # the share of devices a round is sized to survive losing after the key exchange
FAILURE = 1e-3  # ... with at most this chance of a round failing (union bound over devices)


def default_degree(n: int, fraction: float = 0.5, dropout: float = DROPOUT, failure: float = FAILURE) -> int:
    """The smallest even k (at most n - 1) for which, when each device drops independently with
    probability ``dropout``, the chance that some device keeps fewer than t = floor(fraction *
    k) + 1 surviving neighbours is at most ``failure``: ``n * P[Binomial(k, 1 - dropout) < t]``.
    (10 devices: 9, the complete graph; 100: 99; 1,000: 134; 10,000: 160.)"""
    for k in range(2, n - 1, 2):
        t = int(fraction * k) + 1
        miss = sum(math.comb(k, i) * (1 - dropout) ** i * dropout ** (k - i) for i in range(t))
        if n * miss <= failure:
            return k
    return max(0, n - 1)


def neighbours(devices: list[str], k: int, seed: int) -> dict[str, list[str]]:
    """device -> its sorted neighbours; symmetric. ``k`` is rounded down to even unless the
    graph is complete (``k >= n - 1``)."""
    n = len(devices)
    order = sorted(devices)
    if k >= n - 1:
        return {d: [o for o in order if o != d] for d in order}
    random.Random(seed).shuffle(order)
    half = max(1, k // 2)
    out: dict[str, set[str]] = {d: set() for d in order}
    for i, d in enumerate(order):
        for step in range(1, half + 1):
            other = order[(i + step) % n]
            out[d].add(other)
            out[other].add(d)
    return {d: sorted(v) for d, v in out.items()}
