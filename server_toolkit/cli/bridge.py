"""``fedsdk-server bridge-config``: the mosquitto bridge section of an edge site's broker."""

from __future__ import annotations

import click


@click.command("bridge-config")
@click.option("--site", required=True, help="The site's name (client ids fedsdk-bridge-SITE).")
@click.option("--central", "central_url", required=True, help="mqtt[s]://host:port of the central broker.")
@click.option("--fleet", "fleets", multiple=True, required=True, help="A fleet to bridge (repeatable).")
@click.option("--username", envvar="FEDSDK_BRIDGE_USERNAME",
              help="The bridge's account on the central broker (or FEDSDK_BRIDGE_USERNAME).")
@click.option("--password", envvar="FEDSDK_BRIDGE_PASSWORD", help="Its password (or FEDSDK_BRIDGE_PASSWORD).")
@click.option("--ca-file", type=click.Path(exists=True, dir_okay=False), help="CA to trust for mqtts://.")
def bridge_config(site, central_url, fleets, username, password, ca_file) -> None:
    """Print the `connection` section to append to a site mosquitto.conf: the site broker
    forwards every topic of the fleets to and from the central broker (QoS 1, persistent
    session). Devices at the site use the site broker; the server stays on the central one
    (docs/operations.md, "Edge sites and clustered brokers")."""
    from ..broker.bridge import bridge_config as make

    try:
        click.echo(make(site, central_url, list(fleets), username, password, ca_file), nl=False)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
