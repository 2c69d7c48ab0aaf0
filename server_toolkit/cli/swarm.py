"""``fedsdk-server swarm``: many simulated devices for load tests (``server_toolkit/swarm``)."""

from __future__ import annotations

import time

import click

from .options import console


@click.command()
@click.option("--broker", "broker_url", required=True, help="mqtt[s]://host:port of the fleet's broker.")
@click.option("--fleet", required=True, help="Fleet name (the server's --fleet).")
@click.option("--devices", "count", default=100, show_default=True, help="How many devices.")
@click.option("--processes", default=1, show_default=True, help="Processes to spread them over.")
@click.option("--prefix", default="swarm-", show_default=True,
              help="Device ids are <prefix><index>, zero-padded as `devices add --count` pads them.")
@click.option("--first", default=0, show_default=True, help="Index of the first device.")
@click.option("--connect-rate", default=500.0, show_default=True,
              help="Devices connecting per second, in total (0: all at once).")
@click.option("--heartbeat", "heartbeat_s", default=10.0, show_default=True,
              help="Seconds between idle heartbeats of each device, as the agent (0: none).")
@click.option("--fail-fraction", default=0.0, show_default=True,
              help="Share of devices that die on their first task (no DISCONNECT: the will fires).")
@click.option("--no-programs", is_flag=True, help="Do not pull the task's program (real devices do, once).")
@click.option("--username", envvar="FEDSDK_MQTT_USERNAME", help="Broker user of every device.")
@click.option("--password", envvar="FEDSDK_MQTT_PASSWORD", help="Broker password of every device.")
@click.option("--ca-file", type=click.Path(exists=True, dir_okay=False), help="CA to trust for mqtts://.")
@click.option("--insecure", is_flag=True, help="Allow plain mqtt:// to a broker on another machine.")
@click.option("--status-every", default=5.0, show_default=True, help="Seconds between status lines.")
@click.option("--duration", type=float, default=None, help="Stop after this many seconds (default: Ctrl-C).")
def swarm(broker_url, fleet, count, processes, prefix, first, connect_rate, heartbeat_s, fail_fraction,
          no_programs, username, password, ca_file, insecure, status_every, duration) -> None:
    """Run COUNT protocol-level devices (one MQTT connection each) that answer tasks with the
    sent weights plus a small seeded delta: a fleet for load tests, without training.

    The server accepts registered devices only: register the same ids first with
    `fedsdk-server devices add --run-dir RUN --count COUNT --prefix PREFIX --start FIRST`. Raise the open-file
    limit (`ulimit -n`) above the devices per process, and the broker's too."""
    from ..swarm import Swarm, SwarmConfig
    from ..swarm.shard import raise_fd_limit

    if count < 1 or processes < 1:
        raise click.ClickException("--devices and --processes must be at least 1")
    limit = raise_fd_limit()
    per_process = -(-count // processes)
    if per_process + 64 > limit:
        raise click.ClickException(f"{per_process} devices per process need more than the open-file limit "
                                   f"{limit}: use more --processes or raise `ulimit -Hn`")
    config = SwarmConfig(broker_url, fleet, count, processes, prefix, first, connect_rate, heartbeat_s,
                         fail_fraction, not no_programs, username, password, ca_file, insecure)
    ids = config.device_ids()
    console.print(f"swarm of {count} devices ({ids[0]} … {ids[-1]}) in {processes} process(es) on "
                  f"{broker_url}, fleet {fleet}")
    started = time.monotonic()
    runner = Swarm(config).start()
    try:
        while duration is None or time.monotonic() - started < duration:
            time.sleep(min(status_every, max(0.1, (duration or 1e9) - (time.monotonic() - started))))
            console.print(f"[{time.monotonic() - started:6.0f} s] {runner.counters().status_line(count)}",
                          highlight=False)
            if not runner.alive():
                raise click.ClickException("a swarm process died")
    except KeyboardInterrupt:
        pass
    finally:
        runner.stop()
    console.print(f"stopped: {runner.counters().status_line(count)}", highlight=False)
