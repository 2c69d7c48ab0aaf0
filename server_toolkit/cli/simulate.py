"""``fedsdk-server simulate``: a whole federation on this machine."""

from __future__ import annotations

from pathlib import Path

import click

from fedcore.recipe import Recipe

from .async_options import async_options, straggler_options
from .config_file import config_option
from .method_choice import MethodOption
from .observe_options import hold_dashboard, observe_options, observed, open_observers
from .options import ROUND_TIMEOUT_S, console, divergence_option, method_option, parse_options, recipe_options
from .privacy_options import privacy_options, privacy_settings
from .progress import RoundProgress, print_outcome
from .secagg_options import secagg_options
from .validate import validated


@click.command()
@click.option("--method", default="fedavg", show_default=True, cls=MethodOption, help="Federated method.")
@click.option(
    "--dataset",
    default="digits",
    show_default=True,
    help="digits (bundled), mnist, fashion_mnist (see `datasets list`), npz:<path>, or your loader "
    "as pkg.module:load or file.py[:load] (docs/byo.md).",
)
@click.option("--train-samples", type=click.IntRange(min=1), default=None,
              help="Use a label-stratified subset of this many training samples (default: all).")
@click.option("--test-samples", type=click.IntRange(min=1), default=None,
              help="Evaluate on a label-stratified subset of this many test samples (default: all).")
@click.option("--data-dir", type=click.Path(file_okay=False),
              help="Where mnist / fashion_mnist live (npz or IDX files; `datasets fetch` gets them).")
@click.option(
    "--model",
    default="small_cnn",
    show_default=True,
    help="small_cnn, lenet5, vgg_multi_exit, lenet5_multi_exit, resnet_small, lenet, vgg8, "
    "resnet10/12/18 or mlp (fedsdk-server methods list shows what each method expects); or your "
    "nn.Module as pkg.module:build or file.py[:build] (docs/byo.md).",
)
@click.option("--devices", default=8, show_default=True, help="Device processes to start (<= 10 here).")
@click.option("--rounds", default=20, show_default=True, help="Rounds in all (--resume: up to this round).")
@click.option("--clients-per-round", type=int, default=None, help="Quorum per round (default: all).")
@click.option("--fraction", type=float, default=None, help="Quorum as a fraction of online devices.")
@click.option("--over-select", default=0.0, show_default=True, help="Extra fraction of devices asked.")
@click.option(
    "--partition",
    default="dirichlet",
    show_default=True,
    type=click.Choice(["iid", "dirichlet", "k-classes", "quantity-skew"]),
    help="How the training split is divided among the devices.",
)
@click.option("--alpha", default=0.5, show_default=True, help="Dirichlet concentration.")
@click.option("--classes-per-client", default=2, show_default=True, help="For k-classes.")
@click.option("--num-strong", default=1, show_default=True, help="For quantity-skew: strong devices.")
@click.option("--strong-share", default=0.5, show_default=True, help="For quantity-skew: their data share.")
@click.option(
    "--tiers",
    default=None,
    help="Comma-separated tier names given to devices round-robin, e.g. 1.0,0.75,0.5,0.25.",
)
@method_option
@click.option(
    "--programs",
    "program_formats",
    default="torchspec/1",
    show_default=True,
    help="Program formats offered to devices, comma-separated (torchspec/1, pte/1, ...).",
)
@click.option("--device-runtime", default=None, help="Make every simulated device use this runtime.")
@click.option("--grid", type=click.Choice(["mqtt", "inprocess"]), default="mqtt", show_default=True,
              help="mqtt: device processes over a broker; inprocess: the same devices trained in this "
              "process (no broker; what the benchmarks run).")
@click.option("--edges", default=0, show_default=True,
              help="Edge aggregator processes. fedconv: edge k serves the devices of the k-th tier "
                   "(round-robin); other methods: generic edges, device i behind edge i mod N.")
@click.option(
    "--device-python",
    default=None,
    help="Python of the device processes, e.g. .venv-ort/bin/python for --device-runtime onnxruntime.",
)
@recipe_options
@click.option("--seed", default=0, show_default=True, help="Seed of the partition, models and sampling.")
@click.option("--round-timeout", default=ROUND_TIMEOUT_S, show_default=True, help="Round time limit, s.")
@click.option("--min-devices", default=1, show_default=True,
              help="Devices online before a round starts (the start waits for the whole simulated fleet); "
                   "fewer: the round waits.")
@click.option("--fleet-timeout", default=180.0, show_default=True,
              help="Seconds a round waits for --min-devices to be online before the run fails.")
@click.option("--norm-bound", default=10.0, show_default=True,
              help="Clip an update's change per weight (RMS) to this many times the round's median (0: off).")
@click.option(
    "--broker",
    "broker_url",
    default=None,
    help="mqtt://host:port of an existing broker (default: start the embedded one on 127.0.0.1).",
)
@click.option(
    "--runs-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("runs"), show_default=True,
    help="Where a new run directory (named by the date and time) is made.",
)
@click.option("--run-dir", "run_dir_option", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Write the run into exactly this (new or empty) directory instead.")
@click.option("--label", default=None, help="A name for this run in `fedsdk-server report` (e.g. FedAvg-S).")
@click.option("--setting", default=None,
              help="What this run is compared within in `fedsdk-server report` "
              "(default: dataset, partition, model).")
@click.option(
    "--resume",
    "resume_dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Continue the run in this directory from its last checkpoint.",
)
@divergence_option
@privacy_options
@observe_options
@secagg_options
@async_options
@straggler_options
@config_option
@validated
def simulate(resume_dir, runs_dir, run_dir_option, local_epochs, batch_size, lr, max_steps, optimizer,
             dashboard, dashboard_token, dashboard_hold, log_to, **options) -> None:
    """Run a whole federation here: broker, server and N real device processes over MQTT
    (or, with `--grid inprocess`, the same devices trained in this process)."""
    import json

    from ..sim.simulate import Simulation, SimulationConfig, new_run_dir

    privacy = privacy_settings(options, options["method"], sampling_rate(options))
    if resume_dir:
        config = SimulationConfig(**json.loads((resume_dir / "config.json").read_text()))
        config.rounds = max(config.rounds, options["rounds"])
        run_dir = resume_dir
    else:
        seed = options["seed"]
        recipe = Recipe(epochs=local_epochs, batch_size=batch_size, lr=lr, optimizer=optimizer, seed=seed,
                        max_steps=max_steps)
        tiers, formats = options.pop("tiers"), options.pop("program_formats")
        config = SimulationConfig(
            **{k: v for k, v in options.items()
               if k not in ("method_options", "round_timeout", "fleet_timeout", "norm_bound")},
            recipe=recipe.to_dict(),
            round_timeout_s=options["round_timeout"],
            fleet_timeout_s=options["fleet_timeout"],
            norm_bound=options["norm_bound"] or None,
            tiers=[t.strip() for t in tiers.split(",")] if tiers else None,
            method_options=parse_options(options["method_options"]),
            program_formats=[f.strip() for f in formats.split(",")],
            privacy=privacy.to_dict() if privacy else None,
        )
        if run_dir_option is not None:
            if run_dir_option.exists() and any(run_dir_option.iterdir()):
                raise click.ClickException(f"--run-dir {run_dir_option} is not empty "
                                           "(use --resume to continue it)")
            run_dir = run_dir_option
        else:
            run_dir = new_run_dir(runs_dir)
    console.print(
        f"[bold]fedsdk simulate[/]: {config.method} on {config.dataset} ({config.model}), "
        f"{config.devices} devices, {config.rounds} rounds, {config.partition} partition "
        f"-> {run_dir}"
    )
    observers = open_observers(dashboard, dashboard_token, log_to, run_dir.name)
    simulation = None
    try:
        with observed(observers, run_dir), RoundProgress(config.rounds, "starting devices") as progress:

            def on_event(kind: str, data: dict) -> None:
                if kind == "broker":
                    kind_name = "embedded amqtt" if data["embedded"] else "external"
                    progress.note(f"broker: {data['url']} ({kind_name})")
                elif kind == "devices":
                    what = "devices and edges" if config.edges else "devices"
                    progress.note(f"{what} online: {data['online']}/{data['expected']}")
                elif kind == "round":
                    progress.round(data)

            from ..data.errors import DatasetError
            from ..sim.partition import PartitionError

            simulation = Simulation(config, run_dir, resume=resume_dir is not None, on_event=on_event,
                                    observers=observers)
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
    hold_dashboard(observers, dashboard_hold)



def sampling_rate(options: dict) -> float:
    """The share of the simulated devices a round asks for (privacy accounting)."""
    if options["clients_per_round"]:
        return min(1.0, options["clients_per_round"] / max(options["devices"], 1))
    return min(1.0, options["fraction"]) if options["fraction"] else 1.0
