"""AllSmall (RecipFL's baseline): FedAvg of the small model on every device, strong or weak.

The global model is the small architecture (see ``strong_weak``); strong devices train it
like weak ones, so they never benefit from their capacity (and their "target model" is
the small one). Options: ``small_model`` (default "width:0.25"); ``strong_tiers`` is
accepted for symmetry with the other resource-skew methods and ignored.
"""

from __future__ import annotations

from fedcore.recipe import Recipe

from .fedavg import FedAvg
from .strong_weak import strong_weak


class AllSmall(FedAvg):
    name = "allsmall"
    family = "resource-skew"
    example = ("--model lenet5 --devices 6 --partition quantity-skew --num-strong 1 "
               "--tiers strong,weak,weak,weak,weak,weak --method-option small_model=width:0.3")

    def __init__(self, global_spec: dict, recipe: Recipe, small_model: str | dict = "width:0.25",
                 strong_tiers: str | list[str] = "strong") -> None:
        super().__init__(strong_weak(global_spec, small_model, strong_tiers).small, recipe)
