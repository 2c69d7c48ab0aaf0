"""``--secagg``, ``--secagg-threshold`` and ``--secagg-neighbours`` of ``run`` and ``simulate``:
secure aggregation (``server_toolkit/secagg``, docs/privacy.md). The decorator refuses, with
one line and before anything starts, a method secure aggregation cannot serve, an in-process
grid and edge groups smaller than the secure minimum (``edge/secure_group.py``: with
``--edges`` each edge sums its group securely); it hands the command ``secagg`` = the
settings as a dict, or None. ``fedsdk-server edge`` takes the same options (its group rounds)."""

from __future__ import annotations

import dataclasses
import functools

import click


def secagg_options(f):
    """Add the options to a command that has a ``method`` parameter and a ``secagg`` one."""
    @click.option("--secagg", is_flag=True,
                  help="Secure aggregation (SecAgg+): devices send masked updates, the server only ever "
                  "unmasks their sum. Methods: those that declare a weighted sum (fedavg, fedprox, fedavgm, "
                  "fedavg-l/s-exit, heterofl, fedrolex, depthfl; `methods show`). Turns the norm bound off "
                  "(it compares updates in the clear).")
    @click.option("--secagg-threshold", default=0.5, show_default=True, metavar="FRACTION",
                  type=click.FloatRange(0.5, 1.0, max_open=True),
                  help="t = floor(FRACTION * k) + 1 of a device's k neighbours must survive to unmask it; "
                  "a round completes while every device keeps t surviving neighbours.")
    @click.option("--secagg-neighbours", default=None, type=click.IntRange(2), metavar="K",
                  help="Neighbours per device in the sparse key graph (default: the smallest k for which "
                  "30 % of the devices dropping fails a round with chance <= 0.001; 1,000 devices: 134).")
    @functools.wraps(f)
    def wrapper(*args, secagg: bool, secagg_threshold: float, secagg_neighbours: int | None, **kwargs):
        from ..methods import method_class
        from ..secagg.aggregate import refusal
        from ..secagg.mqtt_grid import SecAggSettings

        settings = None
        if secagg and kwargs.get("method") is None:  # fedsdk-server edge without --method
            raise click.ClickException("--secagg needs a generic edge: give the server's --method")
        if secagg:
            try:
                why = refusal(method_class(kwargs["method"]))
            except ValueError as exc:  # an unknown method: the one-line error lists the known ones
                raise click.ClickException(str(exc)) from None
            if why:
                raise click.ClickException(why)
            if kwargs.get("grid") == "inprocess":
                raise click.ClickException("--secagg runs over MQTT (--grid mqtt)")
            if kwargs.get("edges"):  # the smallest group of simulate's round-robin deal (sim/edges.py)
                from ..edge.secure_group import min_group_error

                why = min_group_error(kwargs.get("devices", 0) // kwargs["edges"], "--secagg --edges")
                if why:
                    raise click.ClickException(f"{why}: use fewer edges or more --devices")
            settings = dataclasses.asdict(SecAggSettings(secagg_threshold, secagg_neighbours))
        return f(*args, secagg=settings, **kwargs)

    return wrapper

