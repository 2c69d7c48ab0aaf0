"""``fedsdk-server``: the server-side command line."""

from __future__ import annotations

import logging
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from sdk_device.runtimes.recipe import Recipe
from sdk_device.transport.tls import is_loopback

from .cli_datasets import datasets
from .cli_methods import methods
from .cli_pairing import devices_retier, devices_revoke, devices_show, pair_code, pairing_options, parse_tiers
from .cli_report import report
from .cli_security import certs, security
from .hn_cli import hn

console = Console()


@click.group()
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def main(verbose: int) -> None:
    """fedsdk server: cut models for a fleet of unlike devices and run federated rounds."""
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _recipe_options(f):
    for opt in reversed(
        [
            click.option("--local-epochs", default=5, show_default=True, help="Local epochs per round."),
            click.option("--batch-size", default=16, show_default=True),
            click.option("--lr", default=0.05, show_default=True, help="Client learning rate."),
            click.option("--optimizer", type=click.Choice(["sgd", "adam"]), default="sgd", show_default=True),
        ]
    ):
        f = opt(f)
    return f


def parse_options(pairs: tuple[str, ...]) -> dict:
    """``("k=v", ...)`` -> dict; values are JSON when they parse (numbers, lists, true), else strings."""
    import json

    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {pair!r}", param_hint="--method-option")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


_method_option = click.option(
    "--method-option",
    "method_options",
    multiple=True,
    metavar="KEY=VALUE",
    help="A method-specific option (repeatable); VALUE is parsed as JSON when it can be.",
)


@main.command()
@click.option("--method", default="fedavg", show_default=True, help="Federated method.")
@click.option(
    "--dataset",
    default="digits",
    show_default=True,
    help="digits (bundled), mnist, fashion_mnist (see `datasets list`) or npz:<path>.",
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
    help="small_cnn, lenet5, vgg_multi_exit, lenet5_multi_exit, resnet_small, lenet, vgg8, resnet10/12/18 "
    "or mlp.",
)
@click.option("--devices", default=8, show_default=True, help="Device processes to start (<= 10 here).")
@click.option("--rounds", default=20, show_default=True)
@click.option("--clients-per-round", type=int, default=None, help="Quorum per round (default: all).")
@click.option("--fraction", type=float, default=None, help="Quorum as a fraction of online devices.")
@click.option("--over-select", default=0.0, show_default=True, help="Extra fraction of devices asked.")
@click.option(
    "--partition",
    default="dirichlet",
    show_default=True,
    type=click.Choice(["iid", "dirichlet", "k-classes", "quantity-skew"]),
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
@_method_option
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
              help="Edge aggregator processes; edge k serves the devices of the k-th tier (round-robin).")
@click.option(
    "--device-python",
    default=None,
    help="Python of the device processes, e.g. .venv-ort/bin/python for --device-runtime onnxruntime.",
)
@_recipe_options
@click.option("--seed", default=0, show_default=True)
@click.option("--round-timeout", default=120.0, show_default=True, help="Seconds per round at most.")
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
def simulate(resume_dir, runs_dir, run_dir_option, local_epochs, batch_size, lr, optimizer,
             **options) -> None:
    """Run a whole federation here: broker, server and N real device processes over MQTT
    (or, with `--grid inprocess`, the same devices trained in this process)."""
    import json

    from .report.run_report import final_accuracy
    from .sim.simulate import Simulation, SimulationConfig, new_run_dir

    if resume_dir:
        config = SimulationConfig(**json.loads((resume_dir / "config.json").read_text()))
        config.rounds = max(config.rounds, options["rounds"])
        run_dir = resume_dir
    else:
        seed = options["seed"]
        recipe = Recipe(epochs=local_epochs, batch_size=batch_size, lr=lr, optimizer=optimizer, seed=seed)
        tiers, formats = options.pop("tiers"), options.pop("program_formats")
        config = SimulationConfig(
            **{k: v for k, v in options.items() if k not in ("method_options", "round_timeout")},
            recipe=recipe.to_dict(),
            round_timeout_s=options["round_timeout"],
            tiers=[t.strip() for t in tiers.split(",")] if tiers else None,
            method_options=parse_options(options["method_options"]),
            program_formats=[f.strip() for f in formats.split(",")],
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
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        bar = progress.add_task("starting broker and devices", total=config.rounds)

        def on_event(kind: str, data: dict) -> None:
            if kind == "broker":
                kind_name = "embedded amqtt" if data["embedded"] else "external"
                progress.console.print(f"broker: {data['url']} ({kind_name})")
            elif kind == "devices":
                what = "devices and edges" if config.edges else "devices"
                progress.console.print(f"{what} online: {data['online']}/{data['expected']}")
            elif kind == "round":
                acc = data.get("accuracy")
                progress.update(
                    bar,
                    completed=data["round"],
                    description=f"round {data['round']}: accuracy {acc:.3f}, "
                    f"{data['accepted']}/{data['selected']} updates",
                )

        from .data.errors import DatasetError
        from .sim.partition import PartitionError

        try:
            report = Simulation(config, run_dir, resume=resume_dir is not None, on_event=on_event).run()
        except (DatasetError, PartitionError, ValueError, TypeError, RuntimeError, ConnectionError) as exc:
            raise click.ClickException(str(exc)) from None
    console.print(report.summary_table(f"{config.method} on {config.dataset}"))
    acc = final_accuracy(report.rows)
    console.print(
        f"final accuracy {acc:.3f}; metrics in {run_dir}/metrics.jsonl, plot {run_dir}/accuracy.png"
        if acc is not None
        else f"no rounds completed; see {run_dir}"
    )


@main.command()
@click.option(
    "--broker",
    "broker_url",
    default=None,
    help="mqtt[s]://host:port of the fleet's broker (default: embedded, loopback only).",
)
@click.option(
    "--insecure-embedded-broker",
    is_flag=True,
    help="Let the embedded broker bind a non-loopback --host (no auth, no limits).",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Embedded broker address.")
@click.option("--port", default=1883, show_default=True, help="Embedded broker port.")
@click.option(
    "--broker-security",
    "security_dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="Broker security directory (security init): log in as fedsdk-server, manage device accounts.",
)
@click.option("--ca-file", type=click.Path(exists=True, dir_okay=False), help="CA to trust for mqtts://.")
@click.option("--insecure", is_flag=True, help="Allow plain mqtt:// to a non-loopback broker.")
@click.option("--fleet", required=True, help="Fleet name (devices use the same).")
@click.option(
    "--run-dir",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Where the registry, blobs, checkpoints and metrics live.",
)
@click.option("--method", default="fedavg", show_default=True)
@click.option("--model", default="small_cnn", show_default=True)
@click.option(
    "--dataset",
    default="digits",
    show_default=True,
    help="digits, mnist, fashion_mnist or npz:<path>: defines the model's input/classes; "
    "its test split evaluates the global model.",
)
@click.option("--data-dir", type=click.Path(file_okay=False), help="Where mnist / fashion_mnist live.")
@click.option(
    "--server-data",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="npz (x, y) the server keeps for methods that tune on data of their own (fedconv); "
    "default: the method's share of --dataset's training split.",
)
@_method_option
@click.option("--rounds", default=20, show_default=True)
@click.option("--min-devices", default=1, show_default=True, help="Wait for this many devices first.")
@click.option("--clients-per-round", type=int, default=None, help="Quorum per round (default: all).")
@click.option("--fraction", type=float, default=None, help="Quorum as a fraction of online devices.")
@click.option("--over-select", default=0.0, show_default=True, help="Extra fraction of devices asked.")
@click.option("--round-timeout", default=300.0, show_default=True)
@_recipe_options
@click.option("--seed", default=0, show_default=True)
@click.option("--resume", is_flag=True, help="Continue from the last checkpoint in --run-dir.")
@pairing_options
def run(
    broker_url,
    insecure_embedded_broker,
    host,
    port,
    security_dir,
    ca_file,
    insecure,
    fleet,
    run_dir,
    method,
    model,
    dataset,
    data_dir,
    server_data,
    method_options,
    rounds,
    min_devices,
    clients_per_round,
    fraction,
    over_select,
    round_timeout,
    local_epochs,
    batch_size,
    lr,
    optimizer,
    seed,
    resume,
    tiers,
    program_formats,
    device_url,
    pair_max_failures,
    pair_lockout,
) -> None:
    """Serve a real fleet, and pair new devices meanwhile (`fedsdk-server pair-code`).

    Devices join with `fedsdk pair` (or, registered by hand, `fedsdk run --broker ... --fleet ...
    --device-id ...`)."""
    from sdk_device.protocol.topics import FleetTopics
    from sdk_device.transport.blob_store import BlobStore
    from sdk_device.transport.endpoint import Endpoint
    from sdk_device.transport.mqtt_link import BrokerAddress

    from .broker.embedded import EmbeddedBroker
    from .broker.mosquitto_auth import SecurityDirError
    from .broker.secured import server_connection
    from .data.datasets import load_dataset
    from .fleet.pair_codes import LockoutPolicy
    from .fleet.pairing_setup import describe_fleet, device_url_for, start_pairing
    from .fleet.registry import FleetRegistry
    from .methods import method_class
    from .models.zoo import model_spec
    from .report.run_report import RunReport
    from .rounds.loop import LoopConfig, RoundLoop
    from .rounds.mqtt_grid import MqttGrid

    recipe = Recipe(epochs=local_epochs, batch_size=batch_size, lr=lr, optimizer=optimizer, seed=seed)
    try:
        data = load_dataset(dataset, data_dir, seed=seed)
        spec = model_spec(model, data.input_shape, data.num_classes)
        the_method = method_class(method)(spec, recipe, **parse_options(method_options))
        _attach_server_data(the_method, data, server_data, seed)
    except (ValueError, TypeError) as exc:
        raise click.ClickException(str(exc)) from None
    registry = FleetRegistry(run_dir / "registry.sqlite")
    broker = None
    username = password = None
    try:
        if security_dir:
            address, ca_file, broker_security = server_connection(security_dir, broker_url, ca_file)
            if broker_security.fleet != fleet:
                raise ValueError(f"{security_dir} holds the accounts of fleet {broker_security.fleet!r}, "
                                 f"not {fleet!r}")
            username, password = broker_security.server_credentials()
        elif broker_url:
            address = BrokerAddress.parse(broker_url)
        else:
            broker = EmbeddedBroker(host, port, allow_remote=insecure_embedded_broker).start()
            address = broker.address
        endpoint = Endpoint(
            address, FleetTopics(fleet), BlobStore(run_dir / "blobs"), is_known_peer=registry.is_known,
            username=username, password=password, ca_file=ca_file,
            insecure=insecure or insecure_embedded_broker,  # that flag already accepts plain TCP
        )
        fleet_info = describe_fleet(
            the_method, fleet, device_url_for(address, ca_file, device_url), parse_tiers(tiers),
            round_timeout, method_name=method, model=model, ca_file=ca_file,
            security_dir=str(security_dir) if security_dir else None, insecure=insecure,
            lockout=LockoutPolicy(pair_max_failures, pair_lockout, pair_lockout))
    except (ValueError, SecurityDirError, FileNotFoundError) as exc:
        if broker:
            broker.stop()
        raise click.ClickException(str(exc)) from None
    report = (
        RunReport.load(run_dir) if resume and (run_dir / "metrics.jsonl").exists() else RunReport(run_dir)
    )
    grid = MqttGrid(endpoint, registry, program_formats=[f.strip() for f in program_formats.split(",")],
                    fetch_timeout_s=round_timeout)
    loop = RoundLoop(
        the_method, grid,
        LoopConfig(rounds=rounds, clients_per_round=clients_per_round, fraction=fraction,
                   over_select=over_select, round_timeout_s=round_timeout, seed=seed),
        run_dir=run_dir,
        test_data=(data.x_test, data.y_test),
        on_round=lambda row: (report.add_round(row), console.print(row)),
    )
    pairing = None
    try:
        endpoint.start()
        loop.start(resume=resume)
        pairing = start_pairing(run_dir, fleet_info, address, the_method, registry, grid.programs,
                                username=username, password=password, ca_file=ca_file, insecure=insecure,
                                security=broker_security if security_dir else None)
        console.print(f"pairing open: make a code with `fedsdk-server pair-code --run-dir {run_dir}`"
                      + ("" if security_dir else " (no --broker-security: the broker enforces no accounts)"))
        console.print(f"serving fleet {fleet} on {address.url}; waiting for {min_devices} device(s)")
        while grid.wait_for_devices(min_devices, timeout_s=30) < min_devices:
            console.print(f"{len(grid.devices)}/{min_devices} devices online, still waiting")
        loop.run()
    finally:
        if pairing:
            pairing.close()
        grid.close()
        endpoint.close()
        if broker:
            broker.stop()
    report.write_plot()
    console.print(report.summary_table(f"{method} on fleet {fleet}"))


@main.command()
@click.option("--broker", "broker_url", required=True, help="mqtt[s]://host:port of the server's broker.")
@click.option("--fleet", required=True, help="The server's fleet name.")
@click.option("--edge-id", required=True, help="This edge's device id in the server's fleet.")
@click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="The edge's registry (its devices), blobs and checkpoints.")
@click.option("--tier", default=None, help="The tier (shrinkage ratio) of this edge's devices, e.g. 0.5.")
@click.option("--group-fleet", default=None, help="Fleet of the group's devices [default: FLEET.EDGE_ID].")
@click.option("--group-broker", "group_broker_url", default=None,
              help="Broker of the group's devices [default: --broker, or GROUP_SECURITY's listener].")
@click.option("--group-broker-security", "group_security_dir", type=click.Path(exists=True, file_okay=False),
              help="Security directory of a secured group broker (security init --fleet GROUP_FLEET): "
                   "the edge serves its group with that directory's server account and CA.")
@click.option("--min-devices", default=1, show_default=True, help="Group devices to wait for before joining.")
@click.option("--devices-wait", default=120.0, show_default=True, help="Seconds to wait for them at most.")
@click.option("--max-clusters", default=8, show_default=True, help="Largest K tried by the clustering.")
@click.option("--smashed-samples", default=128, show_default=True,
              help="Last-layer inputs asked per device and round; 0 turns the projection stage off.")
@click.option("--pair-threshold", default=1.0, show_default=True,
              help="Link clusters closer than this x the median client-pair KLD.")
@click.option("--projection-lambda", default=0.5, show_default=True, help="λ of FedConv's Eq. 8.")
@click.option("--projection-epochs", default=2, show_default=True)
@click.option("--warmup-epochs", default=1, show_default=True, help="Local epochs of the clustering warm-up.")
@click.option("--seed", default=0, show_default=True)
@click.option("--username", envvar="FEDSDK_MQTT_USERNAME", help="Broker user (or FEDSDK_MQTT_USERNAME).")
@click.option("--password", envvar="FEDSDK_MQTT_PASSWORD", help="Broker password (or FEDSDK_MQTT_PASSWORD).")
@click.option("--ca-file", type=click.Path(exists=True, dir_okay=False), help="CA to trust for mqtts://.")
@click.option("--insecure", is_flag=True, help="Allow plain mqtt:// to a non-loopback broker.")
def edge(broker_url, fleet, edge_id, run_dir, tier, group_fleet, group_broker_url, group_security_dir,
         min_devices, devices_wait, max_clusters, smashed_samples, pair_threshold, projection_lambda,
         projection_epochs, warmup_epochs, seed, username, password, ca_file, insecure) -> None:
    """Run an edge aggregator: a device of the server's fleet, the server of its own group.

    Register the edge on the server (`devices add --run-dir SERVER_DIR --tier T EDGE_ID`)
    and its devices here (`devices add --run-dir EDGE_DIR DEVICE_ID`); devices then run
    `fedsdk run --fleet FLEET.EDGE_ID …`.
    """
    import signal

    from .broker.mosquitto_auth import SecurityDirError
    from .broker.secured import server_connection
    from .edge.aggregator import EdgeAggregator, EdgeConfig, default_group_fleet
    from .edge.relay import EdgeOptions

    logging.getLogger().setLevel(min(logging.getLogger().level, logging.INFO))
    try:
        group_login: dict = {}
        if group_security_dir:
            address, group_ca, security = server_connection(group_security_dir, group_broker_url)
            if security.fleet != (group_fleet or default_group_fleet(fleet, edge_id)):
                raise ValueError(f"{group_security_dir} holds the accounts of fleet {security.fleet!r}, "
                                 f"not the group's")
            user, secret = security.server_credentials()
            group_login = {"group_broker_url": address.url, "group_username": user, "group_password": secret,
                           "group_ca_file": group_ca}
        else:
            group_login = {"group_broker_url": group_broker_url}
        config = EdgeConfig(
            broker_url=broker_url, fleet=fleet, edge_id=edge_id, run_dir=run_dir, tier=tier,
            group_fleet=group_fleet, **group_login, min_devices=min_devices,
            devices_wait_s=devices_wait, username=username, password=password, ca_file=ca_file,
            insecure=insecure,
            options=EdgeOptions(max_clusters=max_clusters, smashed_samples=smashed_samples,
                                pair_threshold=pair_threshold, projection_lambda=projection_lambda,
                                projection_epochs=projection_epochs, warmup_epochs=warmup_epochs, seed=seed),
        )
        aggregator = EdgeAggregator(config)
    except (ValueError, SecurityDirError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from None
    signal.signal(signal.SIGTERM, lambda *_: aggregator.stop())
    console.print(f"edge {edge_id}: group fleet {config.group_fleet}, joining fleet {fleet} on {broker_url}")
    try:
        aggregator.run()
    except (RuntimeError, ConnectionError) as exc:
        raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:
        aggregator.stop()


def _attach_server_data(method, data, server_data: Path | None, seed: int) -> None:
    """Give a method that wants server data (``server_fraction`` > 0) the ``--server-data``
    npz, or else its share of the dataset's training split (the fleet's devices bring their
    own data, so that split is the server's)."""
    from sdk_device.data.npz import load_npz

    from .data.server_slice import take_server_slice

    if method.server_fraction <= 0:
        if server_data:
            console.print(f"[yellow]--server-data ignored: {method.name} uses no server data[/]")
        return
    if server_data:
        x, y = load_npz(server_data)
        source = str(server_data)
    else:
        x, y = take_server_slice(data.x_train, data.y_train, method.server_fraction, seed).server
        source = f"{method.server_fraction:.0%} of the training split of {data.name}"
    method.attach_server_data(x, y)
    console.print(f"server data: {len(y)} samples ({source})")


@main.group()
def devices() -> None:
    """Manage the fleet registry of a run directory."""


@devices.command("add")
@click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path), required=True)
@click.option("--tier", default=None)
@click.argument("device_ids", nargs=-1, required=True)
def devices_add(run_dir, tier, device_ids) -> None:
    """Register devices by hand so the server accepts them (`pair-code` + `fedsdk pair` do it for you)."""
    from sdk_device.protocol.topics import check_name

    from .fleet.registry import FleetRegistry

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

    from .fleet.registry import FleetRegistry

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


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=1883, show_default=True)
@click.option("--insecure-embedded-broker", is_flag=True, help="Allow a non-loopback --host.")
@click.option("--mosquitto", "use_mosquitto", is_flag=True, help="Run mosquitto instead of amqtt.")
@click.option(
    "--security",
    "security_dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="With --mosquitto: enforce this broker security directory (accounts, ACL, TLS, listener).",
)
def broker(host, port, insecure_embedded_broker, use_mosquitto, security_dir) -> None:
    """Run a broker in the foreground: embedded amqtt (loopback trials) or mosquitto."""
    import signal
    import sys
    import time

    from .broker.embedded import EmbeddedBroker, refuse_secured_mode
    from .broker.mosquitto import MosquittoBroker
    from .broker.secured import start_secured_broker

    try:
        if security_dir and not use_mosquitto:
            refuse_secured_mode()
        if security_dir:
            b = start_secured_broker(security_dir).broker
        elif use_mosquitto:
            if not is_loopback(host):
                raise ValueError(f"an anonymous mosquitto on {host} would let anyone in: "
                                 "use --security DIR (fedsdk-server security init)")
            b = MosquittoBroker(port, host).start()
        else:
            b = EmbeddedBroker(host, port, allow_remote=insecure_embedded_broker).start()
    except (ValueError, FileNotFoundError, RuntimeError, TimeoutError) as exc:
        raise click.ClickException(str(exc)) from None
    kind = "mosquitto" + (f" (accounts and ACL of {security_dir})" if security_dir else "")
    console.print(f"{kind if use_mosquitto else 'embedded broker'} on {b.address.url}; Ctrl-C stops it")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stop the child broker on SIGTERM too
    try:
        while b.proc and b.proc.poll() is None:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        b.stop()


main.add_command(certs)
main.add_command(security)
main.add_command(pair_code)
devices.add_command(devices_show)
devices.add_command(devices_revoke)
devices.add_command(devices_retier)
main.add_command(hn)
main.add_command(report)
main.add_command(datasets)
main.add_command(methods)

if __name__ == "__main__":
    main()
