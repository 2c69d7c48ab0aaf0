"""The common frame of personalised methods for model-heterogeneous fleets (pFedHN,
MH-pFedHN, MH-pFedHNGD and their baselines Local and FedAvg per architecture).

Every device has its own model; its architecture comes from its tier (``models.architectures``):
the device's tier (``DeviceInfo.tier``: its fleet tier, ``--tiers`` in simulate, else its
profile's ``tier``, with the run's ``tier_map`` overrides applied by the round loop;
``methods/tiers.py``); none: the server's ``--model``. A device keeps the architecture of
its first round.

Options (``--method-option``; ``fedsdk-server methods show NAME`` lists them with types and
defaults): ``PersonalOptions`` here, the hypernetworks add theirs (``hypernetwork``).

Client recipe: the user's (``--lr``, ``--local-epochs``, ``--batch-size``, ``--optimizer``),
as for every other method. ``user_recipe=false`` hands out the paper's instead: SGD lr
``client_lr`` (1e-3), momentum ``client_momentum`` (0.9), weight decay
``client_weight_decay`` (1e-4), ``client_epochs`` (2) epochs, batch ``client_batch_size``
(64). Decision (measured): the paper's recipe was the default until it was shown to leave
``simulate`` at chance — on devices holding a few hundred samples it makes 2-6 SGD steps of
lr 1e-3 per round, so a generated model stays the constant predictor it starts as (digits,
4 devices, 10 rounds: MH-pFedHN 0.100, pFedHN 0.101, MH-pFedHNGD 0.102; with the user's
recipe and ``hn_lr`` 1e-2: 0.956, 0.962, 0.939). The paper's setting has ~1,000 samples per
client, batch 64 and thousands of rounds.

Evaluation. There is no single global model, so ``evaluate`` measures every device's
*personal* model (the one the method would send it now) on the server's test set,
re-weighted to the device's label distribution (the ``label_counts`` its results report):
accuracy_i = sum_c p_i(c) * accuracy on the test samples of class c. A model with
BatchNorm is evaluated with statistics re-estimated on a resample of the test set that
follows p_i, because its running statistics never leave the device (see
``models.personal_eval``). Reported: ``accuracy`` (mean over devices), ``accuracy_min``,
``accuracy_<architecture>`` (mean per architecture) and ``personal_devices``. Before any
device reported its label counts the test set is used as it is.
"""

from __future__ import annotations

import dataclasses
from abc import abstractmethod
from dataclasses import dataclass

import numpy as np

from fedcore.recipe import Recipe

from ...models.architectures import Architecture, architecture, from_spec
from ...models.personal_eval import label_weighted_accuracy
from ..base import ClientUpdate, DeviceInfo, Method, TrainInstruction, Weights, label_histogram
from ..options import MethodOptions, option


def paper_recipe(recipe: Recipe, lr: float, momentum: float, weight_decay: float, epochs: int,
                 batch_size: int, user_recipe: bool) -> Recipe:
    """The recipe devices get: the user's unchanged, or SGD with the given settings."""
    if user_recipe:
        return recipe
    return dataclasses.replace(recipe, optimizer="sgd", lr=float(lr), momentum=float(momentum),
                               weight_decay=float(weight_decay), epochs=int(epochs),
                               batch_size=int(batch_size))


def pack_models(models: dict[str, Weights]) -> Weights:
    """{key: {name: array}} -> {"key/name": array}: many models as one checkpointable dict
    (keys are device ids or architecture names, which never contain "/")."""
    return {f"{key}/{name}": value for key, weights in models.items() for name, value in weights.items()}


def unpack_models(weights: Weights) -> dict[str, Weights]:
    """The inverse of ``pack_models``."""
    models: dict[str, Weights] = {}
    for packed, value in weights.items():
        key, _, name = packed.partition("/")
        models.setdefault(key, {})[name] = value
    return models


def fresh_parameters(arch: Architecture, seed: int, key: str) -> Weights:
    """Freshly initialised parameters (no buffers) of ``arch``, seeded by (seed, key)."""
    import zlib

    from fedcore.torch_model import build_model

    model = build_model(arch.spec, seed=seed * 1_000_003 + zlib.crc32(key.encode()))
    return {name: p.detach().numpy().copy() for name, p in model.named_parameters()}


@dataclass(frozen=True)
class PersonalOptions(MethodOptions):
    """The client recipe of every personalised method (see the module docstring)."""

    client_lr: float = option(1e-3, "SGD learning rate per step of the paper's client recipe "
                              "(used only with user_recipe=false).", minimum=0.0)
    client_momentum: float = option(0.9, "SGD momentum of the paper's client recipe "
                                    "(used only with user_recipe=false).", minimum=0.0)
    client_weight_decay: float = option(1e-4, "L2 weight decay of the paper's client recipe "
                                        "(used only with user_recipe=false).", minimum=0.0)
    client_epochs: int = option(2, "Local epochs per round of the paper's client recipe "
                                "(used only with user_recipe=false).", minimum=1)
    client_batch_size: int = option(64, "Batch size in samples of the paper's client recipe "
                                    "(used only with user_recipe=false).", minimum=1)
    user_recipe: bool = option(True, "true: devices train with the user's recipe (--lr, --local-epochs, "
                               "--batch-size, --optimizer); false: with the paper's SGD (the client_* "
                               "options).")


class PersonalizedMethod(Method):
    """Base of the methods with one model per device; see the module docstring.

    Subclasses implement ``configure_train``, ``aggregate_train`` and ``personal_model``.
    """

    asks = {"label_counts": {}}  # each device's label distribution weights its evaluation
    per_device_models = True
    Options = PersonalOptions
    options: PersonalOptions

    def __init__(self, global_spec: dict, recipe: Recipe, **options) -> None:
        super().__init__(global_spec, recipe, **options)
        o = self.options
        self.client_recipe = paper_recipe(recipe, o.client_lr, o.client_momentum, o.client_weight_decay,
                                          o.client_epochs, o.client_batch_size, o.user_recipe)
        self.default_architecture = from_spec("model", global_spec)
        self.label_counts: dict[str, list[int]] = {}
        self.architectures: dict[str, str] = {}  # device id -> tier of every device seen

    # -- architectures -------------------------------------------------------------------
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.global_spec["input_shape"])

    def num_classes(self) -> int:
        return int(self.global_spec["num_classes"])

    def tier_of(self, device: DeviceInfo) -> str | None:
        """The tier naming ``device``'s architecture (``DeviceInfo.tier``, final; see the module
        docstring), or None."""
        return device.tier

    def architecture_of(self, device: DeviceInfo) -> Architecture:
        """``device``'s architecture, remembered from its first round on (ValueError for an
        unknown tier)."""
        if device.device_id not in self.architectures:
            self.architectures[device.device_id] = self.tier_of(device) or ""
        return self.architecture_named(self.architectures[device.device_id])

    def architecture_named(self, tier: str) -> Architecture:
        """The architecture of a tier name ("" = the server's ``--model``)."""
        if not tier:
            return self.default_architecture
        return architecture(tier, self.input_shape(), self.num_classes())

    # -- personal models -----------------------------------------------------------------
    @abstractmethod
    def personal_model(self, device_id: str) -> tuple[Architecture, Weights] | None:
        """The parameters (no device-local buffers) the method would send ``device_id`` now,
        or None for a device it has never seen."""

    def deployable(self, global_weights: Weights, device: DeviceInfo) -> tuple[dict, Weights] | None:
        """``device``'s personal model (its BatchNorm statistics stay on the device)."""
        found = self.personal_model(device.device_id)
        return None if found is None else (found[0].spec, found[1])

    def aggregate_evaluate(self, round_number: int, updates: list[ClientUpdate]) -> dict:
        """The devices' reported metrics; remembers each device's label counts."""
        for update in updates:
            counts = label_histogram(update.metrics.get("label_counts"), self.num_classes())
            if counts is not None and counts.sum() > 0:
                self.label_counts[update.device_id] = [int(c) for c in counts]
        return super().aggregate_evaluate(round_number, updates)

    def evaluate(self, global_weights: Weights, x: np.ndarray, y: np.ndarray) -> dict:
        """Personal accuracy of every device seen so far (see the module docstring)."""
        per_device: dict[str, float] = {}
        per_arch: dict[str, list[float]] = {}
        for device_id in sorted(self.architectures):
            found = self.personal_model(device_id)
            if found is None:
                continue
            arch, params = found
            accuracy = label_weighted_accuracy(arch, params, x, y, self.label_counts.get(device_id))
            per_device[device_id] = accuracy
            per_arch.setdefault(arch.name, []).append(accuracy)
        if not per_device:
            return {}
        values = list(per_device.values())
        out = {"accuracy": float(np.mean(values)), "accuracy_min": float(np.min(values)),
               "personal_devices": len(values)}
        if len(per_arch) > 1:
            out.update({f"accuracy_{name}": float(np.mean(v)) for name, v in sorted(per_arch.items())})
        return out

    def state_dict(self) -> dict:
        return {"architectures": dict(self.architectures), "label_counts": dict(self.label_counts)}

    def load_state_dict(self, state: dict) -> None:
        self.architectures.update({str(k): str(v) for k, v in state.get("architectures", {}).items()})
        self.label_counts.update({str(k): list(v) for k, v in state.get("label_counts", {}).items()})


class StoredModelsMethod(PersonalizedMethod):
    """Base of the baselines that keep models on the server under a key (``model_key``:
    the device for Local, the architecture for FedAvg per group), created fresh (seeded by
    the key) on first use; global weights = every model, packed (``pack_models``)."""

    def __init__(self, global_spec: dict, recipe: Recipe, **options) -> None:
        super().__init__(global_spec, recipe, **options)
        self.seed = 0
        self.models: dict[str, Weights] = {}

    @abstractmethod
    def model_key(self, device_id: str, arch: Architecture) -> str:
        """Under which key the model ``device_id`` trains is kept."""

    def initial_weights(self, seed: int) -> Weights:
        self.seed, self.models = seed, {}
        return {}

    def configure_train(self, round_number: int, global_weights: Weights,
                        devices: list[DeviceInfo]) -> list[TrainInstruction]:
        self.models = unpack_models(global_weights)
        instructions = []
        for device in devices:
            arch = self.architecture_of(device)
            key = self.model_key(device.device_id, arch)
            if key not in self.models:
                self.models[key] = fresh_parameters(arch, self.seed, key)
            instructions.append(TrainInstruction(device.device_id, arch.spec, self.models[key],
                                                 self.client_recipe, {"architecture": arch.name}))
        return instructions

    def personal_model(self, device_id: str) -> tuple[Architecture, Weights] | None:
        if device_id not in self.architectures:
            return None
        arch = self.architecture_named(self.architectures[device_id])
        key = self.model_key(device_id, arch)
        return (arch, self.models[key]) if key in self.models else None
