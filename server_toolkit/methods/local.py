"""Local training, no federation: the baseline of the personalised methods (seed 002).

Each device trains its own model (architecture from its tier, ``methods.personalized``)
from its own seeded initialisation and gets back exactly what it returned last round;
nothing is shared. The server only relays (a real deployment would keep the model on the
device). BatchNorm running statistics stay on the device, as for the hypernetworks.
Global weights = every device's parameters, as ``<device id>/<name>``.
"""

from __future__ import annotations

from sdk_device.runtimes.recipe import Recipe

from .base import ClientUpdate, DeviceInfo, TrainInstruction, Weights
from .personalized import PersonalizedMethod, fresh_parameters, pack_models, unpack_models


class Local(PersonalizedMethod):
    name = "local"

    def __init__(self, global_spec: dict, recipe: Recipe, **options) -> None:
        super().__init__(global_spec, recipe, **options)
        self.seed = 0
        self.models: dict[str, Weights] = {}

    def initial_weights(self, seed: int) -> Weights:
        self.seed, self.models = seed, {}
        return {}

    def configure_train(self, round_number: int, global_weights: Weights,
                        devices: list[DeviceInfo]) -> list[TrainInstruction]:
        self.models = unpack_models(global_weights)
        instructions = []
        for device in devices:
            arch = self.architecture_of(device)
            if device.device_id not in self.models:
                self.models[device.device_id] = fresh_parameters(arch, self.seed, device.device_id)
            instructions.append(TrainInstruction(device.device_id, arch.spec, self.models[device.device_id],
                                                 self.client_recipe, {"architecture": arch.name}))
        return instructions

    def aggregate_train(self, round_number: int, global_weights: Weights,
                        updates: list[ClientUpdate]) -> Weights:
        self.models = {**unpack_models(global_weights), **{u.device_id: u.weights for u in updates}}
        return pack_models(self.models)

    def personal_model(self, device_id: str):
        if device_id not in self.models:
            return None
        return self.architecture_named(self.architectures[device_id]), self.models[device_id]
