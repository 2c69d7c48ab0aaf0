"""``fedsdk-server runs``: the run directories of a runs directory, listed and shown."""

from __future__ import annotations

import json
from pathlib import Path

import click

from .aliases import Aliased

SHOWN = ("round", "accuracy", "loss", "accepted", "rejected", "seconds")  # the columns of `runs show`


@click.group()
def runs() -> None:
    """List and inspect run directories (status: finished, finished_after_rollback,
    finished_without_learning, diverged, stopped or failed)."""


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
                     for row in [header, *rows])


@runs.command("list")
@click.argument("directory", default="runs", type=click.Path(path_type=Path))
def runs_list(directory: Path) -> None:
    """Every run below DIRECTORY (default: runs): method, dataset, rounds done / planned, final
    accuracy, best accuracy (@ its round) and status.

    Status: summary.json's "status" (finished, stopped or failed, written when the run ends;
    finished_after_rollback or diverged when the model-quality guard rolled the model back or
    found the final model far below its best, finished_without_learning when its best accuracy
    stayed near chance); else, with a summary.json, finished when every
    planned round is done, stopped if not; without one the run crashed or was killed (or is
    still running): failed."""
    from ..report.run_index import find_runs

    if not directory.is_dir():
        raise click.ClickException(f"no such runs directory: {directory}")
    entries = find_runs(directory)
    if not entries:
        click.echo(f"no runs in {directory}")
        return
    rows = [[e.name, e.method, e.dataset, f"{e.done}/{e.planned if e.planned is not None else '?'}",
             f"{e.final_accuracy:.4f}" if e.final_accuracy is not None else "–",
             f"{e.best[0]:.4f}@{e.best[1]}" if e.best else "–", e.status] for e in entries]
    click.echo(_table(["run", "method", "dataset", "rounds", "final accuracy", "best", "status"], rows))


@runs.command("show")
@click.argument("run_id")
@click.option("--runs-dir", "--dir", "directory", cls=Aliased, aliases=["--dir"],
              default=Path("runs"), show_default=True, type=click.Path(path_type=Path),
              help="The runs directory RUN_ID is in (RUN_ID may also be a path).")
def runs_show(run_id: str, directory: Path) -> None:
    """One run: its status, config, summary and per-round accuracy."""
    from ..report.run_index import describe, read_config
    from ..report.run_status import read_summary
    from ..report.runs import ReportInputError, read_metrics

    path = Path(run_id) if Path(run_id).is_dir() else directory / run_id
    if not path.is_dir():
        raise click.ClickException(f"no run {run_id!r} in {directory}")
    entry = describe(path, run_id)
    click.echo(f"run {entry.name} ({path}): {entry.status}, {entry.done}/{entry.planned or '?'} rounds, "
               f"{entry.method} on {entry.dataset}")
    click.echo("config: " + json.dumps(read_config(path), sort_keys=True))
    click.echo("summary: " + json.dumps(read_summary(path) or {}, sort_keys=True))
    try:
        rows = read_metrics(path / "metrics.jsonl") if (path / "metrics.jsonl").exists() else []
    except ReportInputError as err:
        raise click.ClickException(str(err)) from None
    keys = [k for k in SHOWN if any(k in r for r in rows)]
    if rows:
        click.echo(_table(keys, [[_cell(r.get(k)) for k in keys] for r in rows]))


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    return "–" if value is None else str(value)
