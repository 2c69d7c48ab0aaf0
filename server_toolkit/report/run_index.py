"""The run directories below a directory, each described in one line (``fedsdk-server runs``).

A run directory holds ``metrics.jsonl``, ``config.json`` or ``summary.json`` (a run that failed
before its first round has no metrics). Its status is ``report/run_status.py``'s rule.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .run_report import METRICS_JSONL, SUMMARY_JSON
from .run_status import read_summary, rounds_done, run_status
from .runs import CONFIG_JSON, SEARCH_DEPTH

MARKERS = (METRICS_JSONL, CONFIG_JSON, SUMMARY_JSON)


@dataclass
class RunEntry:
    """One run: ``name`` is its path below the listed directory."""

    name: str
    path: Path
    method: str
    dataset: str
    done: int
    planned: int | None
    final_accuracy: float | None
    status: str
    best: tuple[float, int] | None = None  # (best accuracy, its round), from summary.json


def read_config(run_dir: Path) -> dict[str, Any]:
    """``config.json`` as a dict ({} when missing or unreadable: a listing never stops on one run)."""
    try:
        config = json.loads((run_dir / CONFIG_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def describe(run_dir: Path, name: str) -> RunEntry:
    config, summary = read_config(run_dir), read_summary(run_dir) or {}
    planned = config.get("rounds")
    planned = planned if isinstance(planned, int) and not isinstance(planned, bool) else None
    accuracy = summary.get("final_accuracy")
    if not isinstance(accuracy, (int, float)):
        accuracy = _last_accuracy(run_dir)
    best_acc, best_round = summary.get("best_accuracy"), summary.get("best_round")
    known = isinstance(best_acc, int | float) and isinstance(best_round, int)
    best = (float(best_acc), best_round) if known else None
    return RunEntry(name, run_dir, str(config.get("method") or summary.get("method") or "?"),
                    str(config.get("dataset") or summary.get("dataset") or "?"), rounds_done(run_dir),
                    planned, accuracy, run_status(run_dir, planned), best)


def find_runs(root: Path, depth: int = SEARCH_DEPTH) -> list[RunEntry]:
    """Every run directory below ``root`` (``root`` itself if it is one), sorted by path."""
    root = Path(root)
    found: list[Path] = []

    def visit(directory: Path, left: int) -> None:
        if any((directory / marker).is_file() for marker in MARKERS):
            found.append(directory)
            return
        if left > 0:
            for child in sorted(p for p in directory.iterdir() if p.is_dir()):
                visit(child, left - 1)

    visit(root, depth)
    return [describe(path, str(path.relative_to(root)) if path != root else path.name) for path in found]


def _last_accuracy(run_dir: Path) -> float | None:
    try:
        lines = (run_dir / METRICS_JSONL).read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            value = json.loads(line).get("accuracy")
        except (ValueError, AttributeError):
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None
