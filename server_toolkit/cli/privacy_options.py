"""``--dp-*``, ``--label-noise-epsilon`` and ``--robust`` of ``run`` and ``simulate``
(``server_toolkit/privacy``, ``docs/privacy.md``), checked before anything starts."""

from __future__ import annotations

import click

NAMES = ("dp_clip", "dp_adaptive_clip", "dp_noise_multiplier", "dp_mode", "dp_delta", "dp_epsilon",
         "label_noise_epsilon", "robust", "trim_fraction")


def privacy_options(f):
    """The privacy and robust-aggregation options of a command that runs rounds."""
    for opt in reversed([
        click.option("--dp-clip", type=float, default=None, metavar="C",
                     help="Differential privacy: clip each device's update delta to L2 norm C (with "
                     "--dp-adaptive-clip: the first C). Only methods that average model windows."),
        click.option("--dp-adaptive-clip", type=float, default=None, metavar="QUANTILE",
                     help="Adapt C each round towards this quantile of the update norms (Andrew et al. "
                     "2021; central mode; the noised count is charged to the budget)."),
        click.option("--dp-noise-multiplier", type=float, default=0.0, show_default=True, metavar="Z",
                     help="Gaussian noise std = Z x C (0: clipping only, epsilon infinite)."),
        click.option("--dp-mode", type=click.Choice(["central", "local"]), default="central",
                     show_default=True,
                     help="central: the (trusted) server noises the sum; local: each device noises its "
                     "own clipped delta."),
        click.option("--dp-delta", type=float, default=1e-5, show_default=True,
                     help="The delta epsilon is reported for (metrics dp_epsilon, summary.json)."),
        click.option("--dp-epsilon", type=float, default=None, metavar="BUDGET",
                     help="Stop cleanly before the round that would take epsilon past BUDGET."),
        click.option("--label-noise-epsilon", type=float, default=None, metavar="EPS",
                     help="Devices add Laplace(1/EPS) noise to the label histograms they send "
                     "(EPS charged per report; methods that ask for histograms)."),
        click.option("--robust", type=click.Choice(["median", "trimmed-mean"]), default=None,
                     help="Aggregate by coordinate-wise median or trimmed mean over the devices covering "
                     "each element (FedAvg and the width methods)."),
        click.option("--trim-fraction", type=float, default=0.1, show_default=True,
                     help="For --robust trimmed-mean: the fraction cut from each end, in [0, 0.5)."),
    ]):
        f = opt(f)
    return f


def privacy_settings(values: dict, method: str, rate: float | None = None):
    """``PrivacySettings`` from the options in ``values`` (removed from it), checked against
    ``method`` (ClickException with one line if they do not fit); None when none was given."""
    from ..methods import method_class
    from ..privacy.settings import PrivacySettings

    given = {name: values.pop(name) for name in NAMES if name in values}
    adaptive = given.get("dp_adaptive_clip")
    clip = given.get("dp_clip")
    settings = PrivacySettings(
        clip=clip if clip is not None else (1.0 if adaptive is not None else None),
        adaptive_quantile=adaptive, noise_multiplier=given.get("dp_noise_multiplier") or 0.0,
        mode=given.get("dp_mode") or "central", delta=given.get("dp_delta") or 1e-5,
        epsilon_budget=given.get("dp_epsilon"), label_epsilon=given.get("label_noise_epsilon"),
        robust=given.get("robust"), trim_fraction=given.get("trim_fraction", 0.1))
    try:
        settings.check(method_class(method), rate)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    return settings if settings.active else None
