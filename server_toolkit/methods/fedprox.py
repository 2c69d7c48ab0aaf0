"""FedProx (Li et al., MLSys 2020): FedAvg whose devices add a proximal term.

Each device minimises its loss + mu/2 * ||w - w_global||^2: the task's recipe carries
``prox_mu`` = mu, and every training runtime adds mu * (w - w_start) to the gradients
(``fedcore.recipe.Recipe``). Aggregation is FedAvg's sample-weighted mean.

Option (``--method-option``): ``mu`` (0.01; the paper tunes it over 0.001-1). Decision: the
paper's other half, accepting partial work from stragglers, is the round loop's quorum and
deadline here (``--clients-per-round``, ``--round-timeout``), not a method option.
"""

from __future__ import annotations

import dataclasses

from fedcore.recipe import Recipe

from .fedavg import FedAvg
from .options import MethodOptions, option


@dataclasses.dataclass(frozen=True)
class FedProxOptions(MethodOptions):
    mu: float = option(0.01, "Weight of the proximal term mu/2 * ||w - w_global||^2.", minimum=0.0)


class FedProx(FedAvg):
    name = "fedprox"
    example = "--method-option mu=0.01"
    Options = FedProxOptions
    options: FedProxOptions

    def __init__(self, global_spec: dict, recipe: Recipe, **options) -> None:
        super().__init__(global_spec, recipe, **options)
        self.mu = self.options.mu
        self.recipe = dataclasses.replace(self.recipe, prox_mu=self.mu)
