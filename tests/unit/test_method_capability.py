"""One declared capability (``Method.weighted_sum``, methods/capability.py) decides which methods
edges, async, DP / robust aggregation and secure aggregation accept; the table below is what
main accepted before the capability existed (edges by ``summands.refusal``, async by
``Method.asynchronous``, privacy by class checks, secagg by a table of method ids)."""

from __future__ import annotations

import pytest

from fedcore.recipe import Recipe
from server_toolkit.methods import methods
from server_toolkit.methods.abilities import async_refusal
from server_toolkit.methods.base import Method
from server_toolkit.methods.capability import FULL, WeightedSum, weighted_sum
from server_toolkit.methods.fedavg import FedAvg
from server_toolkit.methods.summands import refusal as edge_refusal
from server_toolkit.models.zoo import model_spec, vgg_multi_exit
from server_toolkit.privacy.settings import PrivacySettings
from server_toolkit.privacy.windows import refusal as privacy_refusal
from server_toolkit.secagg.aggregate import refusal as secagg_refusal

SMALL = model_spec("small_cnn", (1, 8, 8), 10)
EXITS = vgg_multi_exit((1, 8, 8), 10, channels=(4, 8, 8, 16))

# method id -> (declared layout, edges, async, privacy, secagg), as main accepted them
ON_MAIN = {
    "allsmall": ("full", True, True, True, False),
    "alone": (None, False, False, False, False),  # (later: a control; one FedAvg per tier, not one sum)
    "depthfl": ("present", True, True, False, True),
    "exclusivefl": (None, False, False, False, False),
    "fedavg": ("full", True, True, True, True),
    "fedavg-groups": (None, False, False, False, False),
    "fedavg-l-exit": ("full", True, True, True, True),
    "fedavg-s-exit": ("full", True, True, True, True),
    "fedavgm": ("full", False, True, False, True),
    "fedconv": (None, False, False, False, False),
    "feddm": (None, False, False, False, False),
    "fedprox": ("full", True, True, True, True),
    "fedrolex": ("window", True, True, True, True),
    "heterofl": ("window", True, True, True, True),
    "hypemefed": (None, False, False, False, False),
    "local": (None, False, False, False, False),
    "mh-pfedhn": (None, False, False, False, False),
    "mh-pfedhngd": (None, False, False, False, False),
    "pfedhn": (None, False, False, False, False),
    "recipfl": (None, False, False, False, False),
}


def _built_in() -> dict[str, type[Method]]:
    return {name: cls for name, cls in methods().items() if cls.__module__.startswith("server_toolkit.")}


def _instance(cls: type[Method], **options) -> Method:
    try:
        return cls(SMALL, Recipe(), **options)
    except ValueError:  # the exit methods need a multi-exit model
        return cls(EXITS, Recipe(), **options)


def _accepted_by_dp(cls: type[Method]) -> bool:
    try:
        PrivacySettings(clip=1.0, noise_multiplier=0.5).check(cls)
    except ValueError as exc:
        assert "not supported by" in str(exc)
        return False
    return True


def test_every_registered_method_declares_the_capability_and_each_feature_accepts_what_it_did_on_main():
    assert set(_built_in()) == set(ON_MAIN)  # a new method: add its row
    got = {}
    for name, cls in sorted(_built_in().items()):
        declared = weighted_sum(cls)
        got[name] = (declared.layout if declared else None, edge_refusal(_instance(cls)) is None,
                     async_refusal(cls) is None, privacy_refusal(cls) is None, secagg_refusal(cls) is None)
        assert _accepted_by_dp(cls) == got[name][3], name
    assert got == ON_MAIN


def test_an_instance_answers_from_its_options_hypemefed_without_hypernetworks_is_a_sum_for_edges():
    hypemefed = methods()["hypemefed"]
    assert edge_refusal(_instance(hypemefed)) is not None
    assert "hypernet=none" in edge_refusal(_instance(hypemefed))
    assert edge_refusal(_instance(hypemefed, hypernet="none")) is None
    assert secagg_refusal(hypemefed) is not None  # class-level checks read the class's declaration


def test_a_subclass_that_overrides_the_aggregate_without_declaring_again_is_not_a_sum():
    class Median(FedAvg):
        name = ""

        def aggregate_train(self, round_number, global_weights, updates):
            return updates[0].weights

    assert weighted_sum(FedAvg) is not None and weighted_sum(Median) is None
    assert "rule of its own" in edge_refusal(Median(SMALL, Recipe()))


def test_a_method_outside_the_fedavg_family_that_declares_the_capability_gets_every_feature():
    class Mine(Method):
        name = ""  # not registered: the other tests see the package's methods only
        weighted_sum = WeightedSum(FULL)

        def configure_train(self, round_number, global_weights, devices):
            return []

        def aggregate_train(self, round_number, global_weights, updates):
            return global_weights

    assert not issubclass(Mine, FedAvg)
    for check in (edge_refusal(Mine(SMALL, Recipe())), async_refusal(Mine), privacy_refusal(Mine),
                  secagg_refusal(Mine)):
        assert check is None
    assert _accepted_by_dp(Mine)


def test_a_declaration_names_a_known_layout():
    with pytest.raises(ValueError, match="layout must be one of"):
        WeightedSum("diagonal")
