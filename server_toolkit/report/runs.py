"""Finished runs read back for reports: where they are, their rows and config, and what they are.

A run directory is any directory holding ``metrics.jsonl`` (one JSON object per round, written by
``RunReport``); ``config.json`` next to it is optional. Each run belongs to a *series* (what is
compared: one method with its options, or ``config.json``'s ``"label"``) inside a *setting* (where
it is compared: dataset, partition and model, or ``config.json``'s ``"setting"``). Runs of one
series in one setting are its replicates (one per seed; runs repeating a seed and configuration
count once, see ``series.py``).

Unlike ``RunReport.load`` (which repairs a crashed run's file so that it can go on), reading for a
report is strict: a corrupt line is an error naming the file and line.
"""

from __future__ import annotations

import json
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..methods import canonical_name
from .run_report import METRICS_JSONL

CONFIG_JSON = "config.json"

# How deep below a given directory run directories are looked for (1: its children; 4 reaches
# bench/reproduce.py's runs from its runs directory: FAMILY/SETTING/ARM/seedS).
SEARCH_DEPTH = 4


class ReportInputError(Exception):
    """A report's inputs cannot be used; the message is one line naming the path (and line)."""


@dataclass(frozen=True)
class Run:
    """One finished (or stopped) run: its directory, its rows (file order) and its config (or None)."""

    path: Path
    rows: list[dict[str, Any]]
    config: dict[str, Any] | None

    @property
    def name(self) -> str:
        """The run directory's name (e.g. ``20261123-195621``)."""
        return self.path.name

    @property
    def label(self) -> str:
        """The series this run belongs to (see ``series_label``)."""
        return series_label(self.config, self.path)

    @property
    def setting(self) -> str:
        """The setting this run is compared in (see ``setting_label``)."""
        return setting_label(self.config)

    @property
    def seed(self) -> int | None:
        """``config.json``'s seed, or None."""
        seed = (self.config or {}).get("seed")
        return seed if isinstance(seed, int) and not isinstance(seed, bool) else None


def find_run_dirs(paths: Sequence[Path]) -> list[Path]:
    """Run directories given by ``paths``: each path is a run directory (or its ``metrics.jsonl``),
    or a directory whose children or grandchildren are run directories (sorted by name).

    Order: the order of ``paths``, then by name below each; a directory reached twice counts once.
    Raises ReportInputError for a missing path or when no run is found at all.
    """
    found: list[Path] = []
    seen: set[Path] = set()
    for path in map(Path, paths):
        if path.is_file() and path.name == METRICS_JSONL:
            path = path.parent
        elif not path.exists():
            raise ReportInputError(f"no such run directory: {path}")
        elif not path.is_dir():
            raise ReportInputError(f"not a run directory (nor a directory of runs): {path}")
        for run_dir in _runs_below(path, SEARCH_DEPTH):
            key = run_dir.resolve()
            if key not in seen:
                seen.add(key)
                found.append(run_dir)
    if not found:
        shown = ", ".join(str(p) for p in paths) or "(no paths given)"
        raise ReportInputError(f"no run found in {shown} (a run directory holds {METRICS_JSONL})")
    return found


def _runs_below(directory: Path, depth: int) -> list[Path]:
    if (directory / METRICS_JSONL).is_file():
        return [directory]
    if depth == 0:
        return []
    try:
        children = sorted(child for child in directory.iterdir() if child.is_dir())
    except OSError as err:
        raise ReportInputError(f"cannot list {directory}: {err.strerror or err}") from None
    return [run for child in children for run in _runs_below(child, depth - 1)]


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl``: one JSON object with an integer ``round`` per non-blank line.

    Raises ReportInputError naming the file (and line) when it cannot be read or a line is corrupt.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise ReportInputError(f"cannot read {path}: {reason}") from None
    rows = []
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            reason = f"{err.msg}, column {err.colno}"
            raise ReportInputError(f"{path}:{line_no}: corrupt line ({reason})") from None
        if not isinstance(row, dict):
            raise ReportInputError(f"{path}:{line_no}: expected a JSON object, got {type(row).__name__}")
        round_no = row.get("round")
        if isinstance(round_no, bool) or not isinstance(round_no, numbers.Integral):
            raise ReportInputError(f"{path}:{line_no}: the row has no integer 'round' (got {round_no!r})")
        rows.append(row)
    return rows


def read_config(run_dir: Path) -> dict[str, Any] | None:
    """``run_dir/config.json`` as a dict, or None when there is none; ReportInputError if corrupt."""
    path = Path(run_dir) / CONFIG_JSON
    if not path.exists():
        return None
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise ReportInputError(f"cannot read {path}: {reason}") from None
    except json.JSONDecodeError as err:
        raise ReportInputError(f"{path}:{err.lineno}: corrupt JSON ({err.msg})") from None
    if not isinstance(config, dict):
        raise ReportInputError(f"{path}: expected a JSON object, got {type(config).__name__}")
    return config


def load_run(run_dir: Path) -> Run:
    """Read one run directory (its ``metrics.jsonl`` and, if present, ``config.json``)."""
    run_dir = Path(run_dir)
    return Run(run_dir, read_metrics(run_dir / METRICS_JSONL), read_config(run_dir))


def load_runs(paths: Sequence[Path]) -> list[Run]:
    """Every run found by ``find_run_dirs(paths)``, read, in that order."""
    return [load_run(run_dir) for run_dir in find_run_dirs(paths)]


def series_label(config: dict[str, Any] | None, run_dir: Path) -> str:
    """The series a run belongs to: ``config["label"]`` when it is a non-empty string, else the
    method followed by its tiers and method options (``heterofl tiers=1.0,0.5``). Without a config
    the run is a series of its own, named after its directory."""
    if config is None:
        return f"{Path(run_dir).name} (no {CONFIG_JSON})"
    label = config.get("label")
    if isinstance(label, str) and label.strip():
        return label.strip()
    parts = [canonical_name(str(config.get("method", "unknown method")))]  # an old id's runs join its series
    tiers = config.get("tiers")
    if tiers:
        parts.append("tiers=" + (",".join(map(str, tiers)) if isinstance(tiers, list) else str(tiers)))
    options = config.get("method_options")
    if isinstance(options, dict):
        for key in sorted(options):
            value = options[key]
            shown = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
            parts.append(f"{key}={shown}")
    return " ".join(parts)


def setting_label(config: dict[str, Any] | None) -> str:
    """Where a run is compared: ``config["setting"]`` when it is a non-empty string, else
    ``dataset · partition[ parameters] · model`` (``digits · dirichlet α=0.5 · small_cnn``); the
    partition's parameters are those it uses (alpha; classes per client; strong devices and share)."""
    if config is None:
        return f"unknown (no {CONFIG_JSON})"
    setting = config.get("setting")
    if isinstance(setting, str) and setting.strip():
        return setting.strip()
    partition = str(config.get("partition", "?"))
    if partition == "dirichlet":
        partition += f" α={config.get('alpha')}"
    elif partition == "k-classes":
        partition += f" {config.get('classes_per_client')} classes/client"
    elif partition == "quantity-skew":
        partition += (f" α={config.get('alpha')}, {config.get('num_strong')} strong"
                      f" with {config.get('strong_share')} of the data")
    return f"{config.get('dataset', '?')} · {partition} · {config.get('model', '?')}"
