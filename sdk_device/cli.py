"""``fedsdk``: the device-side command line."""

from __future__ import annotations

import json
import logging
import signal
import sys
from pathlib import Path

import click

from .profile import device_profile


@click.group()
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def main(verbose: int) -> None:
    """fedsdk device agent: train federated models on this machine."""
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@main.command()
@click.option("--broker", "broker_url", required=True, help="mqtt://host:port or mqtts://host:port")
@click.option("--fleet", required=True, help="Fleet name (the server's --fleet).")
@click.option("--device-id", required=True, help="This device's id, as registered on the server.")
@click.option(
    "--data",
    "data_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Local training data: an .npz with arrays x and y.",
)
@click.option(
    "--work-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".fedsdk"),
    show_default=True,
    help="Where blobs (programs, weights) are cached.",
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
def run(
    broker_url, fleet, device_id, data_path, work_dir, runtimes, username, password, ca_file, insecure,
    max_tasks, no_smashed,
) -> None:
    """Connect to the fleet and train whatever tasks the server sends, until stopped."""
    from .agent import AgentConfig, DeviceAgent
    from .data.npz import DataError

    logging.getLogger().setLevel(min(logging.getLogger().level, logging.INFO))
    config = AgentConfig(
        broker_url=broker_url,
        fleet=fleet,
        device_id=device_id,
        data_path=data_path,
        work_dir=work_dir,
        runtimes=list(runtimes) or None,
        username=username,
        password=password,
        ca_file=ca_file,
        insecure=insecure,
        share_smashed=not no_smashed,
    )
    try:
        agent = DeviceAgent(config)
    except (DataError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    signal.signal(signal.SIGTERM, lambda *_: agent.stop())
    try:
        agent.run(max_tasks=max_tasks)
    except ConnectionError as exc:
        raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:
        agent.stop()


@main.command()
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), default=Path(".fedsdk"),
              show_default=True, help="The agent's work directory (holds the last task's programs).")
@click.option("--data", "data_path", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Local data (.npz with x, y): a few samples are used.")
@click.option("--steps", default=5, show_default=True, help="Timed training steps per runtime.")
def bench(work_dir, data_path, steps) -> None:
    """Parity (vs torch autograd) and speed of every runtime here, on this device's own program."""
    from .data.npz import load_npz
    from .protocol import messages as msgs
    from .protocol.blobs import decode_tensors
    from .runtimes.recipe import Recipe
    from .runtimes.selftest import fastest_passing, format_table, run_selftest
    from .transport.blob_store import BlobStore

    last = work_dir / "last_task.json"
    if not last.is_file():
        raise click.ClickException(f"no task seen yet in {work_dir}: run the agent (fedsdk run) first")
    task = msgs.decode(last.read_bytes())
    store = BlobStore(work_dir / "blobs")
    missing = [p.format for p in task.programs if not store.has(p.id)]
    programs = {p.format: store.get(p.id) for p in task.programs if store.has(p.id)}
    if not store.has(task.weights.id) or "torchspec/1" not in programs:
        raise click.ClickException("the last task's reference program or weights are not cached; "
                                   "wait for the next task")
    x, y = load_npz(data_path)
    rows = run_selftest(programs, decode_tensors(store.get(task.weights.id)), x, y,
                        Recipe.from_dict(task.recipe), steps=steps)
    click.echo(format_table(rows))
    if missing:
        click.echo(f"(programs not cached here, not tested: {', '.join(missing)})")
    click.echo(f"fastest runtime that passed parity: {fastest_passing(rows) or 'none'}")


@main.command()
def info() -> None:
    """Print this device's profile (architecture, cores, memory, runtimes) as JSON."""
    from .runtimes.registry import available_runtimes

    click.echo(json.dumps(device_profile(available_runtimes()), indent=2))


if __name__ == "__main__":
    sys.exit(main())
