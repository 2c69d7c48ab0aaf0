"""``--config FILE``: options of ``simulate`` / ``run`` from a TOML file; flags override it.

Without ``--config``, ``./fedsdk.toml`` is read when it exists, else ``[tool.fedsdk]`` of
``./pyproject.toml``. Decisions: one table per command (``[simulate]``, ``[run]``; in
pyproject ``[tool.fedsdk.simulate]``), keys spelled as the flags (``local-epochs``; snake_case
works too); ``tiers`` may be a list, ``method-option`` a table (``{mu = 0.01}``). An unknown
table or key is a one-line error naming it. Values become click's ``default_map``, so they go
through the same types and checks as flags, and ``config.json`` in the run directory is the
resolved configuration."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import click

COMMANDS = ("simulate", "run")


def config_option(f):
    """The ``--config`` option (eager: read before the other options take their defaults)."""
    return click.option(
        "--config", "config_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
        is_eager=True, expose_value=False, callback=_apply,
        help="Options from this TOML file ([simulate] / [run] tables; flags win). Default: ./fedsdk.toml, "
        "else [tool.fedsdk] of ./pyproject.toml, when there.")(f)


def find_config(given: Path | None) -> tuple[Path, dict] | None:
    """(file, its fedsdk tables): ``given``, else ./fedsdk.toml, else ./pyproject.toml's [tool.fedsdk]."""
    if given is not None:
        if not given.is_file():
            raise click.UsageError(f"--config {given}: no such file")
        return given, _tables(given)
    if Path("fedsdk.toml").is_file():
        return Path("fedsdk.toml"), _tables(Path("fedsdk.toml"))
    if Path("pyproject.toml").is_file():
        tables = _read(Path("pyproject.toml")).get("tool", {}).get("fedsdk")
        if tables is not None:
            return Path("pyproject.toml"), tables
    return None


def _read(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise click.UsageError(f"{path} is not valid TOML: {exc}") from None


def _tables(path: Path) -> dict:
    return _read(path) if path.name != "pyproject.toml" else _read(path).get("tool", {}).get("fedsdk", {})


def _apply(ctx: click.Context, _param: click.Parameter, given: Path | None) -> None:
    found = find_config(given)
    if found is None:
        return
    path, tables = found
    unknown = sorted(set(tables) - set(COMMANDS))
    if unknown:
        raise click.UsageError(f"{path}: unknown table [{unknown[0]}]; the tables are {', '.join(COMMANDS)}")
    values = tables.get(ctx.command.name, {})
    ctx.default_map = {**(ctx.default_map or {}), **option_values(ctx.command, values, path)}


def option_values(command: click.Command, values: dict, path: Path) -> dict:
    """``values`` (file keys) as ``{parameter name: value}``; UsageError naming an unknown key."""
    by_key = {}
    for param in command.params:
        if isinstance(param, click.Option) and param.name != "config_file":
            for opt in param.opts + param.secondary_opts:
                by_key[opt.lstrip("-")] = param
            by_key[param.name] = by_key[param.name.replace("_", "-")] = param
    out = {}
    for key, value in values.items():
        param = by_key.get(key) or by_key.get(key.replace("_", "-"))
        if param is None:
            raise click.UsageError(f"{path}: [{command.name}] has no option {key!r}")
        if param.name == "tiers" and isinstance(value, list):
            value = ",".join(str(v) for v in value)
        elif param.name == "method_options" and isinstance(value, dict):
            value = [f"{k}={json.dumps(v)}" for k, v in value.items()]
        elif param.multiple and not isinstance(value, list):
            value = [value]
        out[param.name] = value
    return out
