"""The model catalogue: every model ``--model`` (and a tier) can name, as a function from
(input_shape, num_classes) to a torchspec/1 spec.

Specs are plain JSON (see ``fedcore.modelspec``), so sub-model planners can cut them (fewer
channels, a depth prefix) and devices can rebuild them without code. The builders live in
``cnn`` (the basic zoo), ``hetero_zoo`` (the heterogeneous-fleet architectures) and
``multi_exit``; this module only names them.
"""

from __future__ import annotations

from collections.abc import Callable

from fedcore.modelspec import Shape

from .cnn import lenet5, resnet_small, small_cnn, vgg_multi_exit
from .hetero_zoo import ARCHITECTURES
from .multi_exit import MULTI_EXIT

__all__ = ["ZOO", "lenet5", "model_names", "model_spec", "resnet_small", "small_cnn", "vgg_multi_exit"]

ZOO: dict[str, Callable[..., dict]] = {
    "small_cnn": small_cnn,
    "lenet5": lenet5,
    "vgg_multi_exit": vgg_multi_exit,
    "resnet_small": resnet_small,
}


def _builders() -> dict[str, Callable[..., dict]]:
    return {**ZOO, **ARCHITECTURES, **MULTI_EXIT}


def model_names() -> list[str]:
    """Every model name, sorted (``NAME@R`` width cuts aside)."""
    return sorted(_builders())


def model_spec(name: str, input_shape: Shape, num_classes: int, **kwargs) -> dict:
    """The spec of zoo model ``name``; ValueError listing the zoo for an unknown name.

    ``NAME@R`` (e.g. ``small_cnn@0.25``) is model NAME with every hidden layer cut to a
    fraction R of its channels: the width sub-model HeteroFL gives a tier of ratio R (the
    model FedAvg-S trains)."""
    from ..byo.load import is_user_ref

    if is_user_ref(name):  # pkg.module:build or file.py[:build]: a user's nn.Module (byo/model.py)
        from ..byo.model import user_model_spec

        return user_model_spec(name, input_shape, num_classes)
    builders = _builders()
    base, cut, ratio = name.partition("@")
    if base not in builders:
        raise ValueError(f"unknown model {name!r}; the zoo has {', '.join(sorted(builders))} "
                         f"(NAME@R: NAME at width ratio R)")
    spec = builders[base](tuple(input_shape), num_classes, **kwargs)
    if not cut:
        return spec
    from ..submodels.width import width_layout

    try:
        width = float(ratio)
    except ValueError:
        raise ValueError(f"model {name!r}: the width after '@' must be a number in (0, 1]") from None
    return width_layout(spec).plan(width).spec
