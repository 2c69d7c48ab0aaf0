"""``fedsdk-server report``: one self-contained HTML page comparing finished runs."""

from __future__ import annotations

import shlex
from pathlib import Path

import click


@click.command("report")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The HTML file to write (its directory must exist).")
@click.option("--last-k", default=5, show_default=True, type=click.IntRange(min=1),
              help="Rounds averaged in the 'mean of last k rounds' columns.")
def report(run_dirs: tuple[Path, ...], out: Path, last_k: int) -> None:
    """Compare runs in one HTML page (inline SVG and CSS, nothing fetched).

    RUN_DIRS are run directories (holding metrics.jsonl) or directories holding them (searched
    four levels down). Runs are grouped into series by config.json's "label" (else method, tiers
    and method options) and compared within settings (config.json's "setting", else dataset,
    partition and model); seeds are a series' replicates (runs of one seed and configuration are
    repeats of one run: counted once, as their mean).
    """
    from ..report.compare_html import build_page, write_page
    from ..report.runs import ReportInputError, load_runs

    command = shlex.join(["fedsdk-server", "report", *map(str, run_dirs), "--out", str(out),
                          "--last-k", str(last_k)])
    try:
        runs = load_runs(run_dirs)
        page = build_page(runs, inputs=[str(p) for p in run_dirs], last_k=last_k, command=command)
        write_page(page, out)
    except ReportInputError as err:
        raise click.ClickException(str(err)) from None
    n_settings = len({run.setting for run in runs})
    click.echo(f"{out}: {len(runs)} runs, {n_settings} settings")
