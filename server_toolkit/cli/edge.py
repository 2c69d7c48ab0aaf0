"""``fedsdk-server edge``: an edge aggregator between the server and a group of devices."""

from __future__ import annotations

from pathlib import Path

import click

from .aliases import Aliased
from .config_build import split_list
from .options import console, kernels_option, method_option, parse_options, programs_option
from .secagg_options import secagg_options


@click.command()
@click.option("--broker", "broker_url", required=True, help="mqtt[s]://host:port of the server's broker.")
@click.option("--fleet", required=True, help="The server's fleet name.")
@click.option("--edge-id", required=True, help="This edge's device id in the server's fleet.")
@click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="The edge's registry (its devices), blobs and checkpoints.")
@click.option("--tier", default=None, help="The tier (shrinkage ratio) of this edge's devices, e.g. 0.5.")
@click.option("--group-fleet", default=None, help="Fleet of the group's devices [default: FLEET.EDGE_ID].")
@click.option("--group-broker", "group_broker_url", default=None,
              help="Broker of the group's devices [default: --broker, or GROUP_SECURITY's listener].")
@click.option("--group-security-dir", "--group-broker-security", "group_security_dir", cls=Aliased,
              aliases=["--group-broker-security"], type=click.Path(exists=True, file_okay=False),
              help="Security directory of a secured group broker (security init --fleet GROUP_FLEET): "
                   "the edge serves its group with that directory's server account and CA.")
@click.option("--min-devices", default=1, show_default=True, help="Group devices to wait for before joining.")
@click.option("--devices-wait", default=120.0, show_default=True, help="Seconds to wait for them at most.")
@click.option("--clients-per-round", type=click.IntRange(min=1), default=None,
              help="Group devices asked per group round (chosen at random among the online ones) "
                   "[default: every online device].")
@click.option("--max-clusters", default=8, show_default=True, help="Largest K tried by the clustering.")
@click.option("--smashed-samples", default=128, show_default=True,
              help="Last-layer inputs asked per device and round; 0 turns the projection stage off.")
@click.option("--pair-threshold", default=1.0, show_default=True,
              help="Link clusters closer than this x the median client-pair KLD.")
@click.option("--projection-lambda", default=0.5, show_default=True, help="λ of FedConv's Eq. 8.")
@click.option("--projection-epochs", default=2, show_default=True,
              help="Epochs of the projection the edge trains on its clusters.")
@click.option("--warmup-epochs", default=1, show_default=True, help="Local epochs of the clustering warm-up.")
@click.option("--seed", default=0, show_default=True, help="Seed of the clustering.")
@click.option("--method", default=None,
              help="Be a generic edge for the server's --method: partial sums for averaging methods (fedavg, "
                   "heterofl, depthfl, …), each member's update for the others (feddm, hypemefed, …). "
                   "Unset: FedConv's clustering edge.")
@method_option
@secagg_options
@programs_option
@kernels_option
@click.option("--username", envvar="FEDSDK_MQTT_USERNAME", help="Broker user (or FEDSDK_MQTT_USERNAME).")
@click.option("--password", envvar="FEDSDK_MQTT_PASSWORD", help="Broker password (or FEDSDK_MQTT_PASSWORD).")
@click.option("--ca-file", type=click.Path(exists=True, dir_okay=False), help="CA to trust for mqtts://.")
@click.option("--insecure", is_flag=True, help="Allow plain mqtt:// to a non-loopback broker.")
def edge(broker_url, fleet, edge_id, run_dir, tier, group_fleet, group_broker_url, group_security_dir,
         min_devices, devices_wait, clients_per_round, max_clusters, smashed_samples, pair_threshold,
         projection_lambda, projection_epochs, warmup_epochs, seed, method, method_options, secagg,
         program_formats, pte_kernels, username, password, ca_file, insecure) -> None:
    """Run an edge aggregator: a device of the server's fleet, the server of its own group.

    Register the edge on the server (`devices add --run-dir SERVER_DIR --tier T EDGE_ID`)
    and its devices here (`devices add --run-dir EDGE_DIR DEVICE_ID`); devices then run
    `fedsdk run --fleet FLEET.EDGE_ID …`. With `--method` (the server's method and
    `--method-option`s) the edge is generic: its group may mix tiers, it may serve other
    edges, and the server's result equals the flat aggregate (docs/operations.md); for a
    method that is not a sum it forwards each member's update (bundle tasks). With
    `--secagg` (a generic edge, at least 3 devices) each group round is a secure
    aggregation: the edge unmasks only its group's sum and sends that up (docs/privacy.md).
    A generic edge exports its group's programs in `--programs` (e.g. pte/1 for torch-free
    devices); FedConv's edge forwards the server's.
    """
    import signal

    from ..broker.mosquitto_auth import SecurityDirError
    from ..broker.secured import server_connection
    from ..edge.aggregator import EdgeAggregator, EdgeConfig, default_group_fleet
    from ..methods.fedconv.relay import EdgeOptions

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
            devices_wait_s=devices_wait, clients_per_round=clients_per_round, username=username,
            password=password, ca_file=ca_file, insecure=insecure,
            options=EdgeOptions(max_clusters=max_clusters, smashed_samples=smashed_samples,
                                pair_threshold=pair_threshold, projection_lambda=projection_lambda,
                                projection_epochs=projection_epochs, warmup_epochs=warmup_epochs, seed=seed),
            method=method, method_options=parse_options(method_options), secagg=secagg,
            program_formats=split_list(program_formats), pte_kernels=pte_kernels,
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


