"""Optional method abilities are declared and read in one place (methods/abilities.py)."""

from __future__ import annotations

from fedcore.recipe import Recipe
from server_toolkit.methods import method_class, methods
from server_toolkit.methods.abilities import (
    ASYNCHRONOUS,
    EDGE_SUMS,
    LABEL_NOISE,
    PERSONAL_MODELS,
    PRIVATE_AGGREGATION,
    SECURE_AGGREGATION,
    SERVER_DATA,
    TIER_PLANS,
    PersonalModels,
    abilities,
    has_personal_models,
    wants_server_data,
)
from server_toolkit.models.zoo import model_spec


def test_each_family_declares_what_it_can_do():
    assert SERVER_DATA in abilities(method_class("fedconv"))
    assert PERSONAL_MODELS in abilities(method_class("mh-pfedhn"))
    assert TIER_PLANS in abilities(method_class("heterofl"))
    assert abilities(method_class("fedavg")) == [EDGE_SUMS, ASYNCHRONOUS, PRIVATE_AGGREGATION,
                                                 SECURE_AGGREGATION]
    assert PRIVATE_AGGREGATION not in abilities(method_class("pfedhn"))
    assert LABEL_NOISE in abilities(method_class("recipfl"))
    personal = [name for name, cls in methods().items() if has_personal_models(cls)]
    assert {"pfedhn", "mh-pfedhn", "mh-pfedhngd", "local", "fedavg-groups"} <= set(personal)


def test_an_instance_answers_from_its_options():
    spec = model_spec("small_cnn", (1, 8, 8), 10)
    fedavg = method_class("fedavg")(spec, Recipe())
    assert not wants_server_data(fedavg) and not isinstance(fedavg, PersonalModels)
    local = method_class("local")(model_spec("lenet", (1, 8, 8), 10), Recipe())
    assert isinstance(local, PersonalModels)
