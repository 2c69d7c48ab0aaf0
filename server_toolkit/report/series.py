"""Runs grouped into settings and series, and their statistics over replicates (seeds).

A series' *replicates* are its runs that differ in their seed (or in anything else). Runs with
the same seed and the same configuration (apart from where they ran: fleet, broker, data
directory, label, setting) are *repeats* of one run: they count as one replicate, whose value is
their mean. So two runs of one seed never make a "± 0.0000"; only different seeds (or configs)
make a standard deviation. A run without a seed is a replicate of its own.

Every statistic is computed per run first (its final value, the mean of its last k values, its mean
per round), averaged over a replicate's repeats, then summarised over the series' replicates as
mean ± sample standard deviation (n - 1; no std for a single replicate). A run that lacks a key
simply does not count for that key.

Per-round keys are any numbers in the rows except ``round`` (booleans, strings, lists and dicts
are skipped). Keys starting with ``bytes_`` are cumulative counters: their per-round values are the
differences between consecutive rows (a counter that goes down restarted, e.g. on ``--resume``,
and its value is that round's amount).
"""

from __future__ import annotations

import json
import math
import numbers
import re
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .runs import Run

MAIN_KEY = "accuracy"


@dataclass(frozen=True)
class Stat:
    """Mean and sample standard deviation of ``n`` values (``std`` is None when n < 2)."""

    mean: float
    std: float | None
    n: int


def summarize(values: Iterable[float]) -> Stat | None:
    """Mean ± sample std of ``values``, or None when there are none."""
    values = list(values)
    if not values:
        return None
    return Stat(statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None, len(values))


def is_number(value: Any) -> bool:
    """A finite int or float that is not a bool."""
    return (isinstance(value, numbers.Real) and not isinstance(value, bool)
            and math.isfinite(float(value)))


def is_cumulative(key: str) -> bool:
    """Keys whose values add up over rounds (``bytes_down``, ``bytes_up``)."""
    return key.startswith("bytes_")


def is_time(key: str) -> bool:
    """Seconds per round: ``seconds`` and ``*_s`` keys (``server_aggregate_s``)."""
    return key == "seconds" or key.endswith("_s")


def is_accuracy_part(key: str) -> bool:
    """Accuracies other than the main one: per exit, tier, architecture, strong/weak, device side
    (``accuracy_exit1``, ``accuracy_min``, ``accuracy_large``, ``device_accuracy``)."""
    return key != MAIN_KEY and (key.startswith(MAIN_KEY + "_") or key.endswith("_" + MAIN_KEY))


def natural_key(text: str) -> list:
    """Sort key that puts ``exit2`` before ``exit10``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def numeric_keys(rows: Iterable[dict[str, Any]]) -> list[str]:
    """Keys holding a number in at least one row, in first-seen order (``round`` excluded)."""
    keys: dict[str, None] = {}
    for row in rows:
        for key, value in row.items():
            if key != "round" and is_number(value):
                keys.setdefault(key, None)
    return list(keys)


def points(rows: list[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    """``(round, value)`` of each row where ``key`` is a number; per-round amounts for cumulative keys."""
    raw = [(int(row["round"]), float(row[key])) for row in rows if is_number(row.get(key))]
    if not is_cumulative(key):
        return raw
    per_round, previous = [], 0.0
    for round_no, total in raw:
        per_round.append((round_no, total - previous if total >= previous else total))
        previous = total
    return per_round


@dataclass
class Series:
    """The runs of one label in one setting (replicates, normally one per seed; see the module
    docstring for repeats)."""

    label: str
    runs: list[Run]

    @property
    def seeds(self) -> list[int | None]:
        """Each run's seed (None when unknown), in run order."""
        return [run.seed for run in self.runs]

    def replicates(self) -> list[list[Run]]:
        """The runs grouped into replicates (each a list of repeats, in run order), in order of
        their first run."""
        groups: dict[object, list[Run]] = {}
        for run in self.runs:
            groups.setdefault(repeat_key(run), []).append(run)
        return list(groups.values())

    def keys(self) -> list[str]:
        """Every numeric per-round key of any of its runs (first-seen order)."""
        return numeric_keys(row for run in self.runs for row in run.rows)

    def curve(self, key: str) -> list[tuple[int, Stat]]:
        """Per round (ascending): the value of ``key`` summarised over the replicates that report
        it (each the mean of its repeats that do)."""
        by_round: dict[int, list[float]] = {}
        for repeats in self.replicates():
            values: dict[int, list[float]] = {}
            for run in repeats:
                for round_no, value in points(run.rows, key):
                    values.setdefault(round_no, []).append(value)
            for round_no, repeated in values.items():
                by_round.setdefault(round_no, []).append(statistics.fmean(repeated))
        return [(round_no, summarize(values)) for round_no, values in sorted(by_round.items())]

    def _over_runs(self, per_run: Callable[[list[float]], float], key: str) -> Stat | None:
        values = []
        for repeats in self.replicates():
            repeated = []
            for run in repeats:
                run_values = [value for _, value in points(run.rows, key)]
                if run_values:
                    repeated.append(per_run(run_values))
            if repeated:
                values.append(statistics.fmean(repeated))
        return summarize(values)

    def final(self, key: str) -> Stat | None:
        """Each run's last value of ``key``, summarised over replicates."""
        return self._over_runs(lambda values: values[-1], key)

    def last_k(self, key: str, k: int) -> Stat | None:
        """Each run's mean of its last ``k`` values of ``key`` (all of them if fewer), over replicates."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        return self._over_runs(lambda values: statistics.fmean(values[-k:]), key)

    def per_round(self, key: str) -> Stat | None:
        """Each run's mean per round of ``key`` (of its per-round amounts if cumulative), over replicates."""
        return self._over_runs(statistics.fmean, key)

    def rounds(self) -> list[int]:
        """How many rows each run has."""
        return [len(run.rows) for run in self.runs]


@dataclass
class Setting:
    """The series compared in one setting, in order of their first run."""

    label: str
    series: list[Series]

    @property
    def runs(self) -> list[Run]:
        return [run for series in self.series for run in series.runs]

    def keys(self) -> list[str]:
        """Every numeric per-round key of any run in the setting (first-seen order)."""
        return numeric_keys(row for run in self.runs for row in run.rows)


def group_runs(runs: Iterable[Run]) -> list[Setting]:
    """Settings (by ``run.setting``), each with its series (by ``run.label``), both in order of
    first appearance in ``runs``."""
    settings: dict[str, dict[str, list[Run]]] = {}
    for run in runs:
        settings.setdefault(run.setting, {}).setdefault(run.label, []).append(run)
    return [Setting(setting, [Series(label, members) for label, members in by_label.items()])
            for setting, by_label in settings.items()]


# Config keys that say where a run happened, not what it was: they may differ between repeats.
_WHERE_KEYS = {"fleet", "label", "setting", "broker_url", "data_dir"}
# Config keys that are expected to differ between the replicates of a series.
_REPLICATE_KEYS = {"seed", "recipe.seed", *_WHERE_KEYS}


def repeat_key(run: Run) -> object:
    """What runs share when they repeat one run: their seed and their configuration apart from
    ``_WHERE_KEYS``; a run without a seed (or a config) is unlike any other (its path)."""
    if run.seed is None or run.config is None:
        return ("run", str(run.path))
    config = {key: value for key, value in _flatten(run.config).items() if key not in _WHERE_KEYS}
    return ("seed", run.seed, json.dumps(config, sort_keys=True))


def config_differences(series: Series) -> dict[str, list[str]]:
    """Config entries (flattened as ``recipe.lr``) whose values differ between the series' runs
    with a config, apart from the seed and where the run happened; value texts in run order."""
    flat = [_flatten(run.config) for run in series.runs if run.config is not None]
    if len(flat) < 2:
        return {}
    keys = sorted({key for config in flat for key in config} - _REPLICATE_KEYS)
    differ = {}
    for key in keys:
        texts = [config.get(key, "(absent)") for config in flat]
        if len(set(texts)) > 1:
            differ[key] = list(dict.fromkeys(texts))
    return differ


def _flatten(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value if isinstance(value, str) else json.dumps(value)
    return flat
