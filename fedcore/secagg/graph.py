"""The neighbour graph of SecAgg+: a Harary graph on a seeded random permutation of the
devices. Each device neighbours the ``k // 2`` devices before and after it on the permuted
ring, so every device has exactly ``k`` neighbours (k even, k < n) and cost per device is
O(k) instead of O(n). With ``k >= n - 1`` it is the complete graph."""

from __future__ import annotations

import math
import random


def default_degree(n: int) -> int:
    """k for n devices: ``2 * ceil(2 * log2 n)`` (Bell et al.: O(log n)), at most n - 1."""
    if n <= 1:
        return 0
    return min(n - 1, 2 * math.ceil(2 * math.log2(n)))


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
