"""Local training, no federation: the baseline of the personalised methods (seed 002).

Each device trains its own model (architecture from its tier, ``methods.hypernet.personalized``)
from its own seeded initialisation and gets back exactly what it returned last round;
nothing is shared. The server only relays (a real deployment would keep the model on the
device). BatchNorm running statistics stay on the device, as for the hypernetworks.
Global weights = every device's parameters, as ``<device id>/<name>``.
Options: the client recipe (``PersonalOptions``, ``methods.hypernet.personalized``;
``fedsdk-server methods show local``).
"""

from __future__ import annotations

from ...models.architectures import Architecture
from ..base import ClientUpdate, Weights
from .personalized import StoredModelsMethod, pack_models, unpack_models


class Local(StoredModelsMethod):
    name = "local"
    family = "personalised"
    example = "--model lenet --tiers lenet,vgg8,resnet10,resnet12,resnet18"

    def model_key(self, device_id: str, arch: Architecture) -> str:
        return device_id

    def aggregate_train(self, round_number: int, global_weights: Weights,
                        updates: list[ClientUpdate]) -> Weights:
        self.models = {**unpack_models(global_weights), **{u.device_id: u.weights for u in updates}}
        return pack_models(self.models)
