"""How ``pair-code`` and ``devices …`` find a fleet: by its broker security directory
(``--security-dir``, where a fleet served with accounts keeps its members across runs) or by
a run directory of it (``--run-dir``: its ``fleet.json`` names the security directory the run
used). Where each file lives: ``fleet/fleet_store.py``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import click

from ..fleet.fleet_info import FleetInfo
from ..fleet.membership import FleetMembers
from .aliases import Aliased


def fleet_options(f):
    """The ``--run-dir`` / ``--security-dir`` pair of every command working on a fleet."""
    f = click.option(
        "--security-dir", "--broker-security", "security_dir", cls=Aliased, aliases=["--broker-security"],
        type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
        help="The fleet's broker security directory (security init): its devices, pairing codes "
             "and accounts, shared by every run of the fleet.")(f)
    return click.option(
        "--run-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
        help="A run directory of the fleet (`fedsdk-server run --run-dir`): finds the fleet it "
             "served; without --security-dir and with no security directory, the fleet lives there.")(f)


@dataclass
class Fleet:
    """A fleet found from the options. ``members``: its devices and pairing codes (a
    ``FleetRegistry`` with the run's tables when a run directory was given); ``info``: what
    the last ``run`` served (None: never served); ``home``: where its members and pairing key
    live; ``security_dir``: its broker accounts (None: the broker enforces none)."""

    members: FleetMembers
    info: FleetInfo | None
    home: Path
    security_dir: Path | None
    run_dir: Path | None

    def close(self) -> None:
        self.members.close()


def open_fleet(run_dir: Path | None, security_dir: Path | None, must_exist: bool = True) -> Fleet:
    """The fleet of ``--run-dir`` / ``--security-dir``; ClickException (one line) when neither
    is given, the directory is no security directory, or (``must_exist``) it has no devices yet."""
    from ..broker.mosquitto_auth import STATE_FILE
    from ..fleet.fleet_store import fleet_dir, fleet_file
    from ..fleet.registry import FleetRegistry

    if run_dir is None and security_dir is None:
        raise click.UsageError("give the fleet's --security-dir (or --run-dir, a run directory of it)")
    info = FleetInfo.load(run_dir) if run_dir is not None else None
    if security_dir is None and info is not None and info.security_dir:
        security_dir = Path(info.security_dir)
    if security_dir is not None:
        if not (security_dir / STATE_FILE).is_file():
            raise click.ClickException(f"{security_dir} is not a broker security directory (no "
                                       f"{STATE_FILE}): make one with `fedsdk-server security init`")
        info = info or FleetInfo.load(security_dir)
    store = fleet_file(run_dir, security_dir)
    run_file = run_dir / "registry.sqlite" if run_dir is not None else None
    if must_exist and not store.is_file() and not (run_file is not None and run_file.is_file()):
        where = f"--security-dir {security_dir}" if security_dir is not None else f"--run-dir {run_dir}"
        raise click.ClickException(f"no fleet registry at {store}: is {where} the fleet of "
                                   "`fedsdk-server run`?")
    if run_file is not None and (run_file.is_file() or security_dir is None):
        members: FleetMembers = FleetRegistry(run_file, store)  # an old run's devices move to the fleet
    else:
        members = FleetMembers(store)
    return Fleet(members, info, fleet_dir(run_dir, security_dir), security_dir, run_dir)
