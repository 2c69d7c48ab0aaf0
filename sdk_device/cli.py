"""``fedsdk``: the device-side command line."""

from __future__ import annotations

import json
import logging
import signal
import sys
from pathlib import Path

import click

from . import pair_cli
from .device_config import config_dir_option as device_config_option
from .policy_options import make_policy, policy_options
from .profile import device_profile
from .runtimes import native_build
from .transport.mqtt_link import BrokerRefused


@click.group()
@click.version_option(package_name="fedsdk", prog_name="fedsdk")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def main(verbose: int) -> None:
    """fedsdk device agent: train federated models on this machine."""
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@main.command()
@click.option("--broker", "broker_url",
              help="mqtt[s]://host:port (default: the paired server); several nodes of one cluster: "
                   "mqtt://h1:p1,h2:p2 (failover, in order); ?retain=0: a broker without retained messages.")
@click.option("--fleet", help="Fleet name (the server's --fleet; default: the paired fleet).")
@click.option("--device-id", help="This device's id, as registered on the server (default: the paired id).")
@click.option(
    "--data",
    "data_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Local training data: an .npz with arrays x and y (default: the one given to `fedsdk pair`).",
)
@click.option(
    "--work-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where blobs (programs, weights) are cached (default: the paired one, else ./.fedsdk).",
)
@click.option(
    "--runtime", "runtimes", multiple=True, help="Allow only these runtimes (default: all installed)."
)
@click.option("--username", envvar="FEDSDK_MQTT_USERNAME", help="Broker user (or FEDSDK_MQTT_USERNAME).")
@click.option("--password", envvar="FEDSDK_MQTT_PASSWORD", help="Broker password (or FEDSDK_MQTT_PASSWORD).")
@click.option("--ca-file", type=click.Path(exists=True, dir_okay=False), help="CA to trust for mqtts://.")
@click.option("--insecure", is_flag=True, help="Allow plain mqtt:// to a broker on another machine.")
@click.option("--max-tasks", type=int, default=None, help="Exit after this many finished tasks.")
@click.option("--no-smashed", is_flag=True,
              help="Never send last-layer inputs of local samples, even when a task asks.")
@click.option("--announce-window", type=click.FloatRange(0, 300), default=None,
              help="Say hello to a restarted server within this many seconds, at random (default: the "
                   "window the server's epoch asks for, about 1 s per 333 registered devices).")
@click.option("--slowdown", type=click.FloatRange(min=1.0), default=1.0, show_default=True,
              help="Simulation knob: after training, sleep (FACTOR - 1) x the training time, so the "
                   "device looks FACTOR times slower (from its second task on: the first is warm-up).")
@click.option("--connect-timeout", type=click.FloatRange(min=0), default=None,
              help="Give up (exit code 3) when the broker cannot be reached within this many seconds "
                   "(default: keep trying forever, waits growing from 1 s to 60 s).")
@policy_options
@device_config_option
def run(
    broker_url, fleet, device_id, data_path, work_dir, runtimes, username, password, ca_file, insecure,
    max_tasks, no_smashed, announce_window, slowdown, connect_timeout, only_when, policy_root,
) -> None:
    """Connect to the fleet and train whatever tasks the server sends, until stopped.

    With no options it uses what `fedsdk pair` stored; given options override it. Without a
    pairing, --broker, --fleet, --device-id and --data are needed.

    With --only-when, a task that arrives while a condition does not hold is refused with the
    code `policy` (the server counts it and asks the device again in later rounds):
    charging = on external power (or no battery at all); idle = 1-minute load average below
    0.5 per CPU; cool = every /sys/class/thermal zone below 70 °C.

    A broker that cannot be reached yet (the device booted before the server) is waited for,
    one log line per attempt. Exit codes: 0 stopped (Ctrl-C, SIGTERM, --max-tasks); 1 bad
    option or data; 3 broker unreachable within --connect-timeout; 4 the broker's TLS
    certificate is not trusted; 5 the broker refused the device's credentials."""
    from .agent import AgentConfig, DeviceAgent
    from .data.npz import DataError
    from .device_config import DeviceConfig, config_dir

    logging.getLogger().setLevel(min(logging.getLogger().level, logging.INFO))
    stored = client_id = None
    if not (broker_url and fleet and device_id):
        try:
            stored = DeviceConfig.load()
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None
        if stored is None:
            raise click.ClickException(
                f"this device is not paired (no configuration in {config_dir()}): run "
                "`fedsdk pair --server mqtts://HOST:8883 --code CODE`, pass the --config-dir it was "
                "paired with, or give --broker, --fleet, --device-id and --data")
        broker_url = broker_url or stored.broker_url
        fleet = fleet or stored.fleet
        device_id = device_id or stored.device_id
        username = username or stored.username
        password = password or stored.password
        ca_file = ca_file or stored.ca_file
        insecure = insecure or stored.insecure
        client_id = stored.client_id or None
        data_path = data_path or (Path(stored.data_path) if stored.data_path else None)
        work_dir = work_dir or (Path(stored.work_dir) if stored.work_dir else None)
    if data_path is None:
        raise click.ClickException("no training data: pass --data FILE.npz (an .npz with arrays x and y)")
    config = AgentConfig(
        broker_url=broker_url,
        fleet=fleet,
        device_id=device_id,
        data_path=data_path,
        work_dir=work_dir or Path(".fedsdk"),
        runtimes=list(runtimes) or None,
        username=username,
        password=password,
        ca_file=ca_file,
        insecure=insecure,
        client_id=client_id,
        share_smashed=not no_smashed,
        announce_window_s=announce_window,
        slowdown=slowdown,
        policy=make_policy(only_when, policy_root),
        connect_timeout_s=connect_timeout,
    )
    try:
        agent = DeviceAgent(config)
    except (DataError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    signal.signal(signal.SIGTERM, lambda *_: agent.stop())
    try:
        agent.run(max_tasks=max_tasks)
    except BrokerRefused as exc:
        if exc.tls:
            hint = " The broker's certificate is not the CA this device trusts (--ca-file, or pair again)."
        else:
            hint = (f" The broker refused {device_id}'s credentials: the device may have been revoked; "
                    "check with `fedsdk status`, pair again with `fedsdk pair --force ...`.")
        _exit(f"{exc}.{hint}", 4 if exc.tls else 5)
    except ConnectionError as exc:  # only with --connect-timeout: otherwise the agent keeps trying
        _exit(str(exc), 3)
    except KeyboardInterrupt:
        agent.stop()


def _exit(text: str, code: int) -> None:
    """One line on stderr, then exit with ``code`` (systemd's unit does not restart on 4 and 5)."""
    click.echo(f"Error: {text}", err=True)
    sys.exit(code)


@main.command()
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="The agent's work directory (default: the paired one, else ./.fedsdk).")
@click.option("--data", "data_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Local data (.npz with x, y) for the steps (default: the paired one, else random inputs).")
@click.option("--steps", default=5, show_default=True, help="Timed training steps per runtime.")
@click.option("--json", "as_json", is_flag=True, help="Print the profile and timings as JSON.")
def bench(work_dir, data_path, steps, as_json) -> None:
    """Profile this device: hardware, software and training step time on each runtime.

    The model is this device's fleet model when a task has been seen (the last task's programs
    in the work dir): every runtime is then also checked for gradient parity against torch
    autograd. Otherwise a small reference CNN (28x28 inputs) is timed on the runtimes that can
    run it without the server (torch). Nothing is sent anywhere."""
    from .bench_cli import run_bench

    run_bench(work_dir, data_path, steps, as_json)


@main.command()
def info() -> None:
    """Print this device's profile (architecture, cores, memory, runtimes) as JSON."""
    from .runtimes.registry import available_runtimes

    click.echo(json.dumps(device_profile(available_runtimes()), indent=2))


@main.group()
def runtime() -> None:
    """Training runtimes on this device (build the torch-free native ExecuTorch runtime)."""


runtime.add_command(native_build.build_command)
main.add_command(pair_cli.pair)
main.add_command(pair_cli.status)
main.add_command(pair_cli.unpair)


if __name__ == "__main__":
    sys.exit(main())
