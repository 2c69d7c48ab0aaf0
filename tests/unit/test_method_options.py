"""Typed method options: every method declares its options as a dataclass, parsed in one
place (``methods/options.py``) and shown by ``fedsdk-server methods show``."""

from __future__ import annotations

import dataclasses
import typing

import pytest
from click.testing import CliRunner

from fedcore.recipe import Recipe
from server_toolkit.cli import main as cli
from server_toolkit.methods import method_class, methods
from server_toolkit.methods.options import MethodOptions, OptionError, option
from server_toolkit.models.zoo import model_spec

SPEC = model_spec("small_cnn", (1, 8, 8), 10)
NAMES = sorted(methods())


@dataclasses.dataclass(frozen=True)
class Example(MethodOptions):
    epochs: int = option(5, "Local epochs.", minimum=0)
    lr: float = option(0.1, "Learning rate.")
    mode: str = option("fast", "How.", choices=("fast", "slow"))
    flag: bool = option(True, "A switch.")
    ratios: dict[str, float] = option({}, "Tier ratios.")
    rank: int | str | None = option(None, "A rank, 'full' or none.")


def test_options_convert_json_values_to_the_declared_types():
    parsed = Example.parse("m", {"lr": 1, "flag": "false", "ratios": {"a": 1}, "rank": "full"})
    assert parsed.lr == 1.0 and isinstance(parsed.lr, float)
    assert parsed.flag is False and parsed.ratios == {"a": 1.0} and parsed.rank == "full"
    assert Example.parse("m", {"rank": 3}).rank == 3 and Example.parse("m", {}).rank is None


@pytest.mark.parametrize("values, says", [
    ({"epochs": "five"}, "option epochs: expected int"),
    ({"epochs": 2.5}, "option epochs: expected int"),
    ({"epochs": True}, "option epochs: expected int"),
    ({"epochs": -1}, "option epochs: expected a number >= 0"),
    ({"mode": "medium"}, "option mode: expected one of 'fast', 'slow'"),
    ({"ratios": [1, 2]}, "option ratios: expected dict[str, float]"),
    ({"ratios": {"a": "big"}}, "option ratios: expected dict[str, float]"),
    ({"rank": 1.5}, "option rank: expected int | str | None"),
    ({"epoch": 3}, "has no option 'epoch'; its options: epochs, flag, lr, mode, rank, ratios"),
])
def test_a_bad_option_value_is_a_one_line_error_naming_the_option(values, says):
    with pytest.raises(OptionError) as caught:
        Example.parse("m", values)
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_mutable_defaults_are_not_shared_between_parses():
    first = Example.parse("m", {})
    first.ratios["x"] = 1.0
    assert Example.parse("m", {}).ratios == {}


@pytest.mark.parametrize("name", NAMES)
def test_every_method_declares_typed_documented_options(name):
    cls = method_class(name)
    assert issubclass(cls.Options, MethodOptions) and dataclasses.is_dataclass(cls.Options)
    hints = typing.get_type_hints(cls.Options)
    for field in dataclasses.fields(cls.Options):
        assert field.name in hints and field.metadata.get("help"), f"{name}.{field.name} has no type or help"
    defaults = cls.Options.parse(name, {})
    assert cls.Options.parse(name, defaults.as_dict()) == defaults  # every default is a valid value


@pytest.mark.parametrize("name", NAMES)
def test_every_method_refuses_an_option_it_does_not_have(name):
    with pytest.raises(OptionError, match=f"method {name!r} has no option 'no_such_option'"):
        method_class(name)(SPEC, Recipe(), no_such_option=1)


@pytest.mark.parametrize("name", NAMES)
def test_every_numeric_option_refuses_text(name):
    cls = method_class(name)
    hints = typing.get_type_hints(cls.Options)
    numeric = [f.name for f in dataclasses.fields(cls.Options) if hints[f.name] in (int, float, bool)]
    for key in numeric:
        with pytest.raises(OptionError, match=f"option {key}: expected"):
            cls.Options.parse(name, {key: "not-a-number"})


def test_fedconv_options_are_typed_and_shown_by_methods_show():
    rows = {row.name: row for row in method_class("fedconv").Options.describe()}
    assert len(rows) >= 20 and "tier_map" not in rows
    assert rows["compress_epochs"].type == "int" and rows["lr_max"].type == "float"
    assert "learned" in rows["aggregation"].help  # its choices are listed
    result = CliRunner().invoke(cli, ["methods", "show", "fedconv"], terminal_width=200)
    assert result.exit_code == 0, result.output
    for row in ("compress_epochs", "dilate_what", "kld_weight"):
        assert row in result.output
    assert "int" in result.output and "float" in result.output


def test_a_bad_method_option_on_the_command_line_is_one_clear_line(tmp_path):
    result = CliRunner().invoke(cli, ["simulate", "--method", "fedavgm", "--method-option", "beta=fast",
                                      "--rounds", "1", "--devices", "2", "--grid", "inprocess",
                                      "--run-dir", str(tmp_path / "run")])
    assert result.exit_code != 0
    assert "method 'fedavgm' option beta: expected float, got 'fast'" in result.output
    assert "Traceback" not in result.output
