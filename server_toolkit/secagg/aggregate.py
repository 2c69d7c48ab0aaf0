"""Which methods secure aggregation serves, each device's layout in global coordinates
(``fedcore/secagg/layout.py``), and the next global weights from the unmasked sums.

Served: every method that declares ``Method.weighted_sum`` with ``secure``
(``methods/capability.py``): its aggregate is a per-element weighted mean, so a sum suffices.
The declaration's layout says where a device's tensors sit:

* ``full`` (FedAvg, FedProx, FedAvgM, FedAvg-L/S-Exit): every device trains the whole
  model; the cover part is one number (the sum of sample counts). The secure mean goes
  through the method's own ``aggregate_train`` as a single update, so FedAvgM's momentum
  applies as usual;
* ``window`` (HeteroFL, FedRolex): each tensor is a window of its global tensor (the
  method's ``index_map``), so covers are per element (``coverage_average``'s arithmetic);
* ``present`` (DepthFL): a depth prefix holds some global tensors whole (the method's
  ``global_names``); the ``classifiers`` rows are weighted by the device's own class counts.

Refused, with the reason, before anything starts: every other method; each needs something
of every single device's update (a hypernetwork input, a similarity, a personal model).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedcore.secagg import fixed_point
from fedcore.secagg.layout import CLASSES, SAMPLES, Layout, Placement

from ..methods.base import ClientUpdate, Method, TrainInstruction, Weights
from ..methods.capability import FULL, PRESENT, SECAGG, WINDOW, accepting, weighted_sum, why_not


def refusal(method: Method | type[Method]) -> str | None:
    """One line saying why ``--secagg`` cannot run ``method`` (an instance or a class; None: it can)."""
    why = why_not(method, SECAGG)
    if why is None:
        return None
    from ..methods import methods

    return (f"--secagg does not support {method.name}: {why}. Supported: "
            f"{', '.join(accepting(methods(), SECAGG))}")


def offsets(global_weights: Weights) -> tuple[dict[str, int], int]:
    """Each global tensor's offset in the flat global vector (names sorted), and its size D."""
    out, at = {}, 0
    for name in sorted(global_weights):
        out[name] = at
        at += int(global_weights[name].size)
    return out, at


def layout_for(method: Method, global_weights: Weights, instruction: TrainInstruction) -> Layout:
    """Where ``instruction``'s returned tensors sit in global coordinates."""
    kind = weighted_sum(method).layout
    where, size = offsets(global_weights)
    placements = {}
    if kind == WINDOW:
        index_map = method.index_map(instruction.context)
        for name in instruction.weights:
            g = global_weights[name]
            placements[name] = Placement(where[name], g.shape, tuple(np.asarray(i) for i in index_map[name]))
    else:
        if kind == PRESENT:
            mapping = method.global_names(global_weights, instruction)
            names = {sub: mapping[sub] for sub in instruction.weights}
        else:
            names = {name: name for name in instruction.weights}
        classifiers = set(method.classifiers)
        for sub, glob in names.items():
            g = global_weights[glob]
            placements[sub] = Placement(where[glob], g.shape, (), CLASSES if glob in classifiers else SAMPLES)
    return Layout(size, placements, per_element=kind != FULL)


def next_weights(method: Method, round_number: int, global_weights: Weights, total: np.ndarray,
                 layout: Layout, instruction: TrainInstruction, template: Weights | None = None) -> Weights:
    """The next global weights from the unmasked sum ``total`` (uint64, ``layout.vector_length``):
    per element sum(w x) / sum(w); elements nobody covered keep their value. ``layout`` and
    ``instruction``: any one device's (for ``full`` methods, every device's are alike);
    ``template``: the global tensors the layouts were made from (default: ``global_weights``)."""
    decoded = fixed_point.decode(total)
    values, cover = decoded[: layout.size], decoded[layout.size:]
    where, _ = offsets(global_weights if template is None else template)
    if not layout.per_element:  # full: the method's own aggregate of one update, the mean
        if cover[0] <= 0:
            raise ValueError("the secure sum holds no samples")
        mean = {name: _cast(values[where[name]: where[name] + global_weights[name].size]
                            .reshape(global_weights[name].shape) / cover[0], global_weights[name].dtype)
                for name in instruction.weights}
        return method.aggregate_train(round_number, global_weights, [_as_update(instruction, mean)])
    out = {}
    for name, previous in global_weights.items():
        part = slice(where[name], where[name] + previous.size)
        v, c = values[part].reshape(previous.shape), cover[part].reshape(previous.shape)
        merged = np.where(c > 0, v / np.where(c > 0, c, 1.0), previous)
        out[name] = _cast(merged, previous.dtype)
    return out


@dataclass(frozen=True)
class UnmaskedSum:
    """A secure round's outcome (``Exchange.secure``): the unmasked ``total`` (uint64 fixed
    point, ``layout.vector_length``), any one device's ``layout`` and ``instruction``, and the
    ``template`` tensors the layouts were made from. Called as (method, round, global weights)
    it gives the next global weights (``next_weights``); an edge instead turns it into its
    group's partial sum (``edge/secure_group.py``)."""

    total: np.ndarray
    layout: Layout
    instruction: TrainInstruction
    template: Weights

    @property
    def of_deltas(self) -> bool:
        """Whether the devices masked deltas weighted 1 (central DP: clipped, the recipe's
        ``dp_secure_clip``; local DP: clipped and noised, the recipe's ``dp_clip``), not their
        weights weighted by samples: ``sums()`` is then (the sum of the deltas, how many devices
        covered each element)."""
        recipe = self.instruction.recipe
        return recipe.dp_secure_clip > 0 or recipe.dp_clip > 0

    def __call__(self, method: Method, round_number: int, global_weights: Weights) -> Weights:
        return next_weights(method, round_number, global_weights, self.total, self.layout, self.instruction,
                            self.template)

    def sums(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Per global tensor the devices covered, ``(S, A)`` (float64, global shapes): the
        weighted sum sum_i a_i x_i and the weight sum_i a_i, decoded from the fixed point."""
        decoded = fixed_point.decode(self.total)
        size = self.layout.size
        values, cover = decoded[:size], decoded[size:]
        where, _ = offsets(self.template)
        names = self.template if self.layout.per_element else self.instruction.weights  # full: global names
        sums, weights = {}, {}
        for name in sorted(names):
            shape = self.template[name].shape
            part = slice(where[name], where[name] + self.template[name].size)
            a = cover[part].reshape(shape) if self.layout.per_element else np.full(shape, cover[0])
            if (a > 0).any():
                sums[name], weights[name] = values[part].reshape(shape), a
        return sums, weights


def _cast(values: np.ndarray, dtype) -> np.ndarray:
    return (np.rint(values) if np.dtype(dtype).kind in "iu" else values).astype(dtype)


def _as_update(instruction: TrainInstruction, weights: Weights) -> ClientUpdate:
    return ClientUpdate("secagg-sum", 1, weights, {}, instruction)
