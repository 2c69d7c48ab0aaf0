"""Names given on the command line that are not in their list (``cli/method_choice.py``):
the message names the closest choices ("did you mean …"), then the list."""

from __future__ import annotations

from click.testing import CliRunner

from server_toolkit.cli import main
from server_toolkit.cli.method_choice import close_choices, did_you_mean, unknown_choice

METHODS = ["allsmall", "depthfl", "fedavg", "fedavg-groups", "fedavgm", "fedconv", "feddm", "fedprox",
           "fedrolex", "heterofl", "hypemefed", "mh-pfedhn", "pfedhn", "recipfl"]


def test_a_misspelt_method_is_matched_to_the_method_it_resembles():
    assert close_choices("hetrofl", METHODS) == ["heterofl"]
    assert close_choices("HeteroFL", METHODS) == ["heterofl"]  # case does not matter
    assert close_choices("mh_pfedhn", METHODS)[0] == "mh-pfedhn"  # nor - against _
    assert close_choices("fedavgg", METHODS)[:2] == ["fedavg", "fedavgm"]


def test_a_name_like_no_choice_gets_no_suggestion():
    assert close_choices("xgboost", METHODS) == []
    assert did_you_mean("xgboost", METHODS) == ""
    assert unknown_choice("--method", "xgboost", ["a", "b"]) == "unknown --method 'xgboost'; one of: a, b"


def test_the_message_puts_the_suggestion_before_the_full_list():
    text = unknown_choice("--method", "hetrofl", METHODS, more=" (`fedsdk-server methods list`)")
    assert text.startswith("unknown --method 'hetrofl' (did you mean heterofl?); one of: allsmall, ")
    assert text.endswith("recipfl (`fedsdk-server methods list`)")
    assert "\n" not in text


def test_methods_show_and_datasets_verify_suggest_the_name_meant():
    runner = CliRunner()
    shown = runner.invoke(main, ["methods", "show", "hypmefed"])
    assert shown.exit_code == 1
    assert "unknown method 'hypmefed' (did you mean hypemefed?)" in shown.output
    verified = runner.invoke(main, ["datasets", "verify", "fasion_mnist"])
    assert verified.exit_code == 1
    assert "unknown dataset 'fasion_mnist' (did you mean fashion_mnist" in verified.output
