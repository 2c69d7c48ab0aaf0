"""Resource-skew fleets (RecipFL's setting): a few strong devices and many weak ones.

Roles. A device is *strong* when its tier (``--tiers`` in simulate, else the ``tier`` key of
its profile) is one of ``strong_tiers`` (default "strong"); every other device is *weak*.
With ``--partition quantity-skew --num-strong N`` the strong devices are dev000..dev(N-1),
so give those the tier "strong": ``--tiers strong,weak,weak,...`` (one name per device).

Architectures. A strong device can run the *large* model, the method's global spec
(``--model``); weak devices run the *small* one, set by ``small_model``:

* ``"width:<r>"`` (default ``"width:0.25"``): the global model with every hidden layer cut
  to ``ceil(r * C)`` of its C channels, which is exactly HeteroFL's sub-model of ratio r,
  so width-scaled baselines train the same small architecture;
* a zoo model name (``small_cnn``, ``lenet5``, ...), built for the same input and classes;
* a torchspec/1 spec (a dict, from Python), with the global model's input and classes.

Both are options of every method of the family (``StrongWeakOptions``; ``fedsdk-server
methods show recipfl`` lists them with the rest).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from fedcore import modelspec

from ...models.zoo import model_spec
from ...submodels.width import width_layout
from ..base import DeviceInfo
from ..options import MethodOptions, option

STRONG, WEAK = "strong", "weak"


@dataclass(frozen=True)
class StrongWeakOptions(MethodOptions):
    """The options of every resource-skew method (RecipFL, AllSmall, ExclusiveFL)."""

    small_model: str | dict = option("width:0.25", "The weak devices' model: \"width:<r>\" (every hidden "
                                     "layer cut to ceil(r*C) channels), a zoo model name, or a spec "
                                     "(Python).")
    strong_tiers: str | list[str] = option(STRONG, "Tiers whose devices are strong (run the large model): "
                                           "a name, comma-separated names or a list.")


@dataclass(frozen=True)
class StrongWeak:
    """The two architectures of a resource-skew fleet and which tiers are strong."""

    large: dict
    small: dict
    strong_tiers: frozenset[str]

    def is_strong(self, device: DeviceInfo) -> bool:
        return device.tier in self.strong_tiers

    def role(self, device: DeviceInfo) -> str:
        return STRONG if self.is_strong(device) else WEAK

    @cached_property
    def _tensors(self) -> dict[str, tuple[dict[str, tuple[int, ...]], set[str]]]:
        """model -> (shape of every tensor, names of the learnable ones)."""
        return {"large": model_tensors(self.large), "small": model_tensors(self.small)}

    def model_of(self, weights: dict[str, np.ndarray]) -> str:
        """"large" or "small": which architecture ``weights`` belong to, by their shapes (so
        updates re-planned after a restart are placed right too). Buffers may be missing
        (device-local BatchNorm statistics); ValueError if neither model fits."""
        for model, (shapes, learnable) in self._tensors.items():
            if learnable <= set(weights) and all(shapes.get(name) == tuple(value.shape)
                                                 for name, value in weights.items()):
                return model
        raise ValueError("these weights fit neither the large nor the small model")


def model_tensors(spec: dict) -> tuple[dict[str, tuple[int, ...]], set[str]]:
    """(name -> shape of every tensor ``state_numpy`` gives, names of the parameters)."""
    from fedcore.torch_model import build_model

    model = build_model(spec)
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()
              if not name.endswith("num_batches_tracked")}
    return shapes, {name for name, _ in model.named_parameters()}


def small_spec(global_spec: dict, small_model: str | dict) -> dict:
    """The small architecture named by ``small_model`` (see the module docstring)."""
    if isinstance(small_model, dict):
        modelspec.validate(small_model)
        if (small_model["input_shape"], small_model["num_classes"]) != (global_spec["input_shape"],
                                                                        global_spec["num_classes"]):
            raise ValueError("the small model must take the global model's input and classes")
        return small_model
    if small_model.startswith("width:"):
        try:
            ratio = float(small_model.split(":", 1)[1])
        except ValueError:
            raise ValueError(f"small_model {small_model!r}: expected width:<ratio>") from None
        if not 0 < ratio <= 1:
            raise ValueError(f"small_model {small_model!r}: the ratio must be in (0, 1]")
        return width_layout(global_spec).plan(ratio).spec
    return model_spec(small_model, global_spec["input_shape"], global_spec["num_classes"])


def strong_weak(global_spec: dict, small_model: str | dict = "width:0.25",
                strong_tiers: str | list[str] = STRONG) -> StrongWeak:
    """Build the fleet description from a method's options (``StrongWeakOptions``;
    ``strong_tiers``: a name, a comma-separated list or a list)."""
    names = strong_tiers.split(",") if isinstance(strong_tiers, str) else list(strong_tiers)
    return StrongWeak(global_spec, small_spec(global_spec, small_model),
                      frozenset(n.strip() for n in names if n.strip()))


def evaluate_spec(spec: dict, weights: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray,
                  calibrate_bn: bool = False) -> dict:
    """Accuracy and mean CE of the model ``spec`` with ``weights`` on (x, y).
    ``calibrate_bn``: first re-estimate BatchNorm running statistics from ``x`` (one pass in
    training mode, cumulative averages), for models whose statistics stayed on the devices."""
    from fedcore.torch_model import build_model, load_numpy
    from fedcore.torch_train import evaluate_model

    from ...torch_utils import input_batches, recalibrate_batchnorm

    model = build_model(spec)
    load_numpy(model, weights)
    if calibrate_bn:
        recalibrate_batchnorm(model, input_batches(x))
    stats = evaluate_model(model, x, y)
    return {"accuracy": stats.accuracy, "loss": stats.loss}
