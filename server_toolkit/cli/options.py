"""Options and helpers shared by several ``fedsdk-server`` commands."""

from __future__ import annotations

import json

import click
from rich.console import Console

from fedcore.recipe import DEFAULT_LR, DEFAULT_MAX_STEPS

from .method_choice import MethodOption

console = Console()

# One default for `run` and `simulate`: a round of a real fleet's slow devices (a Pi training a
# ResNet) needs minutes; a round ends as soon as every update is in, so only failures wait this long.
ROUND_TIMEOUT_S = 300.0


def recipe_options(f):
    """The device recipe options every training command takes."""
    for opt in reversed(
        [
            click.option("--local-epochs", default=5, show_default=True, help="Local epochs per round."),
            click.option("--batch-size", default=16, show_default=True, help="Samples per local step."),
            click.option("--lr", default=DEFAULT_LR, show_default=True,
                         help="Client learning rate (per optimiser step)."),
            click.option("--max-steps", default=DEFAULT_MAX_STEPS, show_default=True,
                         help="At most this many local optimiser steps per round on a device, "
                         "whatever its data size (a device with more data stops part-way through "
                         "its epochs); 0: no bound (every device makes all its epochs)."),
            click.option("--optimizer", type=click.Choice(["sgd", "adam"]), default="sgd", show_default=True,
                         help="Client optimizer."),
        ]
    ):
        f = opt(f)
    return f


def stacked(*decorators):
    """One decorator applying ``decorators`` so that their options show in the given order."""
    def apply(f):
        for decorator in reversed(decorators):
            f = decorator(f)
        return f

    return apply


# The options `run` and `simulate` spell alike (each command lists them in its own order).
method_choice = click.option("--method", default="fedavg", show_default=True, cls=MethodOption,
                             help="Federated method.")
rounds_option = click.option("--rounds", default=20, show_default=True,
                             help="Rounds in all (--resume: up to this round).")
norm_bound_option = click.option(
    "--norm-bound", default=10.0, show_default=True,
    help="Clip an update's change per weight (RMS) to this many times the round's median of the "
         "models of its shape (0: off).")
round_timeout_option = click.option("--round-timeout", default=ROUND_TIMEOUT_S, show_default=True,
                                    help="Round time limit, s.")
programs_option = click.option(
    "--programs", "program_formats", default="torchspec/1", show_default=True,
    help="Program formats offered to devices, comma-separated (torchspec/1, pte/1, ...).")
kernels_option = click.option(
    "--pte-kernels", "pte_kernels", type=click.Choice(["portable", "fused"]), default="fused",
    show_default=True,
    help="Kernel set of the pte/1 programs: fused (fedsdk's training kernels, faster) or portable "
         "(ExecuTorch's own ops). A device whose runtime lacks the fused kernels refuses them and gets "
         "portable programs.")
selection_options = stacked(
    click.option("--clients-per-round", type=int, default=None, help="Quorum per round (default: all)."),
    click.option("--fraction", type=float, default=None, help="Quorum as a fraction of online devices."),
    click.option("--over-select", default=0.0, show_default=True, help="Extra fraction of devices asked."),
)


def parse_options(pairs: tuple[str, ...]) -> dict:
    """``("k=v", ...)`` -> dict; values are JSON when they parse (numbers, lists, true), else strings."""
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


divergence_option = click.option(
    "--on-divergence", type=click.Choice(["rollback", "stop", "continue"]), default="rollback",
    show_default=True,
    help="When the global model diverges (its test accuracy below half its best for 3 evaluations in a "
    "row, or a NaN loss): rollback = restore the best weights and halve the devices' lr (the 4th time: "
    "stop); stop = end the run; continue = only record it. The best model is kept either way "
    "(checkpoints/best.safetensors).")

holdout_option = click.option(
    "--holdout", type=click.FloatRange(0.0, 0.5), default=0.0, show_default=True, metavar="FRACTION",
    help="Each device holds back this fraction of its samples (stratified by label, the same every "
    "round), never trains on it and scores the model it received on it before training (DepthFL: the "
    "mean softmax of its exits and final output, as its tier deploys it); rows get "
    "accuracy_holdout and accuracy_holdout_tier_<tier>. 0: off (devices train on all their data). "
    "Devices that do not know it train on everything and report nothing.")

method_option = click.option(
    "--method-option",
    "method_options",
    multiple=True,
    metavar="KEY=VALUE",
    help="A method-specific option (repeatable); VALUE is parsed as JSON when it can be.",
)


