"""FedAvg per architecture group: the federated baseline of the personalised methods (seed 002).

Devices of the same architecture (tier, ``methods.hypernet.personalized``) form a group that
trains one model by FedAvg (sample-weighted average of the group's updates); groups never
exchange anything. In a homogeneous fleet this is plain FedAvg. BatchNorm running
statistics stay on the device (only parameters are averaged and sent). A device's
personal model is its group's model. Global weights = every group's parameters, as
``<architecture>/<name>``.
Options: the client recipe (``PersonalOptions``, ``methods.hypernet.personalized``;
``fedsdk-server methods show fedavg-groups``).
"""

from __future__ import annotations

from ...models.architectures import Architecture
from ...reconstruct.average import weighted_average
from ..base import ClientUpdate, Weights
from .personalized import StoredModelsMethod, pack_models, unpack_models


class FedAvgGroups(StoredModelsMethod):
    name = "fedavg-groups"
    family = "personalised"
    example = "--model lenet --tiers lenet,vgg8,resnet10,resnet12,resnet18"

    def model_key(self, device_id: str, arch: Architecture) -> str:
        return arch.name

    def aggregate_train(self, round_number: int, global_weights: Weights,
                        updates: list[ClientUpdate]) -> Weights:
        members: dict[str, list[tuple[Weights, float]]] = {}
        for u in updates:
            members.setdefault(u.instruction.context["architecture"], []).append((u.weights, u.num_samples))
        self.models = {**unpack_models(global_weights),
                       **{name: weighted_average(group) for name, group in members.items()}}
        return pack_models(self.models)
