"""FedAvg-S and FedAvg-L for exit-split (multi-exit) models, with HypeMeFed's device recipe.

* ``fedavg-s-exit``: every device trains the tier-1 prefix (through exit 1) whatever its
  tier; that prefix is the global model and is evaluated at its only exit. Its initial
  weights are the prefix of the full model's (same seed), so runs start alike.
* ``fedavg-l-exit``: every device trains the full multi-exit model (the upper bound that
  ignores device limits); evaluated at the final exit.

Both: sample-weighted FedAvg (the paper's baselines: no per-class classifier rows); recipe
options and defaults as ``depthfl`` (``ExitOptions``: Adam, ``client_lr`` 5e-4,
``client_batch_size`` 16, ``user_recipe``; ``fedsdk-server methods show fedavg-l-exit``).
"""

from __future__ import annotations

from fedcore.recipe import Recipe

from ...submodels.exit_split import name_map, parse_tier, prefix_spec
from ..base import DeviceInfo, Weights
from ..fedavg import FedAvg
from .depthfl import ExitOptions, exit_split_recipe


class FedAvgLargeExit(FedAvg):
    name = "fedavg-l-exit"
    family = "exit"
    example = "--model vgg_multi_exit"
    Options = ExitOptions
    options: ExitOptions

    def __init__(self, global_spec: dict, recipe: Recipe, **options) -> None:
        super().__init__(global_spec, recipe, **options)
        self.recipe = exit_split_recipe(recipe, self.options)

    def deployable(self, global_weights: Weights, device: DeviceInfo) -> tuple[dict, Weights]:
        """A tier-t device runs the full model's prefix through exit t (no tier: all of it)."""
        exits = parse_tier(device.tier, self.global_spec)
        names = name_map(self.global_spec, exits, list(global_weights))
        return prefix_spec(self.global_spec, exits), {sub: global_weights[g] for sub, g in names.items()}


class FedAvgShallowExit(FedAvgLargeExit):
    name = "fedavg-s-exit"
    family = "exit"
    example = "--model vgg_multi_exit"

    def __init__(self, global_spec: dict, recipe: Recipe, **options) -> None:
        super().__init__(prefix_spec(global_spec, 1), recipe, **options)
        self.full_spec = global_spec

    def initial_weights(self, seed: int) -> Weights:
        """The tier-1 prefix of the full model's seeded initial weights."""
        from fedcore.torch_model import build_model, state_numpy

        full = state_numpy(build_model(self.full_spec, seed=seed))
        return {sub: full[g] for sub, g in name_map(self.full_spec, 1, list(full)).items()}

    def deployable(self, global_weights: Weights, device: DeviceInfo) -> tuple[dict, Weights]:
        """Every tier runs the tier-1 prefix it trained."""
        return self.global_spec, global_weights
