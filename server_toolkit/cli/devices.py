"""``fedsdk-server devices``: the fleet registry of a run directory."""

from __future__ import annotations

from pathlib import Path

import click

from .options import console
from .pairing import devices_retier, devices_revoke, devices_show


@click.group()
def devices() -> None:
    """Manage the fleet registry of a run directory."""


@devices.command("add")
@click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path), required=True)
@click.option("--tier", default=None)
@click.argument("device_ids", nargs=-1, required=True)
def devices_add(run_dir, tier, device_ids) -> None:
    """Register devices by hand so the server accepts them (`pair-code` + `fedsdk pair` do it for you)."""
    from sdk_device.protocol.topics import check_name

    from ..fleet.registry import FleetRegistry

    registry = FleetRegistry(run_dir / "registry.sqlite")
    for dev in device_ids:
        try:
            registry.add_device(check_name("device id", dev), tier=tier)
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None
        console.print(f"registered {dev}")


@devices.command("list")
@click.option("--run-dir", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True)
def devices_list(run_dir) -> None:
    """Show the registered devices and what they reported."""
    from rich.table import Table

    from ..fleet.registry import FleetRegistry

    table = Table("device", "status", "tier", "samples", "runtimes", "arch")
    for d in FleetRegistry(run_dir / "registry.sqlite").devices():
        table.add_row(
            d["device_id"],
            d["status"],
            d["tier"] or "-",
            str(d["num_samples"] or "-"),
            ",".join(d["runtimes"] or []),
            (d["profile"] or {}).get("arch", "-"),
        )
    console.print(table)


devices.add_command(devices_show)
devices.add_command(devices_revoke)
devices.add_command(devices_retier)
