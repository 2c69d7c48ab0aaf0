"""``--tiers`` and ``tier_map`` checked against what each method family reads a tier as
(``cli/tier_checks.py``), before anything starts."""

from __future__ import annotations

import click
import pytest

from server_toolkit.cli.tier_checks import check_tiers, model_outputs
from server_toolkit.methods import method_class


def check(method: str, tiers: list[str], options: dict | None = None, outputs: int | None = None,
          tier_map: dict | None = None, edges: bool = False) -> None:
    cls = method_class(method)
    check_tiers(cls, cls.Options.parse(cls.name, options or {}), tiers, edges, outputs, tier_map)


def test_the_multi_exit_model_has_three_outputs_and_a_plain_cnn_one():
    assert model_outputs("vgg_multi_exit", "digits") == 3
    assert model_outputs("vgg_multi_exit", "npz:/nowhere.npz") == 3  # a 28x28 stand-in input
    assert model_outputs("small_cnn", "digits") == 1
    assert model_outputs("pkg.mod:build", "digits") is None  # a user's model: checked in round 1


def test_width_tiers_given_to_an_exit_method_fail_naming_the_exit_counts():
    exits = r"hypemefed reads a tier as an exit count 1\.\.3; '1\.0' is not one"
    with pytest.raises(click.UsageError, match=exits):
        check("hypemefed", ["1.0", "0.5"], outputs=3)
    check("hypemefed", ["1", "2", "3"], outputs=3)


def test_an_exit_count_beyond_the_model_fails_and_named_exit_tiers_pass():
    with pytest.raises(click.UsageError, match="'4' is not one"):
        check("depthfl", ["1", "4"], outputs=3)
    with pytest.raises(click.UsageError, match="'0' is not one"):
        check("depthfl", ["0"], outputs=3)
    check("depthfl", ["phone", "2"], {"tier_exits": {"phone": 1}}, outputs=3)
    check("depthfl", ["9"])  # the model's outputs unknown: any count >= 1


def test_a_width_method_reads_ratios_and_its_named_tiers_only():
    check("heterofl", ["1.0", "0.25", "phone"], {"tier_ratios": {"phone": 0.5}})
    with pytest.raises(click.UsageError, match=r"'phnoe' is not one \(did you mean phone\?\)"):
        check("heterofl", ["phnoe"], {"tier_ratios": {"phone": 0.5}})
    with pytest.raises(click.UsageError, match="'1.5' is not one"):
        check("fedconv", ["1.0", "1.5"])


def test_a_tier_map_tier_is_checked_and_named_by_its_device():
    where = r"^tier_map\['dev002'\]: heterofl reads a tier as a width ratio"
    with pytest.raises(click.UsageError, match=where):
        check("heterofl", ["1.0"], tier_map={"dev001": "0.5", "dev002": "big"})


def test_a_personalised_method_reads_architecture_names():
    check("pfedhn", ["small_cnn", "lenet5", "small_cnn@0.5"])
    with pytest.raises(click.UsageError, match="did you mean lenet or lenet5"):
        check("mh-pfedhn", ["lenett"])


def test_resource_skew_tiers_with_no_strong_one_are_a_warning(capsys):
    check("recipfl", ["1.0", "0.5"])
    assert "none of 1.0, 0.5 is in strong_tiers (strong)" in capsys.readouterr().err
    check("recipfl", ["strong", "weak"])
    check("allsmall", ["big", "small"], {"strong_tiers": "big"})
    assert capsys.readouterr().err == ""
