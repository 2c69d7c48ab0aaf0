"""``fedsdk-server simulate``: a whole federation on this machine; the options are in
``simulate_options.py``, the configuration in ``sim/simulate.py:SimulationConfig`` (a
``server_config.ServerConfig`` with the simulated devices), the simulation in ``sim/``."""

from __future__ import annotations

import json
from collections.abc import Callable

import click

from .config_build import build_config
from .observe_options import hold_dashboard, observed, open_observers
from .options import console
from .progress import RoundProgress, print_outcome
from .simulate_options import PLACEMENT, simulate_options
from .validate import validated


@click.command()
@simulate_options
@validated
def simulate(**options) -> None:
    """Run a whole federation here: broker, server and N real device processes over MQTT
    (or, with `--grid inprocess`, the same devices trained in this process)."""
    from ..data.errors import DatasetError
    from ..sim.partition import PartitionError
    from ..sim.simulate import Simulation, SimulationConfig, new_run_dir

    config, observe, place = build_config(SimulationConfig, options, sampling_rate(options), PLACEMENT)
    run_dir = place["resume_dir"] or place["run_dir_option"] or new_run_dir(place["runs_dir"])
    if place["resume_dir"]:
        rounds, config = config.rounds, SimulationConfig(**json.loads((run_dir / "config.json").read_text()))
        config.rounds = max(config.rounds, rounds)
    console.print(
        f"[bold]fedsdk simulate[/]: {config.method} on {config.dataset} ({config.model}), "
        f"{config.devices} devices, {config.rounds} rounds, {config.partition} partition "
        f"-> {run_dir}"
    )
    observers = open_observers(observe.dashboard, observe.dashboard_token, observe.log_to, run_dir.name)
    simulation = None
    try:
        with observed(observers, run_dir), RoundProgress(config.rounds, "starting devices") as progress:
            simulation = Simulation(config, run_dir, resume=place["resume_dir"] is not None,
                                    on_event=progress_events(progress, config.edges), observers=observers)
            try:
                report = simulation.run()
            except (DatasetError, PartitionError, ValueError, TypeError, RuntimeError,
                    ConnectionError) as exc:
                raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:  # the rounds that finished are in the summary and the plot
        if simulation is not None and simulation.report is not None:
            print_outcome(simulation.report, f"{config.method} on {config.dataset}", run_dir, stopped=True)
        raise
    print_outcome(report, f"{config.method} on {config.dataset}", run_dir)
    hold_dashboard(observers, observe.dashboard_hold)


def progress_events(progress: RoundProgress, edges: int) -> Callable[[str, dict], None]:
    """The simulation's ``on_event``: the broker, devices online and each round on ``progress``."""

    def on_event(kind: str, data: dict) -> None:
        if kind == "broker":
            kind_name = "embedded amqtt" if data["embedded"] else "external"
            progress.note(f"broker: {data['url']} ({kind_name})")
        elif kind == "devices":
            what = "devices and edges" if edges else "devices"
            progress.note(f"{what} online: {data['online']}/{data['expected']}")
        elif kind == "round":
            progress.round(data)

    return on_event


def sampling_rate(options: dict) -> float:
    """The share of the simulated devices a round asks for (privacy accounting)."""
    if options["clients_per_round"]:
        return min(1.0, options["clients_per_round"] / max(options["devices"], 1))
    return min(1.0, options["fraction"]) if options["fraction"] else 1.0
