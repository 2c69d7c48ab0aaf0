"""What an edge aggregator does with its group: FedConv's clustering-based local training.

``EdgeRelay`` is a ``Method`` driven by the edge's own round loop (``edge/aggregator.py``), so
its group gets the same task handling, validation, rejection and persistence as a server's
fleet. Per server task it runs one or two rounds on the group:

* **warm-up** (before the first training round, and again whenever the last layer's shape
  changes): every device trains the server's weights for ``warmup_epochs`` (1); the edge
  clusters the returned last linear layers (``clustering.choose_clusters``) and keeps the
  assignment (device id -> cluster) and the centroids in its checkpoints. The warm-up
  models are then dropped.
* **train**: every device trains the server's task (its steps, recipe and any other
  models, as received) and sends the ``features`` output (smashed data) of up to
  ``smashed_samples`` samples. The edge averages each cluster
  (sample-weighted), links close clusters and tunes their last linear layers with
  projection layers (``projection.run_stage``), then answers the server with the
  sample-weighted average of its cluster models (samples = all its devices' samples).
  The body of that answer is therefore the plain FedAvg of the group; the clusters and the
  projection stage shape its last linear layer.

A device that joins after the warm-up goes to the cluster whose centroid is nearest
(KL(device ‖ centroid)) in its first training round, and stays there.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from dataclasses import dataclass

import numpy as np

from fedcore.recipe import Recipe

from ...reconstruct.average import weighted_average
from ..base import ClientUpdate, DeviceInfo, Method, TrainInstruction, Weights
from ..records import FEATURES
from .clustering import choose_clusters, layer_distribution, nearest_centroid
from .projection import Head, run_stage, select_pairs

log = logging.getLogger(__name__)

WARMUP, TRAIN = "warmup", "train"
_TOP_LEVEL_WEIGHT = re.compile(r"^layers\.(\d+)\.weight$")


@dataclass
class EdgeOptions:
    """The edge's FedConv settings (see the module docstrings of ``clustering`` and
    ``projection`` for what each means and why these defaults)."""

    max_clusters: int = 8
    min_silhouette: float = 0.25
    warmup_epochs: int = 1
    smashed_samples: int = 128  # per device and round; 0 turns the projection stage off
    pair_threshold: float = 1.0
    projection_lambda: float = 0.5
    projection_epochs: int = 2
    seed: int = 0


@dataclass(frozen=True)
class ForwardedTask:
    """A server task as the edge passes it on: an instruction template holding the task's
    models exactly as received (programs in every format offered, weights), its steps, the
    models it returns and the outputs it asks for (the relay fills in each device)."""

    template: TrainInstruction

    @property
    def weights(self) -> Weights:
        return self.template.weights

    @property
    def recipe(self) -> Recipe:
        return self.template.recipe


def final_linear(weights: Weights) -> tuple[str, str | None]:
    """Names of the final linear layer's weight (K, F) and bias (or None): the top-level
    2-D ``layers.<i>.weight`` with the largest i (exit heads are nested, so never picked)."""
    found = [(int(m.group(1)), name) for name in weights
             if (m := _TOP_LEVEL_WEIGHT.match(name)) and weights[name].ndim == 2]
    if not found:
        raise ValueError("the model has no top-level linear layer to cluster on")
    name = max(found)[1]
    bias = name[: -len("weight")] + "bias"
    return name, bias if bias in weights else None


class EdgeRelay(Method):
    """See the module docstring. ``phase`` (WARMUP or TRAIN) is set by the aggregator before
    each group round; ``summary`` describes the last aggregation (sent up as metrics)."""

    name = ""  # not a server method: only the edge process drives it

    def __init__(self, options: EdgeOptions | None = None) -> None:
        super().__init__({}, Recipe())
        self.options = options or EdgeOptions()
        self.task: ForwardedTask | None = None
        self.phase = TRAIN
        self.clusters: dict[str, int] = {}
        self.centroids: np.ndarray | None = None  # (k, d) probability vectors
        self.summary: dict = {}
        self.returned: dict[str, Weights] = {}  # the other returned models, averaged (e.g. a teacher)

    def initial_weights(self, seed: int) -> Weights:
        """Nothing: every group round starts from the weights the server sent."""
        return {}

    # -- what the aggregator calls -------------------------------------------------------
    def forward(self, task: ForwardedTask) -> None:
        """The server's task that the next group rounds pass on."""
        final_linear(task.weights)  # ValueError now rather than in the middle of a round
        self.task = task

    def needs_warmup(self) -> bool:
        """True before the first clustering and when the last layer changed its shape."""
        if self.centroids is None or self.task is None:
            return True
        return self.centroids.shape[1] != len(self._distribution(self.task.weights))

    # -- the Method interface ------------------------------------------------------------
    def configure_train(self, round_number: int, global_weights: Weights,
                        devices: list[DeviceInfo]) -> list[TrainInstruction]:
        template = self._require_task().template
        recipe = template.recipe
        reports = {k: v for k, v in template.reports.items() if k != FEATURES}  # never passed up
        if self.phase == WARMUP:
            recipe = dataclasses.replace(recipe, epochs=self.options.warmup_epochs)
        elif self.options.smashed_samples > 0 and template.spec:
            reports[FEATURES] = {"samples": self.options.smashed_samples}
        return [dataclasses.replace(template, device_id=d.device_id, weights=global_weights, recipe=recipe,
                                    reports=reports) for d in devices]

    def aggregate_train(self, round_number: int, global_weights: Weights,
                        updates: list[ClientUpdate]) -> Weights:
        if self.phase == WARMUP:
            self._cluster(updates)
            return global_weights
        others = {name for u in updates for name in u.others if name != FEATURES}
        self.returned = {name: weighted_average([(u.others[name], u.num_samples) for u in updates
                                                 if name in u.others]) for name in sorted(others)}
        return self._aggregate(updates)

    def state_dict(self) -> dict:
        return {"clusters": self.clusters,
                "centroids": None if self.centroids is None else self.centroids.tolist()}

    def load_state_dict(self, state: dict) -> None:
        self.clusters = {str(k): int(v) for k, v in state.get("clusters", {}).items()}
        centroids = state.get("centroids")
        self.centroids = None if centroids is None else np.asarray(centroids, np.float64)

    # -- warm-up: clustering -------------------------------------------------------------
    def _distribution(self, weights: Weights) -> np.ndarray:
        weight, bias = final_linear(weights)
        return layer_distribution(weights[weight], weights[bias] if bias else None)

    def _cluster(self, updates: list[ClientUpdate]) -> None:
        p = np.array([self._distribution(u.weights) for u in updates])
        found = choose_clusters(p, self.options.max_clusters, self.options.min_silhouette,
                                seed=self.options.seed)
        self.clusters = {u.device_id: int(c) for u, c in zip(updates, found.labels, strict=True)}
        self.centroids = found.centroids
        self.summary = {"edge_clusters": found.k}
        log.info("clustered %d devices into %d clusters (silhouettes %s): %s", len(updates), found.k,
                 {k: round(v, 3) for k, v in found.silhouettes.items()}, self.clusters)

    # -- train: per cluster, projection stage, one model up ------------------------------
    def _aggregate(self, updates: list[ClientUpdate]) -> Weights:
        members: dict[int, list[ClientUpdate]] = {}
        for update in updates:
            members.setdefault(self._cluster_of(update), []).append(update)
        models = {c: weighted_average([(u.weights, u.num_samples) for u in group])
                  for c, group in members.items()}
        self.summary = {"edge_clusters": len(members), "edge_pairs": 0}
        if self.options.smashed_samples > 0 and len(members) > 1:
            self._projection_stage(models, members, updates)
        sizes = {c: sum(u.num_samples for u in group) for c, group in members.items()}
        return weighted_average([(models[c], sizes[c]) for c in sorted(models)])

    def _cluster_of(self, update: ClientUpdate) -> int:
        if update.device_id not in self.clusters:
            if self.centroids is None:  # no warm-up result: one cluster
                return 0
            cluster = int(nearest_centroid(self._distribution(update.weights), self.centroids)[0])
            self.clusters[update.device_id] = cluster
            log.info("device %s joins cluster %d", update.device_id, cluster)
        return self.clusters[update.device_id]

    def _projection_stage(self, models: dict[int, Weights], members: dict[int, list[ClientUpdate]],
                          updates: list[ClientUpdate]) -> None:
        """Tune the last linear layers of linked clusters in ``models`` (in place)."""
        task = self._require_task()
        weight_name, bias_name = final_linear(task.weights)
        heads = {}
        for c, group in members.items():
            smashed = [u.others[FEATURES] for u in group if FEATURES in u.others]
            if smashed:
                heads[c] = Head(models[c][weight_name], models[c][bias_name] if bias_name else None,
                                np.concatenate([s["x"] for s in smashed]),
                                np.concatenate([s["y"] for s in smashed]))
        pairs = select_pairs({c: self._distribution(models[c]) for c in heads},
                             np.array([self._distribution(u.weights) for u in updates]),
                             self.options.pair_threshold)
        if not pairs:
            return
        result = run_stage(heads, pairs, task.recipe, self.options.projection_lambda,
                           self.options.projection_epochs)
        for c, (weight, bias) in result.heads.items():
            models[c] = {**models[c], weight_name: weight}
            if bias_name:
                models[c][bias_name] = bias
        self.summary.update({
            "edge_pairs": len(pairs),
            "projection_loss_before": result.pair_loss_before,
            "projection_loss_after": result.pair_loss_after,
            "head_loss_before": result.head_loss_before,
            "head_loss_after": result.head_loss_after,
        })
        log.info("projection stage over pairs %s: pair loss %.4f -> %.4f, head loss %.4f -> %.4f", pairs,
                 result.pair_loss_before, result.pair_loss_after, result.head_loss_before,
                 result.head_loss_after)

    def _require_task(self) -> ForwardedTask:
        if self.task is None:
            raise RuntimeError("forward() a server task first")
        return self.task
