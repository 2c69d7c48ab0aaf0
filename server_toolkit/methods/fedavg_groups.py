"""FedAvg per architecture group: the federated baseline of the personalised methods (seed 002).

Devices of the same architecture (tier, ``methods.personalized``) form a group that
trains one model by FedAvg (sample-weighted average of the group's updates); groups never
exchange anything. In a homogeneous fleet this is plain FedAvg. BatchNorm running
statistics stay on the device (only parameters are averaged and sent). A device's
personal model is its group's model. Global weights = every group's parameters, as
``<architecture>/<name>``.
"""

from __future__ import annotations

from sdk_device.runtimes.recipe import Recipe

from ..reconstruct.average import weighted_average
from .base import ClientUpdate, DeviceInfo, TrainInstruction, Weights
from .personalized import PersonalizedMethod, fresh_parameters, pack_models, unpack_models


class FedAvgGroups(PersonalizedMethod):
    name = "fedavg_groups"

    def __init__(self, global_spec: dict, recipe: Recipe, **options) -> None:
        super().__init__(global_spec, recipe, **options)
        self.seed = 0
        self.groups: dict[str, Weights] = {}

    def initial_weights(self, seed: int) -> Weights:
        self.seed, self.groups = seed, {}
        return {}

    def configure_train(self, round_number: int, global_weights: Weights,
                        devices: list[DeviceInfo]) -> list[TrainInstruction]:
        self.groups = unpack_models(global_weights)
        instructions = []
        for device in devices:
            arch = self.architecture_of(device)
            if arch.name not in self.groups:
                self.groups[arch.name] = fresh_parameters(arch, self.seed, arch.name)
            instructions.append(TrainInstruction(device.device_id, arch.spec, self.groups[arch.name],
                                                 self.client_recipe, {"architecture": arch.name}))
        return instructions

    def aggregate_train(self, round_number: int, global_weights: Weights,
                        updates: list[ClientUpdate]) -> Weights:
        members: dict[str, list[tuple[Weights, float]]] = {}
        for u in updates:
            members.setdefault(u.instruction.index_map["architecture"], []).append((u.weights, u.num_samples))
        self.groups = {**unpack_models(global_weights),
                       **{name: weighted_average(group) for name, group in members.items()}}
        return pack_models(self.groups)

    def personal_model(self, device_id: str):
        arch = self.architecture_named(self.architectures.get(device_id, ""))
        if device_id not in self.architectures or arch.name not in self.groups:
            return None
        return arch, self.groups[arch.name]
