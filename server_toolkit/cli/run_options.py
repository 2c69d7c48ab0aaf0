"""Every option of ``fedsdk-server run``, in the order ``--help`` shows them: its own (broker,
security, run directory, ...) defined here, the ones it shares with ``simulate`` taken from
``options.py`` and the options modules. ``cli/config_build.py`` turns them into a ``RunConfig``."""

from __future__ import annotations

from pathlib import Path

import click

from .aliases import Aliased
from .async_options import async_options
from .config_file import config_option
from .observe_options import observe_options
from .options import (
    divergence_option,
    holdout_option,
    method_choice,
    method_option,
    norm_bound_option,
    recipe_options,
    round_timeout_option,
    rounds_option,
    selection_options,
    stacked,
)
from .pairing import pairing_options
from .privacy_options import privacy_options
from .secagg_options import secagg_options

broker_options = stacked(
    click.option(
        "--broker", "broker_url", default=None,
        help="mqtt[s]://host:port of the fleet's broker (default: embedded, loopback only); "
             "mqtt://h1:p1,h2:p2 for cluster nodes (failover); "
             "?retain=0: a broker without retained messages.",
    ),
    click.option("--insecure-embedded-broker", is_flag=True,
                 help="Let the embedded broker bind a non-loopback --host (no auth, no limits)."),
    click.option("--host", default="127.0.0.1", show_default=True, help="Embedded broker address."),
    click.option("--port", default=1883, show_default=True, help="Embedded broker port."),
    click.option(
        "--security-dir", "--broker-security", "security_dir", cls=Aliased, aliases=["--broker-security"],
        type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
        help="Broker security directory (security init): log in as fedsdk-server, manage device accounts; "
        "the fleet's devices and pairing codes live there, shared by every run of the fleet.",
    ),
    click.option("--ca-file", type=click.Path(exists=True, dir_okay=False), help="CA to trust for mqtts://."),
    click.option("--insecure", is_flag=True, help="Allow plain mqtt:// to a non-loopback broker."),
    click.option("--fleet", required=True, help="Fleet name (devices use the same)."),
    click.option(
        "--run-dir", type=click.Path(file_okay=False, path_type=Path), required=True,
        help="Where this run's rounds, updates, blobs, checkpoints and metrics live (and the fleet's "
        "devices, without --security-dir).",
    ),
)

task_options = stacked(
    method_choice,
    click.option("--model", default="small_cnn", show_default=True,
                 help="The global model: a zoo name (see `simulate --help`), or your nn.Module as "
                 "pkg.module:build or file.py[:build] (docs/byo.md)."),
    click.option("--dataset", default="digits", show_default=True,
                 help="digits, mnist, fashion_mnist, npz:<path> or a loader (docs/byo.md): "
                 "defines the model's input/classes; its test split evaluates the global model."),
    click.option("--data-dir", type=click.Path(file_okay=False), help="Where mnist / fashion_mnist live."),
    click.option(
        "--server-data", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
        help="npz (x, y) the server keeps for methods that tune on data of their own (fedconv); "
        "default: the method's share of --dataset's training split.",
    ),
    method_option,
)

round_options = stacked(
    rounds_option,
    click.option("--min-devices", default=1, show_default=True,
                 help="Devices online before any round starts; fewer: the round waits."),
    click.option("--fleet-timeout", default=600.0, show_default=True,
                 help="Seconds a round waits for --min-devices to come back before the run fails."),
    norm_bound_option,
    selection_options,
    round_timeout_option,
    recipe_options,
    click.option("--seed", default=0, show_default=True, help="Seed of the models and device sampling."),
    click.option("--resume", is_flag=True, help="Continue from the last checkpoint in --run-dir."),
    divergence_option,
    holdout_option,
)

run_options = stacked(broker_options, task_options, round_options, pairing_options, privacy_options,
                      observe_options, secagg_options, async_options, config_option)
