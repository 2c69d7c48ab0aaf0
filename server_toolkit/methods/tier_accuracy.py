"""``accuracy_tier_<tier>``: what each tier's devices can deploy, scored each round.

A heterogeneous method is worth its keep only if every tier ends with a better model than
the fleet would get by everybody training the smallest tier's model (``allsmall``). The
measure: for each tier of the devices the server has seen online, the accuracy on the
server's test set (plain, every sample weighing the same) of the model that tier's devices
can run now, as the method builds it (``Method.deployable``): the width window (HeteroFL,
FedRolex, FedDM), the depth prefix through the tier's last exit (DepthFL, HypeMeFed), the
compressed model (FedConv), the small or large model (RecipFL, ExclusiveFL, AllSmall), the
personal model (personalised methods: the mean over the tier's devices), the global model
(FedAvg and its kin: every tier alike). A method with ``deploys_ensemble`` (DepthFL) is
scored on the mean softmax of all the outputs of that model (its exits and final output). A
tier that predicts with several models together (``Method.deployable_members``: a width
method's ``deploy="nested"``, the windows of the fleet's tiers inside its own) is scored on the
mean softmax of their outputs.

Keys (decision): flat ``accuracy_tier_<tier>`` numbers in each ``metrics.jsonl`` row
(``accuracy_tier_1.0``, ``accuracy_tier_strong``; devices without a tier:
``accuracy_tier_default``), not a nested object, so the run report, ``fedsdk-server report``,
the dashboard's "per tier" chart, the CSV and the trackers take them as they take
``accuracy_exit1``. The same models on the devices' own held-back data (``--holdout``, each
device scoring the model it received before training, DepthFL's as the same ensemble, a nested
width deployment's with the same members, ``task.holdout_members``) are
``accuracy_holdout_tier_<tier>``
(``methods/holdout_accuracy.py``), one round behind these. A model whose weights leave out
BatchNorm running statistics (a device keeps them) has them re-estimated on ``BN_SAMPLES``
test samples first.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from .base import DeviceInfo, Weights

if TYPE_CHECKING:
    from .base import Method

TIER_KEY = "accuracy_tier_"
DEFAULT_TIER = "default"  # the key's tier for devices without one
BN_SAMPLES = 256


def tier_key(tier: str | None) -> str:
    """The metrics key of ``tier``'s deployable accuracy (``accuracy_tier_0.5``)."""
    return TIER_KEY + (DEFAULT_TIER if tier is None else str(tier))


class TierAccuracy:
    """The devices seen online, by tier; each tier's deployable accuracy (module docstring)."""

    def __init__(self) -> None:
        self.devices: dict[str, DeviceInfo] = {}

    def see(self, devices: Iterable[DeviceInfo]) -> None:
        """Remember ``devices`` with their final tiers (the newest tier of a device wins)."""
        self.devices.update({d.device_id: d for d in devices})

    def evaluate(self, method: Method, global_weights: Weights, x: np.ndarray, y: np.ndarray) -> dict:
        """{``accuracy_tier_<tier>``: accuracy} for every tier seen; a tier whose devices have
        no deployable model yet (a personal model never trained) is left out."""
        from .target_accuracy import _fingerprint  # imports torch: not at CLI start

        by_tier: dict[str | None, list[DeviceInfo]] = {}
        for device in sorted(self.devices.values(), key=lambda d: d.device_id):
            by_tier.setdefault(device.tier, []).append(device)
        ensemble = getattr(method, "deploys_ensemble", False)  # test doubles need not be Methods
        scored: dict[str, float] = {}  # fingerprint of (spec, weights) -> accuracy
        out = {}
        for tier, devices in sorted(by_tier.items(), key=lambda item: str(item[0])):
            values = []
            for device in devices if method.per_device_models else devices[:1]:
                members = deployable_members(method, global_weights, device)
                if not members:
                    continue
                key = "|".join(_fingerprint(spec, weights) for spec, weights in members)
                if key not in scored:
                    scored[key] = (model_accuracy(*members[0], x, y, ensemble=ensemble) if len(members) == 1
                                   else members_accuracy(members, x, y, ensemble=ensemble))
                values.append(scored[key])
            if values:
                out[tier_key(tier)] = float(np.mean(values))
        return out


def deployable_members(method: Method, global_weights: Weights,
                       device: DeviceInfo) -> list[tuple[dict, Weights]] | None:
    """The (spec, weights) of each model ``device``'s tier predicts with (``Method.deployable_members``;
    a test double without it: its ``deployable`` alone); None or [] when it has none yet."""
    if hasattr(method, "deployable_members"):
        return method.deployable_members(global_weights, device)
    found = method.deployable(global_weights, device)
    return None if found is None else [found]


def members_accuracy(members: list[tuple[dict, Weights]], x: np.ndarray, y: np.ndarray,
                     ensemble: bool = False, batch_size: int = 256) -> float:
    """Accuracy on (x, y) of the mean softmax of several models' outputs (each (spec, weights)
    as ``model_accuracy`` takes them; ``ensemble``: all outputs of each, else its final one)."""
    import torch

    with torch.no_grad():
        models = [_loaded_model(torch, spec, weights, x).eval() for spec, weights in members]
        correct = 0
        for start in range(0, len(y), batch_size):
            xb = torch.from_numpy(np.ascontiguousarray(x[start:start + batch_size], np.float32))
            probs = []
            for model in models:
                out = model(xb)
                outs = list(out) if isinstance(out, list | tuple) else [out]
                probs += [torch.softmax(o, dim=1) for o in (outs if ensemble else outs[-1:])]
            predicted = torch.stack(probs).mean(dim=0).argmax(1).numpy()
            correct += int((predicted == np.asarray(y[start:start + batch_size])).sum())
        return correct / max(len(y), 1)


def model_accuracy(spec: dict, weights: Weights, x: np.ndarray, y: np.ndarray,
                   ensemble: bool = False) -> float:
    """Accuracy of model ``spec`` with ``weights`` (its parameters, and its buffers unless a
    device keeps them) on (x, y) of shapes (N, C, H, W) and (N,); ``ensemble``: predicting
    with the mean softmax of all outputs, else the final one. Imports torch here, not at
    module level: the round loop imports this module and the CLI must start without torch."""
    import torch

    with torch.no_grad():
        return _model_accuracy(torch, spec, weights, x, y, ensemble)


def _model_accuracy(torch, spec: dict, weights: Weights, x: np.ndarray, y: np.ndarray,
                    ensemble: bool) -> float:
    from fedcore.torch_train import evaluate_model

    model = _loaded_model(torch, spec, weights, x)
    if ensemble:
        from ..models.exit_eval import ensemble_model_accuracy

        return ensemble_model_accuracy(model, x, y)
    return evaluate_model(model, x, y).accuracy


def _loaded_model(torch, spec: dict, weights: Weights, x: np.ndarray):
    """Model ``spec`` with ``weights``; running statistics a device keeps re-estimated on x."""
    from fedcore.torch_model import build_model

    from ..torch_utils import recalibrate_batchnorm

    model = build_model(spec, seed=0)
    own = {k for k in model.state_dict() if not k.endswith("num_batches_tracked")}
    params, given = {name for name, _ in model.named_parameters()}, set(weights)
    if not params <= given <= own:
        raise KeyError(f"deployable weights do not fit the model: missing {sorted(params - given)[:5]}, "
                       f"unexpected {sorted(given - own)[:5]}")
    model.load_state_dict({k: torch.from_numpy(np.array(v, np.float32)) for k, v in weights.items()},
                          strict=False)
    if own - set(weights):  # running statistics left on the devices: re-estimate them
        xt = torch.from_numpy(np.ascontiguousarray(x, np.float32))
        draw = torch.from_numpy(np.random.default_rng(0).choice(len(x), size=BN_SAMPLES))
        recalibrate_batchnorm(model, (xt[draw[s:s + 64]] for s in range(0, BN_SAMPLES, 64)))
    return model

