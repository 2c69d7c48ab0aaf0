"""How a run ended, recorded and read back (``fedsdk-server runs``).

``run`` and ``simulate`` record the end in ``summary.json``'s ``"status"``: ``finished`` (every
planned round ran), ``stopped`` (Ctrl-C) or ``failed`` (an error). A run that got through without
an error but whose model-quality guard had something to say (``rounds/quality_guard.py``:
``summary.json``'s ``guard.verdict``) is recorded as that instead of ``finished``:
``finished_after_rollback`` (the model diverged, was rolled back, and the run went on to its end)
``diverged`` (the guard stopped the run, or the final model is far below the best) or
``finished_without_learning`` (the best accuracy stayed near chance).
``run_status`` reads it back:

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

STATUSES = ("finished", "finished_after_rollback", "finished_without_learning", "diverged", "stopped",
            "failed")
GUARD_VERDICTS = ("finished_after_rollback", "finished_without_learning", "diverged")


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
    """One of ``STATUSES``, by the rule of the module docstring."""
    summary = read_summary(run_dir)
    if summary is None:
        return "failed"
    if summary.get("status") in STATUSES:
        return summary["status"]
    return "finished" if planned is None or rounds_done(run_dir) >= planned else "stopped"


def record_status(run_dir: Path, status: str) -> str:
    """Set ``summary.json``'s ``"status"`` (making a minimal summary when there is none): ``status``,
    or, for ``finished``, the guard's verdict when it has one. Returns the status recorded."""
    if status not in STATUSES:
        raise ValueError(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
    if not Path(run_dir).is_dir():
        return status  # it failed before it had a directory
    path = Path(run_dir) / SUMMARY_JSON
    summary = read_summary(run_dir) or {"run": Path(run_dir).name, "rounds": rounds_done(run_dir)}
    guard = summary.get("guard")
    verdict = guard.get("verdict") if isinstance(guard, dict) else None
    status = verdict if status == "finished" and verdict in GUARD_VERDICTS else status
    summary["status"] = status
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)
    return status
