"""Which methods privacy and robust aggregation apply to, and each update's window.

Clipping, noise and the robust rules replace a method's ``aggregate_train``; that is only
sound for methods whose aggregate *is* a mean of the devices' values per element over the
devices covering it, laid out as windows of the global tensors: those that declare
``Method.weighted_sum`` with layout ``full`` or ``window`` and no server step
(``methods/capability.py``; today FedAvg, FedProx, the FedAvg exit baselines, AllSmall,
HeteroFL, FedRolex, and any method of another package that declares it). A device's window:
``full``, the whole of every tensor; ``window``, the method's index map of the plan it was
sent (``index_map(context)``), so a sub-model is a window of the global tensors.
"""

from __future__ import annotations

import numpy as np

from ..methods.base import ClientUpdate, Method, Weights
from ..methods.capability import PRIVACY, WINDOW, weighted_sum, why_not
from ..methods.width.coverage import Contribution, IndexMap


def refusal(method: Method | type[Method]) -> str | None:
    """Why DP and robust aggregation cannot replace ``method``'s aggregate (a clause; None: they can)."""
    return why_not(method, PRIVACY)


def full_window(weights: Weights) -> IndexMap:
    """Every element of every tensor (the leading axis whole; a scalar: itself)."""
    return {name: (np.arange(v.shape[0]),) if np.ndim(v) else () for name, v in weights.items()}


def window_of(method: Method, update: ClientUpdate, global_weights: Weights) -> IndexMap:
    """Where ``update``'s tensors sit in the global ones."""
    declared = weighted_sum(method)
    if declared is not None and declared.layout == WINDOW:
        return method.index_map(update.instruction.context)  # type: ignore[attr-defined]
    return full_window(global_weights)


def contributions(method: Method, updates: list[ClientUpdate], global_weights: Weights) -> list[Contribution]:
    """(returned weights, window, 1) per update: unweighted, as the private and robust rules
    count devices, not samples (a device with no samples counts as nobody)."""
    return [(u.weights, window_of(method, u, global_weights), 1.0 if u.num_samples > 0 else 0.0)
            for u in updates]
