"""``fedsdk run --only-when charging,idle,cool [--policy-root DIR]``: the device policy options."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import click

from .policy import CONDITIONS, DevicePolicy, parse_conditions


def _conditions(_ctx: click.Context, _param: click.Parameter, value: str | None) -> tuple[str, ...]:
    try:
        return parse_conditions(value) if value else ()
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def policy_options(command: Callable) -> Callable:
    """Add --only-when (``only_when``: condition names) and --policy-root (``policy_root``)."""
    command = click.option(
        "--only-when", "only_when", callback=_conditions, metavar="CONDITIONS", envvar="FEDSDK_ONLY_WHEN",
        help=f"Train only while all of these hold (comma-separated: {', '.join(CONDITIONS)}); "
             "otherwise refuse the task with the code `policy` (or FEDSDK_ONLY_WHEN).")(command)
    return click.option(
        "--policy-root", type=click.Path(file_okay=False, path_type=Path), envvar="FEDSDK_POLICY_ROOT",
        default=Path("/"), show_default=True,
        help="Where --only-when reads sys/class/power_supply, proc/loadavg and sys/class/thermal "
             "(another root holds fake copies, for tests; or FEDSDK_POLICY_ROOT).")(command)


def make_policy(only_when: tuple[str, ...], policy_root: Path) -> DevicePolicy | None:
    """The policy of the options, or None when --only-when was not given."""
    return DevicePolicy(only_when, policy_root) if only_when else None
