"""FedConv (seed 001): conv-compressed sub-models, transposed-conv dilation, learned aggregation.

The server keeps ``server_fraction`` (5 %) of the training data (``Method.server_fraction``;
the simulation, ``fedsdk-server run`` and the benches cut it off before partitioning).

* Round 1, before anything: the global model is pre-trained on the server data for
  ``pretrain_epochs`` (5) epochs with the devices' optimiser and learning rate.
* ``configure_train``: for every shrinkage ratio SR < 1 among the selected devices, that SR's
  compressor (``methods/fedconv/conv_compress.py``) is tuned on the server data with the global
  weights frozen (``compress_epochs`` = 20, Adam, cosine lr 1e-3 -> 1e-5, T_max 4) and the
  tier's model is what it then generates: a plain torchspec/1 model with the width
  sub-model's shape (so every program format works). A device of SR 1 gets the global model.
* ``aggregate_train``: every returned model of SR < 1 is dilated to full size by its own
  dilator (``methods/fedconv/conv_dilate.py``), tuned ``dilate_epochs`` (20) epochs on the server
  data; by default what is dilated is the device's *update* (returned − sent) and the full
  model is global + dilated update. Then the full-size models are combined by learned
  per-layer weights (``methods/fedconv/learned_aggregate.py``: CE + 0.2·ΣKLD, 10 epochs, lr
  1e-3). With ``server_train_epochs`` > 0 the result is then trained that many epochs on the
  server data (the authors' code does this every round; the paper only pre-trains).

A device's SR is its tier ("1.0", "0.75", ...; or a name in ``tier_ratios``, see
``methods/tiers.py``). An edge aggregator (one result for its group, tier = the group's SR)
is just another device here. Each round's metrics row gets the server seconds spent on
``server_compress_s``, ``server_dilate_s`` and ``server_aggregate_s`` (round 1 also
``server_pretrain_s``; ``server_train_s`` if on), and the compressors' and dilators'
last-epoch accuracy on the server data (``compress_acc``, ``dilate_acc``, means over tiers /
models).

Options (``--method-option key=value``): the server epochs, learning rates and batch size
of the three stages, the compressor/dilator block, ``compress_init``, ``dilate_what``,
``dilate_base``, ``dilate_init``, ``aggregation``, ``tier_ratios`` and ``seed``; their
types, defaults and meaning: ``fedsdk-server methods show fedconv``
(``methods/fedconv/options.py``).

Decisions where the paper is silent or where it failed here (digits, 70 server images;
details in ``methods/fedconv/conv_compress.py``):
* SR 1 devices get the global model and their results are not dilated (nothing to
  compress; the authors' code does the same).
* The MLR is off by default: as specified (0.85 / 0.001 on the generated weights) it left
  sub-models near chance; ``mlr=true`` restores the paper's block.
* Compressed tensors keep the norm of the top-left block (``keep_norm``); without it the
  compressors inflated the weights round after round and the federation collapsed.
* Dilators start as zero padding every round (``dilate_init="delta"``): warm-started ones
  (the authors' choice) made the global accuracy swing more in 14-round trials.
* Pre-training happens once, in round 1 (the paper's Algorithm 1).

Why the global accuracy collapsed to chance with the paper's choices (digits, 70 server
images, Dirichlet 0.1, 20 devices: 0.59 -> 0.10 at round 10, rounds at 0.10 after that;
MQTT runs fell from 0.62 to 0.10) and what the defaults do instead:
* A compressor that persists and is re-tuned 20 epochs every round on the server data drifts
  away from the top-left block (``compress_drift`` in the metrics row: ||sent − top-left
  block|| / ||top-left block||), i.e. the sub-model's channels stop meaning the global
  model's first channels; its accuracy on the server data still rises (0.9: it refits the 70
  images every round). Dilating the returned *model* then writes the sub-model's coordinates
  into the global model: even devices that return exactly what they got change the global
  model (``tests/unit/test_fedconv.py`` pins this). Three quarters of the devices (SR < 1)
  thus overwrote the global model's core with weights in other coordinates each round; the
  global model degraded, the compressors refitted harder, and the federation collapsed.
  Carrying the updates back through the compressor's transposed Jacobian ("pullback")
  collapsed as well (measured: 0.28 -> 0.10 by round 8), as did update dilation with a
  persistent compressor (0.29 -> 0.10 by round 6).
* Defaults: ``compress_init="delta"`` (each round's compressor starts from the top-left
  block, so it stays near the global coordinates) and ``dilate_what="update"`` (a device
  that learned nothing changes nothing). Measured on the setting above (14 rounds, default
  server epochs): 0.23 -> 0.81, rising every round but one; the paper's combination
  (``compress_init=warm dilate_what=model``) remains available.
"""

from __future__ import annotations

import copy
import time
import zlib

import numpy as np

from fedcore.recipe import Recipe
from fedcore.torch_model import build_model, load_numpy, state_numpy
from fedcore.torch_train import train_model

from ...reconstruct.average import weighted_average
from ...submodels.width import WidthPlan, extract, static_bn, width_layout
from ...torch_utils import one_torch_thread, tensors_from_json, tensors_to_json
from ..base import ClientUpdate, DeviceInfo, Method, TrainInstruction, Weights
from ..tiers import tier_ratio
from .conv_compress import (
    BlockConfig,
    WeightTransform,
    compressor,
    pull_back,
    train_transform,
)
from .conv_dilate import dilator, train_update_dilator
from .learned_aggregate import learned_aggregate
from .options import FedConvOptions
from .train_generated import Schedule


def drift(generated: Weights, block: Weights) -> float:
    """How far compressed weights are from the top-left block of the global ones (the
    sub-model the width methods send, whose coordinates zero-padding dilation assumes):
    ||generated − block|| / ||block|| over all tensors together."""
    diff = sum(float(np.sum((generated[k] - block[k]) ** 2)) for k in block)
    return float(np.sqrt(diff / max(sum(float(np.sum(block[k] ** 2)) for k in block), 1e-24)))


class FedConv(Method):
    name = "fedconv"
    family = "conv"
    not_a_sum = "its server-side transposed convolutions are learned from each device's model"
    example = "--tiers 1.0,0.75,0.5,0.25"
    Options = FedConvOptions
    options: FedConvOptions

    def __init__(self, global_spec: dict, recipe: Recipe, **options) -> None:
        super().__init__(static_bn(global_spec), recipe, **options)
        o = self.options
        if not 0 < o.server_fraction < 1:
            raise ValueError(f"server_fraction must be in (0, 1), got {o.server_fraction}")
        self.server_fraction = o.server_fraction
        self.pretrain_epochs, self.server_train_epochs = o.pretrain_epochs, o.server_train_epochs
        self.block = BlockConfig(expand_channels=o.expand_channels, mlr=o.mlr, weight_norm=o.weight_norm,
                                 init=o.init, keep_norm=o.keep_norm)
        schedule = {"lr_max": o.lr_max, "lr_min": o.lr_min, "t_max": o.t_max, "cosine": o.cosine,
                    "batch_size": o.server_batch_size}
        self.compress_schedule = Schedule(epochs=o.compress_epochs, **schedule)
        self.dilate_schedule = Schedule(epochs=o.dilate_epochs, **schedule)
        self.aggregate_epochs, self.aggregate_lr = o.aggregate_epochs, o.aggregate_lr
        self.kld_weight, self.server_batch_size = o.kld_weight, o.server_batch_size
        self.dilate_init, self.dilate_base, self.aggregation = o.dilate_init, o.dilate_base, o.aggregation
        self.dilate_what, self.compress_init = o.dilate_what, o.compress_init
        self.tier_ratios = dict(o.tier_ratios)
        self.seed = o.seed
        self.compressors: dict[float, WeightTransform] = {}  # per SR, kept across rounds
        self.dilators: dict[str, WeightTransform] = {}  # per "device@SR", kept with dilate_init="warm"
        self.layout = width_layout(self.global_spec)  # the tiers' shapes and where they sit
        self._plans: dict[float, WidthPlan] = {}
        self._round: int | None = None  # the round the cached sub-models and timings belong to
        self._sub_models: dict[float, Weights] = {}
        self._compress_accs: dict[float, float] = {}
        self._compress_drifts: dict[float, float] = {}
        self._row: dict = {}  # this round's server figures for the metrics row
        self._pretrain_s: float | None = None
        # ratio -> (round, global weights, (compressor, sub-model, accuracy)) tuned ahead by deployable()
        self._ahead: dict[float, tuple[int, Weights, tuple[WeightTransform, Weights, float]]] = {}

    # -- tiers -----------------------------------------------------------------------------
    def ratio_of(self, device: DeviceInfo) -> float:
        """The shrinkage ratio of ``device`` (``methods/tiers.py``)."""
        return tier_ratio(device, self.tier_ratios)

    def plan(self, ratio: float) -> WidthPlan:
        """The width sub-model of ``ratio``: the tier's shapes and its top-left block."""
        if ratio not in self._plans:
            self._plans[ratio] = self.layout.plan(ratio)
        return self._plans[ratio]

    def spec_of(self, ratio: float) -> dict:
        """The model a tier of shrinkage ratio ``ratio`` trains."""
        return self.global_spec if ratio == 1.0 else self.plan(ratio).spec

    def deployable(self, global_weights: Weights, device: DeviceInfo) -> tuple[dict, Weights]:
        """Tier r < 1: the global model compressed as the next round would; r = 1: the global model.

        With ``compress_init="delta"`` (fresh compressors) this *is* the next round's
        compression (same seed), kept so that round's ``configure_train`` reuses it if the
        global weights are still these: the evaluation and the next round used to tune one
        compressor each per ratio on the same weights (15 of a round's 86 CPU-s at the conv
        bench's setting). With ``"warm"`` a copy of the tier's compressor is tuned (the
        method's own state is left as it is)."""
        ratio = self.ratio_of(device)
        if ratio == 1.0:
            return self.global_spec, global_weights
        if self.compress_init == "delta":  # exactly what the next round will send, kept for it
            next_round = (self._round or 0) + 1
            tuned = self._tuned_ahead(next_round, ratio, global_weights) or \
                self._tuned_compressor(next_round, ratio, global_weights)
            self._ahead[ratio] = (next_round, {k: v.copy() for k, v in global_weights.items()}, tuned)
            return self.spec_of(ratio), tuned[1]
        known = self.compressors.get(ratio)
        transform = copy.deepcopy(known) if known is not None else \
            compressor(self.global_spec, ratio, self.block, self.seed)
        with one_torch_thread():
            train_transform(transform, global_weights, self.spec_of(ratio), *self._server(),
                            self.compress_schedule, self._seed(self._round or 0, f"deploy{ratio}"))
            return self.spec_of(ratio), transform.generate(global_weights)

    def _server(self) -> tuple[np.ndarray, np.ndarray]:
        if self.server_data is None:
            raise RuntimeError("fedconv needs server data: attach_server_data() first (the simulation "
                               "does it; `fedsdk-server run` takes --server-data or a share of --dataset)")
        return self.server_data

    def _start_round(self, round_number: int) -> None:
        if self._round != round_number:
            self._round, self._sub_models, self._compress_accs = round_number, {}, {}
            self._compress_drifts = {}
            self._row = {"server_compress_s": 0.0, "server_dilate_s": 0.0, "server_aggregate_s": 0.0}
            if round_number == 1 and self._pretrain_s is not None:
                self._row["server_pretrain_s"] = self._pretrain_s

    # -- the Method interface --------------------------------------------------------------
    def initial_weights(self, seed: int) -> Weights:
        """Fresh global weights, pre-trained ``pretrain_epochs`` epochs on the server data."""
        weights = super().initial_weights(seed)
        if self.pretrain_epochs == 0:
            return weights
        started = time.perf_counter()
        weights = self.train_on_server(weights, self.pretrain_epochs, seed)
        self._pretrain_s = time.perf_counter() - started
        return weights

    def train_on_server(self, weights: Weights, epochs: int, seed: int) -> Weights:
        """``weights`` of the global model trained ``epochs`` epochs on the server data with the
        devices' optimiser and learning rate."""
        model = build_model(self.global_spec)
        load_numpy(model, weights)
        recipe = Recipe.from_dict({**self.recipe.to_dict(), "epochs": epochs,
                                   "batch_size": self.server_batch_size, "seed": seed})
        with one_torch_thread():
            train_model(model, *self._server(), recipe)
        return state_numpy(model)

    def configure_train(self, round_number: int, global_weights: Weights,
                        devices: list[DeviceInfo]) -> list[TrainInstruction]:
        self._start_round(round_number)
        ratios = {d.device_id: self.ratio_of(d) for d in devices}
        for ratio in sorted(set(ratios.values()) - {1.0} - set(self._sub_models), reverse=True):
            started = time.perf_counter()
            self._sub_models[ratio] = self.compress(round_number, ratio, global_weights)
            self._row["server_compress_s"] += time.perf_counter() - started
        instructions = []
        for device in devices:
            ratio = ratios[device.device_id]
            weights = global_weights if ratio == 1.0 else self._sub_models[ratio]
            instructions.append(TrainInstruction(device.device_id, self.spec_of(ratio), weights, self.recipe,
                                                 {"ratio": ratio}))
        return instructions

    def aggregate_train(self, round_number: int, global_weights: Weights,
                        updates: list[ClientUpdate]) -> Weights:
        self._start_round(round_number)
        started = time.perf_counter()
        full, accuracies = [], []
        for update in updates:
            ratio = float(update.instruction.context.get("ratio", 1.0))
            if ratio == 1.0:
                full.append(update.weights)
            elif self.dilate_what == "pullback":
                sent = update.instruction.weights
                change = {name: update.weights[name] - sent[name] for name in sent}
                with one_torch_thread():
                    back = pull_back(self.compressors[ratio], global_weights, change)
                full.append({name: global_weights[name] + back[name] for name in global_weights})
            else:
                weights, accuracy = self.dilate(round_number, update, ratio, global_weights)
                full.append(weights)
                accuracies.append(accuracy)
        if accuracies:
            self._row["dilate_acc"] = float(np.mean(accuracies))
        self._row["server_dilate_s"] += time.perf_counter() - started
        started = time.perf_counter()
        samples = [float(u.num_samples) for u in updates]
        if self.aggregation == "average":
            result = weighted_average(list(zip(full, samples, strict=True)))
        else:
            with one_torch_thread():
                result, info = learned_aggregate(
                    self.global_spec, global_weights, full, samples, *self._server(),
                    epochs=self.aggregate_epochs, lr=self.aggregate_lr, kld_weight=self.kld_weight,
                    batch_size=self.server_batch_size, seed=self._seed(round_number, "aggregate"))
            self._row.update({"aggregate_v_min": info["v_min"], "aggregate_v_max": info["v_max"]})
        self._row["server_aggregate_s"] += time.perf_counter() - started
        if self.server_train_epochs:
            started = time.perf_counter()
            result = self.train_on_server(result, self.server_train_epochs, self._seed(round_number, "train"))
            self._row["server_train_s"] = time.perf_counter() - started
        return result

    def aggregate_evaluate(self, round_number: int, updates: list[ClientUpdate]) -> dict:
        out = super().aggregate_evaluate(round_number, updates)
        if self._round == round_number:
            out.update(self._row)
        return out

    # -- the three server stages -----------------------------------------------------------
    def compress(self, round_number: int, ratio: float, global_weights: Weights) -> Weights:
        """Tune tier ``ratio``'s compressor on the server data; the tier's weights it generates."""
        tuned = self._tuned_compressor(round_number, ratio, global_weights)
        self.compressors[ratio], weights, accuracy = tuned
        self._compress_accs[ratio] = accuracy
        self._compress_drifts[ratio] = drift(weights, extract(global_weights, self.plan(ratio).index_map))
        self._row["compress_acc"] = float(np.mean(list(self._compress_accs.values())))
        self._row["compress_drift"] = float(np.mean(list(self._compress_drifts.values())))
        return weights

    def _tuned_compressor(self, round_number: int, ratio: float,
                          global_weights: Weights) -> tuple[WeightTransform, Weights, float]:
        """(tier ``ratio``'s compressor tuned in round ``round_number`` on ``global_weights``, the
        weights it generates, its last-epoch accuracy on the server data); taken from what
        ``deployable`` tuned ahead for this round when the global weights are the same."""
        ahead = self._tuned_ahead(round_number, ratio, global_weights)
        self._ahead.pop(ratio, None)
        if ahead is not None:
            return ahead
        if ratio not in self.compressors or self.compress_init == "delta":
            transform = compressor(self.global_spec, ratio, self.block, self.seed)
        else:
            transform = self.compressors[ratio]
        with one_torch_thread():
            stats = train_transform(transform, global_weights, self.spec_of(ratio), *self._server(),
                                    self.compress_schedule, self._seed(round_number, f"compress{ratio}"))
            weights = transform.generate(global_weights)
        return transform, weights, stats["accuracy"]

    def _tuned_ahead(self, round_number: int, ratio: float,
                     global_weights: Weights) -> tuple[WeightTransform, Weights, float] | None:
        """What ``deployable`` tuned for round ``round_number`` and ``ratio`` on these very
        global weights, else None."""
        ahead = self._ahead.get(ratio)
        if ahead is None or ahead[0] != round_number or ahead[1].keys() != global_weights.keys():
            return None
        same = all(np.array_equal(ahead[1][k], global_weights[k]) for k in global_weights)
        return ahead[2] if same else None

    def dilate(self, round_number: int, update: ClientUpdate, ratio: float,
               global_weights: Weights) -> tuple[Weights, float]:
        """(``update`` dilated to the global shapes by its own tuned dilator, the dilated
        model's last-epoch accuracy on the server data). ``dilate_what="model"``: the returned
        model is dilated (with ``dilate_base="global"`` the global values outside the client's
        block are added); ``"update"``: global + the dilated change (returned − sent)."""
        key = f"{update.device_id}@{ratio}"
        transform = self.dilators.get(key) if self.dilate_init == "warm" else None
        if transform is None:
            transform = dilator(self.global_spec, ratio, self.block, self.seed)
            if self.dilate_init == "warm":
                self.dilators[key] = transform
        seed = self._seed(round_number, key)
        with one_torch_thread():
            if self.dilate_what == "update":
                sent = update.instruction.weights
                change = {name: update.weights[name] - sent[name] for name in sent}
                weights, stats = train_update_dilator(transform, change, global_weights, self.global_spec,
                                                      *self._server(), self.dilate_schedule, seed)
                return weights, stats["accuracy"]
            base = global_weights if self.dilate_base == "global" else None
            stats = train_transform(transform, update.weights, self.global_spec, *self._server(),
                                    self.dilate_schedule, seed, base)
            return transform.generate(update.weights, base), stats["accuracy"]

    def _seed(self, round_number: int, what: str) -> int:
        return (self.seed * 1_000_003 + round_number * 7919 + zlib.crc32(what.encode())) % (2**31)

    # -- checkpoint state ------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The compressors (per SR) and, with ``dilate_init="warm"``, the dilators (per device
        and SR), as base64 float32."""
        compressors = {repr(r): tensors_to_json(t.state_dict()) for r, t in self.compressors.items()}
        return {"compressors": compressors,
                "dilators": {k: tensors_to_json(t.state_dict()) for k, t in self.dilators.items()}}

    def load_state_dict(self, state: dict) -> None:
        for ratio_text, tensors in state.get("compressors", {}).items():
            ratio = float(ratio_text)
            self.compressors[ratio] = compressor(self.global_spec, ratio, self.block, self.seed)
            self.compressors[ratio].load_state_dict(tensors_from_json(tensors))
        for key, tensors in state.get("dilators", {}).items():
            ratio = float(key.rpartition("@")[2])
            self.dilators[key] = dilator(self.global_spec, ratio, self.block, self.seed)
            self.dilators[key].load_state_dict(tensors_from_json(tensors))
