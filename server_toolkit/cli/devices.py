"""``fedsdk-server devices``: the members of a fleet (kept in its broker security directory,
or in a run directory when the fleet has none; see ``fleet/fleet_store.py``)."""

from __future__ import annotations

import time
from pathlib import Path

import click

from .fleet_options import fleet_options, open_fleet
from .options import console
from .pairing import devices_retier, devices_revoke, devices_show


@click.group()
def devices() -> None:
    """Manage a fleet's devices (--security-dir, or --run-dir of a run of the fleet)."""


@devices.command("add")
@fleet_options
@click.option("--tier", default=None, help="Tier of every device added (a line's ,TIER wins).")
@click.option("--count", type=int, default=None, help="Add N devices named PREFIX + zero-padded index.")
@click.option("--prefix", default="device-", show_default=True, help="Id prefix for --count.")
@click.option("--start", type=int, default=0, show_default=True, help="First index for --count.")
@click.option("--from-file", "id_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="One device id per line, optionally ID,TIER.")
@click.argument("device_ids", nargs=-1)
def devices_add(run_dir, security_dir, tier, count, prefix, start, id_file, device_ids) -> None:
    """Register devices by hand so the server accepts them (`pair-code` + `fedsdk pair` do it for you).

    All ids (arguments, --count, --from-file) are added in one transaction, or none: an
    invalid id, an id given twice or one already registered is refused."""
    from ..fleet.device_ids import numbered_ids, read_id_file

    if not device_ids and count is None and id_file is None:
        raise click.UsageError("give device ids, --count N (with --prefix) or --from-file FILE")
    started = time.perf_counter()
    try:
        entries = [(dev, tier) for dev in device_ids]
        entries += [(dev, tier) for dev in numbered_ids(prefix, count, start)] if count is not None else []
        entries += read_id_file(id_file, tier) if id_file is not None else []
        fleet = open_fleet(run_dir, security_dir, must_exist=False)
        info = fleet.info
        unknown = sorted({t for _, t in entries if t is not None} - set(info.tiers)) \
            if info is not None and info.tiers else []
        if unknown:
            raise ValueError(f"tier {unknown[0]!r} is not one of the fleet's tiers: {', '.join(info.tiers)}")
        added = fleet.members.add_devices(entries)
        fleet.close()
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    if added <= 10:
        for dev, _ in entries:
            console.print(f"registered {dev}")
    else:
        console.print(f"registered {added} devices ({entries[0][0]} .. {entries[-1][0]}) "
                      f"in {time.perf_counter() - started:.2f} s")


@devices.command("list")
@fleet_options
def devices_list(run_dir, security_dir) -> None:
    """Show the fleet's devices and what they reported."""
    from rich.table import Table

    fleet = open_fleet(run_dir, security_dir)
    table = Table("device", "status", "last seen", "tier", "samples", "runtimes", "arch")
    now = time.time()
    for d in fleet.members.devices():
        table.add_row(
            d["device_id"],
            presence(d["status"], d["last_seen"], now),
            seen_ago(d["last_seen"], now),
            d["tier"] or "-",
            str(d["num_samples"] or "-"),
            ",".join(d["runtimes"] or []),
            (d["profile"] or {}).get("arch", "-"),
        )
    fleet.close()
    console.print(table)


# A device counts as online when the server heard from it this recently: a working device
# sends a heartbeat every 10 s while it trains and a status at each task; a stopped server
# or device leaves its last status ("online") in the registry, which must not read as online.
ONLINE_WINDOW_S = 120.0


def presence(status: str | None, last_seen: float | None, now: float) -> str:
    """The status to show: the stored one when recent, else ``offline`` (a stale "online")."""
    if status in (None, "revoked", "registered", "paired", "offline"):
        return status or "registered"
    return status if last_seen is not None and now - last_seen <= ONLINE_WINDOW_S else "offline"


def seen_ago(last_seen: float | None, now: float) -> str:
    """``"12 s ago"``, ``"5 min ago"``, ``"3 h ago"``, a date beyond a day; ``-`` when never."""
    if last_seen is None:
        return "-"
    age = max(0.0, now - last_seen)
    if age < 120:
        return f"{age:.0f} s ago"
    if age < 7200:
        return f"{age / 60:.0f} min ago"
    if age < 86400:
        return f"{age / 3600:.0f} h ago"
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(last_seen))


devices.add_command(devices_show)
devices.add_command(devices_revoke)
devices.add_command(devices_retier)
