"""Summands: how a method's aggregate splits into weighted sums an edge can pre-add.

Every averaging method computes, per element of each global tensor, ``sum_i a_i w_i /
sum_i a_i`` over the clients covering that element, where ``a_i`` is a client's weight for
that element (its samples; for a per-class classifier row, its samples of that class).
A method that aggregates this way declares it (``Method.weighted_sum``,
``methods/capability.py``) and implements ``Method.summands``: for one
update, per global tensor it trained, a ``Summand`` = (its values, where they sit in the
global tensor, their weight). Sums of ``a_i w_i`` and of ``a_i`` then add up in any order
and grouping, which is what lets an edge aggregator stand for a group
(``server_toolkit/edge/partial.py``).

A method whose aggregate is not such a sum (hypernetworks, clustering,
FedConv's reconstruction, FedDM's similarity tree) declares nothing: ``summands``
raises ``NotASum`` with the reason, and generic edges forward each member's update
instead, for the server to aggregate (``server_toolkit/edge/bundle.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .capability import EDGES, why_not


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
    """Why edges cannot pre-add ``method``'s updates (None: they can), one line; reads only its
    declared ``weighted_sum`` (``methods/capability.py``)."""
    why = why_not(method, EDGES)
    return None if why is None else f"{getattr(method, 'name', '') or type(method).__name__}: {why}"
