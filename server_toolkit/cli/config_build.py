"""Flags (and ``--config`` files, already click's defaults) -> the run's typed configuration
(``server_config.py``), once, for ``run`` and ``simulate``.

Every option of the command lands in exactly one place: a field of the configuration class
(same name; the few renamed or parsed ones below), the observers' ``ObserveSettings``, or
``placement`` (what the command itself decides, e.g. ``simulate``'s ``--runs-dir``). An option
that fits none is a programming error (``TypeError``), so a new flag cannot be dropped silently.
"""

from __future__ import annotations

import dataclasses
from typing import TypeVar

from fedcore.recipe import Recipe

from ..server_config import ObserveSettings, ServerConfig
from .options import parse_options
from .privacy_options import privacy_settings

Config = TypeVar("Config", bound=ServerConfig)

RECIPE = ("local_epochs", "batch_size", "lr", "max_steps", "optimizer")
RENAMED = {"round_timeout": "round_timeout_s", "fleet_timeout": "fleet_timeout_s"}


def split_list(text: str | None) -> list[str] | None:
    """``"1.0, 0.5"`` -> ``["1.0", "0.5"]``; None or only commas -> None."""
    items = [t.strip() for t in (text or "").split(",") if t.strip()]
    return items or None


def build_config(cls: type[Config], options: dict, sampling_rate: float | None = None,
                 placement: tuple[str, ...] = ()) -> tuple[Config, ObserveSettings, dict]:
    """``(config, observers' settings, placement options)`` from a command's keyword arguments.
    ``sampling_rate``: the share of devices a round asks for (privacy accounting; None: unknown).
    ClickException (one line) when the privacy options do not fit the method."""
    options = dict(options)
    observe = ObserveSettings(**{f.name: options.pop(f.name) for f in dataclasses.fields(ObserveSettings)})
    placed = {name: options.pop(name) for name in placement}
    recipe = Recipe(epochs=options.pop("local_epochs"), batch_size=options.pop("batch_size"),
                    lr=options.pop("lr"), optimizer=options.pop("optimizer"), seed=options["seed"],
                    max_steps=options.pop("max_steps"))
    privacy = privacy_settings(options, options["method"], sampling_rate)  # takes the privacy options
    values = {RENAMED.get(name, name): value for name, value in options.items()}
    values.update(
        recipe=recipe.to_dict(),
        privacy=privacy.to_dict() if privacy else None,
        norm_bound=values["norm_bound"] or None,
        tiers=split_list(values.get("tiers")),
        method_options=parse_options(values["method_options"]),
        program_formats=split_list(values["program_formats"]) or [],
    )
    fields = {f.name for f in dataclasses.fields(cls)}
    stray = sorted(set(values) - fields)
    if stray:
        raise TypeError(f"{cls.__name__} has no field for the option(s) {', '.join(stray)}")
    return cls(**values), observe, placed
