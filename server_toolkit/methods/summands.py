"""Summands: how a method's aggregate splits into weighted sums an edge can pre-add.

Every averaging method computes, per element of each global tensor, ``sum_i a_i w_i /
sum_i a_i`` over the clients covering that element, where ``a_i`` is a client's weight for
that element (its samples; for a per-class classifier row, its samples of that class).
A method that aggregates this way says so by implementing ``Method.summands``: for one
update, per global tensor it trained, a ``Summand`` = (its values, where they sit in the
global tensor, their weight). Sums of ``a_i w_i`` and of ``a_i`` then add up in any order
and grouping, which is what lets an edge aggregator stand for a group
(``server_toolkit/edge/partial.py``).

A method whose aggregate is not such a sum (server momentum, hypernetworks, clustering,
FedConv's reconstruction, FedDM's similarity tree) does not implement it: ``summands``
raises ``NotASum`` with the reason, and generic edges forward each member's update
instead, for the server to aggregate (``server_toolkit/edge/bundle.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class NotASum(ValueError):
    """The method's aggregate is not a weighted sum; the message says why."""


@dataclass(frozen=True)
class Summand:
    """One update's share of one global tensor. ``values``: the block it trained (the whole
    tensor when ``indices`` is ``()``); ``indices``: the global indices of the block's
    leading axes (``np.ix_`` style, trailing axes whole); ``weight``: a scalar or an array
    broadcastable to ``values`` (e.g. (K, 1) per-class row weights), >= 0."""

    values: np.ndarray
    indices: tuple[np.ndarray, ...] = ()
    weight: float | np.ndarray = 1.0


def whole(weights: dict[str, np.ndarray], weight: float) -> dict[str, Summand]:
    """Every tensor of ``weights`` as a whole-tensor summand of one scalar weight (FedAvg)."""
    return {name: Summand(value, (), float(weight)) for name, value in weights.items()}


def refusal(method: object) -> str | None:
    """Why ``method`` cannot be aggregated by sums (None: it can): its own
    ``sum_refusal()``; and a subclass that overrides ``aggregate_train`` without overriding
    ``summands`` is refused (its aggregate is no longer the one its parent's summands
    describe, e.g. FedAvgM's server momentum)."""
    cls = type(method)
    owner_sum = next(c for c in cls.__mro__ if "summands" in vars(c))
    owner_agg = next(c for c in cls.__mro__ if "aggregate_train" in vars(c))
    if not issubclass(owner_sum, owner_agg):
        return f"{getattr(cls, 'name', cls.__name__)} aggregates by a rule of its own, not by weighted sums"
    return method.sum_refusal()  # type: ignore[attr-defined]
