"""What ``simulate`` and ``run`` show while rounds go on and after: a progress bar with the
last round's accuracy, then the table of every round and where the files are. One module so
both commands look the same."""

from __future__ import annotations

import logging
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .options import console

log = logging.getLogger(__name__)


class RoundProgress:
    """A progress bar over ``rounds`` rounds; use as a context manager. ``round(row)`` moves it
    on (a row of ``metrics.jsonl``), ``note(text)`` prints a line above it."""

    def __init__(self, rounds: int, first: str = "starting") -> None:
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=console)
        self.bar = self.progress.add_task(first, total=rounds)

    def __enter__(self) -> RoundProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def note(self, text: str) -> None:
        self.progress.console.print(text)

    def round(self, row: dict) -> None:
        acc = row.get("accuracy")
        shown = f"accuracy {acc:.3f}" if isinstance(acc, float) else "no accuracy"
        log.info("%s", closing_line(row))
        self.progress.update(self.bar, completed=row["round"], description=f"round {row['round']}: {shown}, "
                             f"{row.get('accepted', '?')}/{row.get('selected', '?')} updates")


def closing_line(row: dict) -> str:
    """``round 3 closed: 2/2 updates accepted, 0 rejected; accuracy 0.912 (4.1 s)``: a row of
    ``metrics.jsonl`` as the server's INFO line (a version in async mode)."""
    acc = row.get("accuracy")
    shown = f"accuracy {acc:.3f}" if isinstance(acc, (int, float)) else "no accuracy"
    seconds = f" ({row['seconds']:.1f} s)" if isinstance(row.get("seconds"), (int, float)) else ""
    return (f"round {row['round']} closed: {row.get('accepted', '?')}/{row.get('selected', '?')} updates "
            f"accepted, {row.get('rejected', 0)} rejected; {shown}{seconds}")


def print_outcome(report, title: str, run_dir: Path, stopped: bool = False) -> None:
    """The table of the rounds that finished, the final accuracy and the run's files."""
    from ..report.run_report import final_accuracy

    if report.rows:
        console.print(report.summary_table(title))
    acc = final_accuracy(report.rows)
    head = f"stopped after round {report.rows[-1]['round']}; " if stopped and report.rows else ""
    console.print(
        f"{head}final accuracy {acc:.3f}; metrics in {run_dir}/metrics.jsonl, plot {run_dir}/accuracy.png, "
        f"summary {run_dir}/summary.json" if acc is not None else f"no rounds completed; see {run_dir}",
        soft_wrap=True)
    _print_quality(run_dir)


def _print_quality(run_dir: Path) -> None:
    """The model-quality guard's verdict when it has one (``rounds/quality_guard.py``)."""
    from ..report.run_status import read_summary

    summary = read_summary(run_dir) or {}
    guard, best = summary.get("guard") or {}, summary.get("best") or {}
    if not guard.get("verdict"):
        return
    kept = f"; best accuracy {best['accuracy']:.3f} at round {best['round']}" if best.get("accuracy") else ""
    where = f" in {run_dir}/{best['path']}" if best.get("path") else ""
    console.print(f"[bold yellow]model quality: {guard['verdict']}[/] ({len(summary.get('divergence', []))} "
                  f"divergence(s), {guard.get('rollbacks', 0)} rollback(s)){kept}{where}", soft_wrap=True)
