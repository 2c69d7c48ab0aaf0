"""Fail fast: every option of ``simulate`` and ``run`` checked before anything starts (no
broker, no device, no run directory), so a usage error is one line at once.

The hook: a *validator* is a function ``validate(params: dict) -> None`` that raises
``click.UsageError`` (bad usage, exit 2) or ``click.ClickException`` (something outside is
wrong, e.g. a broker is down: exit 1) and may print warnings. ``params`` are the command's
parameters by their Python names (absent when the command has no such option: use
``params.get``), plus ``_command`` (the command's name) and ``_given`` (the names given on
the command line or in a config file, not defaulted). An options module (``async_options``,
``privacy_options``, …) contributes its ``validate`` by one entry in ``validators()`` below;
``@validated`` (the last decorator above ``def simulate`` / ``def run``) runs them all, in
order: cheap checks first, those that import torch last.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import click
from click.core import ParameterSource

Validator = Callable[[dict], None]
GIVEN = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT, ParameterSource.DEFAULT_MAP)


def validators() -> list[Validator]:
    """Every validator, in the order they run (add an options module's ``validate`` here)."""
    from . import combination_checks, resume_checks, run_checks

    return [run_checks.validate_values, combination_checks.validate, resume_checks.validate,
            run_checks.validate_broker,
            run_checks.validate_dataset, run_checks.validate_method]


def check_params(ctx: click.Context, params: dict) -> None:
    """Run every validator on ``params`` (the command's keyword arguments)."""
    given = frozenset(name for name in params if ctx.get_parameter_source(name) in GIVEN)
    view = {**params, "_command": ctx.command.name, "_given": given}
    for validate in validators():
        validate(view)


def validated(command: Callable) -> Callable:
    """Run ``check_params`` before ``command``'s body (put it right above the ``def``)."""

    @functools.wraps(command)
    def checked(**params):  # noqa: ANN202 - a click callback
        check_params(click.get_current_context(), params)
        return command(**params)

    return checked

