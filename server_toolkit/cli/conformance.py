"""``fedsdk-server conformance``: drive one device client through every protocol path."""

from __future__ import annotations

import sys

import click

from ..conformance import Outcome, check_names, run_checks


@click.command()
@click.option("--broker", required=True, help="mqtt[s]://[user:password@]host:port of the device's broker.")
@click.option("--fleet", default="conformance", show_default=True, help="Fleet name the device uses.")
@click.option("--device-id", required=True, help="The device under test (start it with this id and fleet).")
@click.option(
    "--format",
    "formats",
    default="torchspec/1,pte/1",
    show_default=True,
    help="Program formats offered in tasks, comma-separated (the device picks one it runs).",
)
@click.option("--ca-file", type=click.Path(exists=True, dir_okay=False), help="CA to trust for mqtts://.")
@click.option(
    "--only", multiple=True, type=click.Choice(check_names()), help="Run only this check (repeatable)."
)
def conformance(
    broker: str, fleet: str, device_id: str, formats: str, ca_file: str | None, only: tuple[str, ...]
) -> None:
    """Play the server against a device and print pass / fail per check (exit 1 on any fail).

    Start the kit, then the device (its start hello is the first check). The device needs
    local training data for the digits input shape (1x8x8, 10 classes).
    """

    def show(outcome: Outcome) -> None:
        line = f"{'PASS' if outcome.passed else 'FAIL'}  {outcome.name:<28} {outcome.seconds:6.1f} s"
        click.echo(line + (f"  {outcome.reason}" if outcome.reason else ""))

    click.echo(f"conformance: waiting for device {device_id} of fleet {fleet} on {broker}")
    outcomes = run_checks(
        broker,
        fleet,
        device_id,
        [f.strip() for f in formats.split(",") if f.strip()],
        ca_file=ca_file,
        only=list(only) or None,
        report=show,
    )
    failed = [o.name for o in outcomes if not o.passed]
    click.echo(f"{len(outcomes) - len(failed)} passed, {len(failed)} failed")
    sys.exit(1 if failed else 0)
