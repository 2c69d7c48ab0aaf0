"""``fedsdk-server run``: serve a real fleet (and pair new devices meanwhile)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from fedcore.recipe import Recipe

from .aliases import Aliased
from .async_options import async_options
from .config_file import config_option
from .method_choice import MethodOption
from .observe_options import hold_dashboard, observe_options, observed, open_observers
from .options import ROUND_TIMEOUT_S, console, divergence_option, method_option, parse_options, recipe_options
from .pairing import pairing_options, parse_tiers
from .privacy_options import privacy_options, privacy_settings
from .progress import RoundProgress, print_outcome
from .secagg_options import secagg_options
from .validate import validated


@click.command()
@click.option(
    "--broker",
    "broker_url",
    default=None,
    help="mqtt[s]://host:port of the fleet's broker (default: embedded, loopback only); "
         "mqtt://h1:p1,h2:p2 for cluster nodes (failover); ?retain=0: a broker without retained messages.",
)
@click.option(
    "--insecure-embedded-broker",
    is_flag=True,
    help="Let the embedded broker bind a non-loopback --host (no auth, no limits).",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Embedded broker address.")
@click.option("--port", default=1883, show_default=True, help="Embedded broker port.")
@click.option(
    "--security-dir",
    "--broker-security",
    "security_dir",
    cls=Aliased,
    aliases=["--broker-security"],
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="Broker security directory (security init): log in as fedsdk-server, manage device accounts; "
    "the fleet's devices and pairing codes live there, shared by every run of the fleet.",
)
@click.option("--ca-file", type=click.Path(exists=True, dir_okay=False), help="CA to trust for mqtts://.")
@click.option("--insecure", is_flag=True, help="Allow plain mqtt:// to a non-loopback broker.")
@click.option("--fleet", required=True, help="Fleet name (devices use the same).")
@click.option(
    "--run-dir",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Where this run's rounds, updates, blobs, checkpoints and metrics live (and the fleet's "
    "devices, without --security-dir).",
)
@click.option("--method", default="fedavg", show_default=True, cls=MethodOption, help="Federated method.")
@click.option("--model", default="small_cnn", show_default=True,
              help="The global model: a zoo name (see `simulate --help`), or your nn.Module as "
              "pkg.module:build or file.py[:build] (docs/byo.md).")
@click.option(
    "--dataset",
    default="digits",
    show_default=True,
    help="digits, mnist, fashion_mnist, npz:<path> or a loader (docs/byo.md): defines the model's "
    "input/classes; "
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
@method_option
@click.option("--rounds", default=20, show_default=True, help="Rounds in all (--resume: up to this round).")
@click.option("--min-devices", default=1, show_default=True,
              help="Devices online before any round starts; fewer: the round waits.")
@click.option("--fleet-timeout", default=600.0, show_default=True,
              help="Seconds a round waits for --min-devices to come back before the run fails.")
@click.option("--norm-bound", default=10.0, show_default=True,
              help="Clip an update's change per weight (RMS) to this many times the round's median (0: off).")
@click.option("--clients-per-round", type=int, default=None, help="Quorum per round (default: all).")
@click.option("--fraction", type=float, default=None, help="Quorum as a fraction of online devices.")
@click.option("--over-select", default=0.0, show_default=True, help="Extra fraction of devices asked.")
@click.option("--round-timeout", default=ROUND_TIMEOUT_S, show_default=True, help="Round time limit, s.")
@recipe_options
@click.option("--seed", default=0, show_default=True, help="Seed of the models and device sampling.")
@click.option("--resume", is_flag=True, help="Continue from the last checkpoint in --run-dir.")
@divergence_option
@pairing_options
@privacy_options
@observe_options
@secagg_options
@async_options
@config_option
@validated
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
    fleet_timeout,
    norm_bound,
    secagg,
    clients_per_round,
    fraction,
    over_select,
    round_timeout,
    local_epochs,
    batch_size,
    lr,
    max_steps,
    optimizer,
    seed,
    resume,
    on_divergence,
    tiers,
    program_formats,
    device_url,
    pair_max_failures,
    pair_lockout,
    dashboard,
    dashboard_token,
    dashboard_hold,
    log_to,
    mode,
    buffer,
    max_staleness,
    concurrency,
    server_lr,
    eval_every,
    **privacy_values,
) -> None:
    """Serve a real fleet, and pair new devices meanwhile (`fedsdk-server pair-code`).

    Devices join with `fedsdk pair` (or, registered by hand, `fedsdk run --broker ... --fleet ...
    --device-id ...`)."""
    from sdk_device.protocol.topics import FleetTopics
    from sdk_device.transport.blob_store import BlobStore
    from sdk_device.transport.endpoint import Endpoint
    from sdk_device.transport.mqtt_link import BrokerAddress

    from ..assembly import aggregation_stack, assemble, attach_server_data
    from ..broker.embedded import EmbeddedBroker
    from ..broker.mosquitto_auth import SecurityDirError
    from ..broker.secured import server_connection
    from ..fleet.fleet_store import fleet_dir, fleet_file
    from ..fleet.pair_codes import LockoutPolicy
    from ..fleet.pairing_setup import describe_fleet, device_url_for, start_pairing
    from ..fleet.registry import FleetRegistry
    from ..privacy.round_privacy import privacy_summary
    from ..report.run_report import RunReport
    from ..rounds.loop import FleetLost, LoopConfig, NoUpdates
    from ..rounds.modes import async_config, make_loop
    from ..rounds.quality_guard import guard_summary
    from ..secagg.mqtt_grid import secagg_grid

    recipe = Recipe(epochs=local_epochs, batch_size=batch_size, lr=lr, optimizer=optimizer, seed=seed,
                        max_steps=max_steps)
    privacy = privacy_settings(privacy_values, method)
    try:
        setup = assemble(method, model, dataset, data_dir, recipe, parse_options(method_options), seed)
        described = attach_server_data(setup.method, setup.data, server_data, seed)
    except (ValueError, TypeError) as exc:
        raise click.ClickException(str(exc)) from None
    if described:
        console.print(described)
    elif server_data:
        console.print(f"[yellow]--server-data ignored: {method} uses no server data[/]")
    data, the_method = setup.data, setup.method
    observers = open_observers(dashboard, dashboard_token, log_to, run_dir.name)
    registry = None
    broker = None
    username = password = None
    try:
        if security_dir:
            address, ca_file, broker_security = server_connection(security_dir, broker_url, ca_file)
            if broker_security.fleet != fleet:
                raise ValueError(f"{security_dir} holds the accounts of fleet {broker_security.fleet!r}, "
                                 f"not {fleet!r}")
            username, password = broker_security.server_credentials()
            security_dir = security_dir.resolve()  # fleet.json: pair-code may run from elsewhere
        elif broker_url:
            address = BrokerAddress.parse(broker_url)
        else:
            broker = EmbeddedBroker(host, port, allow_remote=insecure_embedded_broker).start()
            address = broker.address
        registry = FleetRegistry(run_dir / "registry.sqlite", fleet_file(run_dir, security_dir))
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
        if registry:
            registry.close()
        raise click.ClickException(str(exc)) from None
    report = (
        RunReport.load(run_dir) if resume and (run_dir / "metrics.jsonl").exists() else RunReport(run_dir)
    )
    settings = async_config(mode, buffer, max_staleness, concurrency, server_lr, eval_every)
    grid = secagg_grid(endpoint, registry, the_method, secagg, seed, settings, fetch_timeout_s=round_timeout,
                       program_formats=[f.strip() for f in program_formats.split(",")])
    config = {"method": method, "model": model, "dataset": dataset, "fleet": fleet, "rounds": rounds,
              "clients_per_round": clients_per_round, "fraction": fraction, "round_timeout_s": round_timeout,
              "seed": seed, "recipe": recipe.to_dict(), "method_options": parse_options(method_options),
              "mode": mode, "buffer": buffer, "max_staleness": max_staleness, "concurrency": concurrency,
              "server_lr": server_lr, "eval_every": eval_every, "on_divergence": on_divergence}
    (run_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    observers.begin(config, report.rows)
    observers.watch_registry(registry, run_dir / "registry.sqlite", grid, fleet_path=registry.fleet_path)
    loop = make_loop(
        the_method, grid,
        LoopConfig(rounds=rounds, clients_per_round=clients_per_round, fraction=fraction,
                   over_select=over_select, round_timeout_s=round_timeout, seed=seed,
                   tier_map=setup.tier_map, min_devices=min_devices, fleet_timeout_s=fleet_timeout,
                   norm_bound=None if secagg else norm_bound or None,  # secagg: no update in the clear
                   on_divergence=on_divergence),
        settings,
        aggregator=aggregation_stack(the_method, norm_bound or None, privacy, bool(secagg), settings),
        run_dir=run_dir,
        test_data=(data.x_test, data.y_test),
        on_round=lambda row: (report.add_round(row), observers.add_round(row), progress.round(row)),
    )
    pairing = None
    progress = RoundProgress(rounds, f"waiting for {min_devices} device(s)")
    with observed(observers, run_dir), progress:
        try:
            endpoint.start()
            loop.start(resume=resume)
            pairing = start_pairing(run_dir, fleet_info, address, the_method, registry, grid.programs,
                                    username=username, password=password, ca_file=ca_file, insecure=insecure,
                                    security=broker_security if security_dir else None,
                                    fleet_home=fleet_dir(run_dir, security_dir))
            unsecured = "" if security_dir else " (no --security-dir: the broker enforces no accounts)"
            console.print(f"pairing open: make a code with `fedsdk-server pair-code --run-dir {run_dir}`"
                          + unsecured)
            known = sum(not state.revoked for state in registry.states().values())
            console.print(f"fleet {fleet}: {known} device(s) registered (in {registry.fleet_path})",
                          soft_wrap=True)
            console.print(f"serving fleet {fleet} on {address.url}; waiting for {min_devices} device(s)")
            while grid.wait_for_devices(min_devices, timeout_s=30) < min_devices:
                progress.note(f"{len(grid.devices)}/{min_devices} devices online, still waiting")
            loop.run()
        except (FleetLost, NoUpdates) as exc:
            raise click.ClickException(str(exc)) from None
        finally:
            if pairing:
                pairing.close()
            grid.close()
            endpoint.close()
            registry.close()  # writes the devices' last hello/status bookkeeping
            if broker:
                broker.stop()
            if report.rows:  # also when stopped (Ctrl-C) or failed: the rounds that finished are kept
                report.write_plot()
            report.write_summary({"method": method, "dataset": dataset, "fleet": fleet,
                                  **privacy_summary(loop), **guard_summary(loop)})
            stopped = loop.completed_round < rounds
            print_outcome(report, f"{method} on fleet {fleet}", run_dir, stopped=stopped)
    hold_dashboard(observers, dashboard_hold)
