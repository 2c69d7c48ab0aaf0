"""FedDM (Shen & Zheng, seed 004): dynamic width sharing + similarity-tree cooperation.

Dynamic sharing. Every round the server gives each device its ratio (its tier) and, per
hidden channel space, a window start ("row/column offsets": a layer's rows are its output
space, its columns its input space). The rule is ``balanced_offsets`` (see
``submodels/offsets.py``): low-discrepancy steps per space, so over rounds every element
of every layer is covered about equally often, with a per-device phase that spreads the
devices of one tier evenly around the channel ring. The phase is the device's *slot*
among the devices of its tier seen so far (slot k of m -> k / m); slots are assigned at
aggregation, in device-id order, and saved with the method state, so a plan depends only
on (round, device, saved state) and a restarted server re-plans identically. A device
without a slot yet (its first round) takes a phase from a hash of its id. Windows wrap
around (without wrapping, no rule can cover a layer evenly at r > 0.5: the centre lies in
every block). The paper also wants the rule to weigh "client performance": not done.

Cooperation (option ``tree``, default on; ``tree=false`` gives plain dynamic sharing):
after the usual per-element aggregation (the global model), the server builds the
similarity tree of ``methods/width/similarity_tree.py`` over this round's devices and
aggregates the deeper layers again within each subtree; each device keeps its subtree's
deeper layers (full global shape) and is sent those, instead of the global ones, next
time. Elements its subtree did not cover take the global value. A device that sits out
rounds keeps the deeper layers of its last round. The global model (evaluated centrally)
is the aggregate over all devices.

Inputs of the similarity: the label counts of each device come from the update's metrics
(``label_counts``) or the ``label_counts`` option {device id: [count per class]}; when
some device has none, the label term is left out. The reference batch is the ``reference``
option (an .npz path with an array ``x``, or an array); without one, ``reference_size``
seeded uniform-noise inputs, a weak stand-in (a warning is logged).

Options (``fedsdk-server methods show feddm``): ``tree``, ``lam`` (the output term's
weight), ``tree_levels``, ``reference``, ``reference_size``, ``label_counts``, ``seed`` (for
the hash phases and the noise batch), ``rule`` ("four_corner" = the paper's intermediate
scheme, for comparison), plus ``tier_ratios`` (``width_shared``).
"""

from __future__ import annotations

import base64
import hashlib
import logging
from dataclasses import dataclass

import numpy as np

from fedcore.recipe import Recipe

from ...submodels.offsets import balanced_offsets, four_corner_offsets
from ..base import ClientUpdate, DeviceInfo, Weights, label_histogram
from ..options import OptionError, option
from .coverage import coverage_average
from .similarity_tree import (
    build_tree,
    client_distance,
    clusters_at,
    depth_levels,
    label_distributions,
    subtree_labels,
)
from .width_shared import WidthOptions, WidthSharedMethod

log = logging.getLogger(__name__)

RULES = {"balanced": balanced_offsets, "four_corner": four_corner_offsets}


@dataclass(frozen=True)
class FedDMOptions(WidthOptions):
    tree: bool = option(
        True, "Similarity-tree cooperation on the deeper layers (false: plain dynamic sharing).")
    lam: float = option(1.0, "Weight of the output term (vs the label term) of the client similarity.",
                        minimum=0.0)
    tree_levels: int = option(2, "Tree levels below the global one; each shares a deeper group of layers.",
                              minimum=0)
    reference: object = option(
        None, "Reference inputs of the output term: an .npz path with an array x (from Python also an "
        "(N, C, H, W) array); none: reference_size noise inputs.")
    reference_size: int = option(
        64, "Noise inputs in the reference batch when no reference is given.", minimum=1)
    label_counts: dict[str, list[float]] = option(
        {}, "Label counts {device id: list of counts per class} of devices that do not report them.")
    seed: int = option(0, "Seed of the first-round phases (hashed with the device id) and the noise batch.")
    rule: str = option("balanced", "Window rule: balanced moving windows, or the paper's four-corner scheme.",
                       choices=tuple(RULES))


class FedDM(WidthSharedMethod):
    name = "feddm"
    asks = {"label_counts": {}}  # the label distributions of the similarity tree
    family = "width"
    example = "--tiers 1.0,0.75,0.5,0.25"
    Options = FedDMOptions
    options: FedDMOptions
    per_device_models = True  # a device's window is cut from its own tree-shared weights
    weighted_sum = None  # the similarity tree mixes the clients' absolute weights (not an average)
    not_a_sum = "its similarity tree compares the devices' individual updates"

    def __init__(self, global_spec: dict, recipe: Recipe, **options) -> None:
        super().__init__(global_spec, recipe, **options)
        o = self.options
        if o.reference is not None and not isinstance(o.reference, str | np.ndarray):
            raise OptionError(f"method 'feddm' option reference: expected an .npz path or an array, "
                              f"got {o.reference!r}")
        self.rule = RULES[o.rule]
        self.tree, self.lam, self.tree_levels = o.tree, o.lam, o.tree_levels
        self.reference, self.reference_size = o.reference, o.reference_size
        self.label_counts = {k: np.asarray(v, np.float64) for k, v in o.label_counts.items()}
        self.seed = o.seed
        self.slots: dict[str, list[str]] = {}  # ratio -> device ids, in slot order
        self.personal: dict[str, Weights] = {}  # device id -> its subtree's deeper layers
        self.clusters: dict[str, dict[str, int]] = {}  # tree level -> {device id: subtree} (last round)
        self._reference_x: np.ndarray | None = None

    # -- dynamic sharing -----------------------------------------------------------------
    def phase(self, device: DeviceInfo, ratio: float) -> float:
        """Where ``device`` sits on the channel ring among its tier, in [0, 1)."""
        slots = self.slots.get(_ratio_key(ratio), [])
        if device.device_id in slots:
            return slots.index(device.device_id) / len(slots)
        digest = hashlib.sha256(f"{self.seed}:{device.device_id}".encode()).hexdigest()
        return int(digest[:12], 16) / 16 ** 12

    def offsets(self, round_number: int, device: DeviceInfo, ratio: float) -> dict[int, int]:
        return self.rule(self.layout, ratio, round_number, self.phase(device, ratio))

    def source_weights(self, global_weights: Weights, device: DeviceInfo) -> Weights:
        own = self.personal.get(device.device_id)
        return {**global_weights, **own} if own else global_weights

    def aggregate_train(self, round_number: int, global_weights: Weights,
                        updates: list[ClientUpdate]) -> Weights:
        new_global = coverage_average(global_weights, self.contributions(updates))
        self._assign_slots(updates)
        if self.tree and len(updates) >= 2 and self.tree_levels > 0:
            self._cooperate(new_global, updates)
        return new_global

    def _assign_slots(self, updates: list[ClientUpdate]) -> None:
        for update in sorted(updates, key=lambda u: u.device_id):
            key = _ratio_key(update.instruction.context["ratio"])
            for other_key, devices in self.slots.items():
                if other_key != key and update.device_id in devices:
                    devices.remove(update.device_id)  # the device changed tier
            if update.device_id not in self.slots.setdefault(key, []):
                self.slots[key].append(update.device_id)

    # -- tree cooperation ----------------------------------------------------------------
    def _cooperate(self, new_global: Weights, updates: list[ClientUpdate]) -> None:
        distance = client_distance(self._reference_outputs(updates), self._label_dists(updates), self.lam)
        tree = build_tree(distance)
        level_of_unit = depth_levels(len(self.layout.units), self.tree_levels)
        parts = self.contributions(updates)
        self.clusters = {}
        for level in range(1, self.tree_levels + 1):
            names = [n for n, unit in self.layout.unit_of.items() if level_of_unit[unit] == level]
            if not names:
                continue
            labels = subtree_labels(tree, clusters_at(level, len(updates)))
            self.clusters[str(level)] = {u.device_id: int(c) for u, c in zip(updates, labels, strict=True)}
            level_global = {name: new_global[name] for name in names}
            for cluster in np.unique(labels):
                members = np.flatnonzero(labels == cluster)
                shared = coverage_average(level_global, [parts[i] for i in members])
                for i in members:
                    self.personal.setdefault(updates[i].device_id, {}).update(shared)

    def _label_dists(self, updates: list[ClientUpdate]) -> np.ndarray | None:
        counts = []
        classes = self.global_spec["num_classes"]
        for update in updates:
            found = label_histogram(update.metrics.get("label_counts"), classes)
            if found is None:
                found = label_histogram(self.label_counts.get(update.device_id), classes)
            if found is None:
                return None
            counts.append(found)
        return label_distributions(np.stack(counts))

    def reference_batch(self) -> np.ndarray:
        """The server's reference inputs (N, C, H, W) float32 (loaded once)."""
        if self._reference_x is None:
            if isinstance(self.reference, np.ndarray):
                x = self.reference
            elif self.reference:
                with np.load(self.reference) as data:
                    x = data["x"]
            else:
                log.warning("feddm: no reference batch given; using %d noise inputs", self.reference_size)
                shape = (self.reference_size, *self.global_spec["input_shape"])
                x = np.random.default_rng(self.seed).random(shape)
            self._reference_x = np.ascontiguousarray(x, np.float32)
        return self._reference_x

    def _reference_outputs(self, updates: list[ClientUpdate]) -> np.ndarray:
        """(n, B, K) softmax of each returned model's final output on the reference batch."""
        import torch

        from fedcore.torch_model import build_model, load_numpy

        x = torch.from_numpy(self.reference_batch())
        probs = []
        with torch.no_grad():
            for update in updates:
                model = build_model(update.instruction.spec)
                load_numpy(model, update.weights)
                model.eval()
                probs.append(torch.softmax(model(x)[-1], dim=1).numpy())
        return np.stack(probs)

    # -- state -----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"slots": self.slots, "clusters": self.clusters,
                "personal": {dev: {name: _encode(a) for name, a in tensors.items()}
                             for dev, tensors in self.personal.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.slots = {k: list(v) for k, v in state.get("slots", {}).items()}
        self.clusters = state.get("clusters", {})
        self.personal = {dev: {name: _decode(a) for name, a in tensors.items()}
                         for dev, tensors in state.get("personal", {}).items()}


def _ratio_key(ratio: float) -> str:
    return f"{float(ratio):g}"


def _encode(array: np.ndarray) -> dict:
    data = np.ascontiguousarray(array)
    return {"dtype": str(data.dtype), "shape": list(data.shape),
            "data": base64.b64encode(data.tobytes()).decode()}


def _decode(item: dict) -> np.ndarray:
    raw = base64.b64decode(item["data"])
    return np.frombuffer(raw, dtype=np.dtype(item["dtype"])).reshape(item["shape"]).copy()
