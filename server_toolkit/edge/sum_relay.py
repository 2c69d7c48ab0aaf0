"""What a generic edge does with its group: the server's method, answered as a partial sum.

``SumRelay`` is the ``Method`` an edge's own round loop drives when the edge runs with
``--method M`` (any method whose aggregate is a weighted sum: ``methods/summands.py``).
Per server task the edge ``forward``s the global model it received; the relay builds M
over that model's spec with the server's recipe and options (once per spec) and, in the
group round, asks M to configure the group's devices exactly as the server would have
(their tiers from the edge's registry, the server's round number for round-dependent
windows such as FedRolex's); devices of several tiers behind one edge are fine. Its
``aggregate_train`` keeps the group's ``Partial`` and returns the group's mean: the edge
sends both up (``edge/partial.py``). A group member that is itself a generic edge gets
the global model and answers with its own partial (two levels or more).
"""

from __future__ import annotations

import json

from fedcore.recipe import Recipe

from ..methods import method_class
from ..methods.base import ClientUpdate, DeviceInfo, Method, TrainInstruction, Weights
from ..methods.summands import refusal
from .fold import configure, fold
from .partial import Partial


class SumRelay(Method):
    """See the module docstring. ``server_round``: set by the aggregator before each group round."""

    name = ""  # not a server method: only the edge process drives it
    folds_edges = True  # configure_train / aggregate_train handle the group's edges (edge/fold.py)

    def __init__(self, method: str, options: dict | None = None) -> None:
        super().__init__({}, Recipe())
        self.method_name = method_class(method).name  # ValueError for an unknown method
        self.method_options = dict(options or {})
        self.inner: Method | None = None
        self._key: str | None = None
        self.server_round = 0
        self.partial = Partial()

    def initial_weights(self, seed: int) -> Weights:
        """Nothing: every group round starts from the weights the server sent."""
        return {}

    def forward(self, spec: dict, recipe: Recipe, server_round: int, reports: dict | None = None) -> None:
        """The server's model and recipe for the next group round (ValueError: not relayable).
        ``reports``: the server task's outputs; the parameters of those the method asks for
        (label-histogram noise: ``label_counts``' epsilon and classes) go to the group's tasks,
        so each device noises its own histogram and the edge sums noised ones only."""
        key = json.dumps([spec, recipe.to_dict()], sort_keys=True)
        if key != self._key:
            inner = method_class(self.method_name)(spec, recipe, **self.method_options)
            reason = refusal(inner)
            if reason is not None:
                raise ValueError(f"a generic edge cannot relay this method: {reason}")
            self.inner, self._key = inner, key
            self.bounds_updates = inner.bounds_updates
        given = reports or {}
        self.asks = {name: dict(given.get(name) or params) for name, params in self.inner.asks.items()}
        self.server_round = server_round

    def configure_train(self, round_number: int, global_weights: Weights,
                        devices: list[DeviceInfo]) -> list[TrainInstruction]:
        return configure(self._require(), self.server_round, global_weights, devices)

    def aggregate_train(self, round_number: int, global_weights: Weights,
                        updates: list[ClientUpdate]) -> Weights:
        self.partial = fold(self._require(), global_weights, updates)
        return self.partial.finish(global_weights)

    def adopt(self, partial: Partial, global_weights: Weights) -> Weights:
        """Keep a group's partial summed elsewhere (a secure group round: ``edge/secure_group.py``)
        and return the group's mean."""
        self.partial = partial
        return partial.finish(global_weights)

    def _require(self) -> Method:
        if self.inner is None:
            raise RuntimeError("forward() a server task first")
        return self.inner
