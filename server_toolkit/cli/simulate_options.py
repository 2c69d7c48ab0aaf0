"""Every option of ``fedsdk-server simulate``, in the order ``--help`` shows them: its own (the
simulated devices, their data partition, where the run is written) defined here, the ones it
shares with ``run`` taken from ``options.py`` and the options modules. ``cli/config_build.py``
turns them into a ``SimulationConfig``; ``PLACEMENT`` are the options ``simulate`` itself uses."""

from __future__ import annotations

from pathlib import Path

import click

from .async_options import async_options, straggler_options
from .config_file import config_option
from .observe_options import observe_options
from .options import (
    divergence_option,
    holdout_option,
    kernels_option,
    method_choice,
    method_option,
    norm_bound_option,
    programs_option,
    recipe_options,
    round_timeout_option,
    rounds_option,
    selection_options,
    stacked,
)
from .privacy_options import privacy_options
from .secagg_options import secagg_options

PLACEMENT = ("resume_dir", "runs_dir", "run_dir_option")  # where the run is written, not what it is

data_options = stacked(
    method_choice,
    click.option("--dataset", default="digits", show_default=True,
                 help="digits (bundled), mnist, fashion_mnist (see `datasets list`), npz:<path>, "
                 "or your loader as pkg.module:load or file.py[:load] (docs/byo.md)."),
    click.option("--train-samples", type=click.IntRange(min=1), default=None,
                 help="Use a label-stratified subset of this many training samples (default: all)."),
    click.option("--test-samples", type=click.IntRange(min=1), default=None,
                 help="Evaluate on a label-stratified subset of this many test samples (default: all)."),
    click.option("--data-dir", type=click.Path(file_okay=False),
                 help="Where mnist / fashion_mnist live (npz or IDX files; `datasets fetch` gets them)."),
    click.option("--model", default="small_cnn", show_default=True,
                 help="small_cnn, lenet5, vgg_multi_exit, lenet5_multi_exit, resnet_small, lenet, vgg8, "
                 "resnet10/12/18 or mlp (fedsdk-server methods list shows what each method expects); or your "
                 "nn.Module as pkg.module:build or file.py[:build] (docs/byo.md)."),
    click.option("--devices", default=8, show_default=True, help="Device processes to start (<= 10 here)."),
    rounds_option,
    selection_options,
    click.option("--partition", default="dirichlet", show_default=True,
                 type=click.Choice(["iid", "dirichlet", "k-classes", "quantity-skew"]),
                 help="How the training split is divided among the devices."),
    click.option("--alpha", default=0.5, show_default=True, help="Dirichlet concentration."),
    click.option("--classes-per-client", default=2, show_default=True, help="For k-classes."),
    click.option("--num-strong", default=1, show_default=True, help="For quantity-skew: strong devices."),
    click.option("--strong-share", default=0.5, show_default=True,
                 help="For quantity-skew: their data share."),
    click.option("--tiers", default=None,
                 help="Comma-separated tier names given to devices round-robin, e.g. 1.0,0.75,0.5,0.25."),
    method_option,
)

device_options = stacked(
    programs_option,
    kernels_option,
    click.option("--device-runtime", default=None, help="Make every simulated device use this runtime."),
    click.option("--grid", type=click.Choice(["mqtt", "inprocess"]), default="mqtt", show_default=True,
                 help="mqtt: device processes over a broker; inprocess: the same devices trained in this "
                 "process (no broker; what the benchmarks run)."),
    click.option("--edges", default=0, show_default=True,
                 help="Edge aggregator processes. fedconv: edge k serves the devices of the k-th tier "
                      "(round-robin); other methods: generic edges, device i behind edge i mod N."),
    click.option("--device-python", default=None,
                 help="Python of the device processes, e.g. .venv-ort/bin/python for "
                 "--device-runtime onnxruntime."),
    recipe_options,
    click.option("--seed", default=0, show_default=True, help="Seed of the partition, models and sampling."),
    round_timeout_option,
    click.option("--min-devices", default=1, show_default=True,
                 help="Devices online before a round starts (the start waits for the whole simulated fleet); "
                      "fewer: the round waits."),
    click.option("--fleet-timeout", default=180.0, show_default=True,
                 help="Seconds a round waits for --min-devices to be online before the run fails; "
                      "also how long the start waits for every device and edge (edges: for their devices)."),
    norm_bound_option,
    click.option("--broker", "broker_url", default=None,
                 help="mqtt://host:port of an existing broker "
                 "(default: start the embedded one on 127.0.0.1)."),
)

place_options = stacked(
    click.option("--runs-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("runs"),
                 show_default=True, help="Where a new run directory (named by the date and time) is made."),
    click.option("--run-dir", "run_dir_option", type=click.Path(file_okay=False, path_type=Path),
                 default=None,
                 help="Write the run into exactly this (new or empty) directory instead."),
    click.option("--label", default=None,
                 help="A name for this run in `fedsdk-server report` (e.g. FedAvg-S)."),
    click.option("--setting", default=None,
                 help="What this run is compared within in `fedsdk-server report` "
                 "(default: dataset, partition, model)."),
    click.option("--resume", "resume_dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
                 help="Continue the run in this directory from its last checkpoint."),
    divergence_option,
    holdout_option,
)

simulate_options = stacked(data_options, device_options, place_options, privacy_options, observe_options,
                           secagg_options, async_options, straggler_options, config_option)
