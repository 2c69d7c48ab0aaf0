"""Which methods privacy and robust aggregation apply to, and each update's window.

Clipping, noise and the robust rules replace a method's ``aggregate_train``; that is only
sound for methods whose aggregate *is* an average of the devices' values per element over
the devices covering it: FedAvg and its subclasses that keep its aggregate (FedProx, the
FedAvg exit baselines, AllSmall), and the width-shared methods that cut every window from
the global tensors (HeteroFL, FedRolex). A device's window: for FedAvg the whole of every
tensor; for a width method the index map of the plan it was sent (``index_map``), so a
sub-model is a window of the global tensors.
"""

from __future__ import annotations

import numpy as np

from ..methods.base import ClientUpdate, Method, Weights
from ..methods.fedavg import FedAvg
from ..methods.width.coverage import Contribution, IndexMap
from ..methods.width.width_shared import WidthSharedMethod

WHY_NOT = ("its aggregate is not a per-element average of the devices' models (it trains a "
           "hypernetwork, distils, keeps per-device or per-cluster models, or adds server momentum)")


def averages_windows(method: Method | type[Method]) -> bool:
    """Whether ``method`` (instance or class) aggregates by averaging windows of the global model."""
    cls = method if isinstance(method, type) else type(method)
    if issubclass(cls, FedAvg):
        return cls.aggregate_train is FedAvg.aggregate_train
    if issubclass(cls, WidthSharedMethod):
        return (cls.aggregate_train is WidthSharedMethod.aggregate_train
                and cls.source_weights is WidthSharedMethod.source_weights
                and cls.contributions is WidthSharedMethod.contributions)
    return False


def full_window(weights: Weights) -> IndexMap:
    """Every element of every tensor (the leading axis whole; a scalar: itself)."""
    return {name: (np.arange(v.shape[0]),) if np.ndim(v) else () for name, v in weights.items()}


def window_of(method: Method, update: ClientUpdate, global_weights: Weights) -> IndexMap:
    """Where ``update``'s tensors sit in the global ones."""
    if isinstance(method, WidthSharedMethod):
        return method.index_map(update.instruction.context)
    return full_window(global_weights)


def contributions(method: Method, updates: list[ClientUpdate], global_weights: Weights) -> list[Contribution]:
    """(returned weights, window, 1) per update: unweighted, as the private and robust rules
    count devices, not samples (a device with no samples counts as nobody)."""
    return [(u.weights, window_of(method, u, global_weights), 1.0 if u.num_samples > 0 else 0.0)
            for u in updates]
