"""``--mode sync|async``, ``--buffer``, ``--max-staleness``, ``--concurrency``, ``--server-lr`` of
``run`` and ``simulate`` (buffered asynchronous aggregation, ``rounds/async_loop.py``), and
``simulate``'s straggler knobs ``--slow-devices`` / ``--slowdown``.

Every combination is checked before anything starts (no broker, no device, no run
directory): a bad one is a one-line usage error. Checked: the async-only options need
``--mode async``; K >= 1, S >= 0, concurrency >= 1, server lr > 0, eval-every >= 1; the
method must declare a weighted sum (``Method.weighted_sum``, ``methods/capability.py``); async
runs over MQTT (with or without edge aggregators: ``docs/async.md``).
"""

from __future__ import annotations

import functools

import click

from ..rounds.async_loop import AsyncConfig

DEFAULT_BUFFER = AsyncConfig.buffer  # K
DEFAULT_MAX_STALENESS = AsyncConfig.max_staleness  # S
ASYNC_ONLY = ("buffer", "max_staleness", "concurrency", "server_lr", "eval_every")


def async_options(f):
    """The mode options, validated before the command body runs."""
    for opt in reversed([
        click.option("--mode", type=click.Choice(["sync", "async"]), default="sync", show_default=True,
                     help="sync: rounds; async: devices train whenever free and every --buffer updates "
                     "make a new version (docs/async.md)."),
        click.option("--buffer", type=int, default=None,
                     help=f"Async: updates folded into each new global version (K; default "
                     f"{DEFAULT_BUFFER})."),
        click.option("--max-staleness", type=int, default=None,
                     help="Async: drop an update made from a version more than this many versions old "
                     f"(S; default {DEFAULT_MAX_STALENESS})."),
        click.option("--concurrency", type=int, default=None,
                     help="Async: devices training at once (default: every online device)."),
        click.option("--server-lr", type=float, default=None,
                     help="Async: step on the staleness-weighted average delta (default 1.0: plain "
                     "averaging)."),
        click.option("--eval-every", type=int, default=None,
                     help="Async: evaluate the global model on every N-th version and the last one "
                     "only (default 1: every version; evaluating holds the loop)."),
    ]):
        f = opt(f)

    @functools.wraps(f)
    def checked(*args, **kwargs):
        check_async(kwargs)
        return f(*args, **kwargs)

    return checked


def straggler_options(f):
    """``simulate``'s stragglers: a share of the device processes made slower by sleeping."""
    for opt in reversed([
        click.option("--slow-devices", type=click.FloatRange(0.0, 1.0), default=0.0, show_default=True,
                     help="Simulation knob: this share of the devices (chosen by --seed) are stragglers."),
        click.option("--slowdown", type=click.FloatRange(min=1.0), default=10.0, show_default=True,
                     help="Simulation knob: a straggler sleeps (FACTOR - 1) x its training time after "
                     "training (device option `fedsdk run --slowdown`)."),
    ]):
        f = opt(f)
    return f


def check_async(options: dict) -> None:
    """Validate the mode options in ``options`` (a command's keyword arguments) and fill in the
    async defaults; ``click.ClickException`` (one line) for a bad combination."""
    if options.get("resume_dir"):  # simulate --resume: the run's config.json decides
        return
    given = [name for name in ASYNC_ONLY if options.get(name) is not None]
    if options["mode"] == "sync":
        if given:
            flags = ", ".join("--" + name.replace("_", "-") for name in given)
            raise click.ClickException(f"{flags} apply only with --mode async")
        return
    if options.get("buffer") is None:
        options["buffer"] = DEFAULT_BUFFER
    if options.get("max_staleness") is None:
        options["max_staleness"] = DEFAULT_MAX_STALENESS
    if options.get("server_lr") is None:
        options["server_lr"] = 1.0
    if options["buffer"] < 1:
        raise click.ClickException(f"--buffer must be >= 1, got {options['buffer']}")
    if options["max_staleness"] < 0:
        raise click.ClickException(f"--max-staleness must be >= 0, got {options['max_staleness']}")
    if options.get("concurrency") is not None and options["concurrency"] < 1:
        raise click.ClickException(f"--concurrency must be >= 1, got {options['concurrency']}")
    if not options["server_lr"] > 0:
        raise click.ClickException(f"--server-lr must be > 0, got {options['server_lr']}")
    if options.get("eval_every") is not None and options["eval_every"] < 1:
        raise click.ClickException(f"--eval-every must be >= 1, got {options['eval_every']}")
    if options.get("grid", "mqtt") != "mqtt":
        raise click.ClickException("--mode async needs --grid mqtt (devices training at their own pace)")
    from ..methods import method_class
    from ..methods.abilities import async_refusal

    try:
        refusal = async_refusal(method_class(options["method"]))
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    if refusal:
        raise click.ClickException(refusal)
