"""How a run ended, recorded and read back (``fedsdk-server runs``).

``run`` and ``simulate`` record the end in ``summary.json``'s ``"status"``: ``finished`` (every
planned round ran), ``stopped`` (Ctrl-C) or ``failed`` (an error). ``run_status`` reads it back:

1. ``summary.json`` has a ``"status"``: that one;
2. else ``summary.json`` exists (written only after the last round, by older versions):
   ``finished`` when the rounds done reach the rounds planned (``config.json``'s ``rounds``, or
   none planned), else ``stopped``;
3. else (the process never wrote its summary: it crashed, was killed, or is still running):
   ``failed``.

Rounds done = the rows of ``metrics.jsonl`` (0 when it is missing or unreadable).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .run_report import METRICS_JSONL, SUMMARY_JSON

STATUSES = ("finished", "stopped", "failed")


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    """``summary.json`` as a dict, or None (missing or unreadable)."""
    try:
        summary = json.loads((Path(run_dir) / SUMMARY_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) else None


def rounds_done(run_dir: Path) -> int:
    """The rows of ``metrics.jsonl`` that parse."""
    try:
        lines = (Path(run_dir) / METRICS_JSONL).read_text(encoding="utf-8").splitlines()
    except OSError:
        return 0
    done = 0
    for line in lines:
        try:
            done += isinstance(json.loads(line), dict)
        except ValueError:
            continue
    return done


def run_status(run_dir: Path, planned: int | None) -> str:
    """finished, stopped or failed, by the rule of the module docstring."""
    summary = read_summary(run_dir)
    if summary is None:
        return "failed"
    if summary.get("status") in STATUSES:
        return summary["status"]
    return "finished" if planned is None or rounds_done(run_dir) >= planned else "stopped"


def record_status(run_dir: Path, status: str) -> None:
    """Set ``summary.json``'s ``"status"`` (making a minimal summary when there is none)."""
    if status not in STATUSES:
        raise ValueError(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
    if not Path(run_dir).is_dir():
        return  # it failed before it had a directory
    path = Path(run_dir) / SUMMARY_JSON
    summary = read_summary(run_dir) or {"run": Path(run_dir).name, "rounds": rounds_done(run_dir)}
    summary["status"] = status
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)
