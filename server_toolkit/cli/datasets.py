"""``fedsdk-server datasets …``: the known datasets, where their files are, verifying and fetching them."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

_data_dir_option = click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where to look (and in its sub-directories named after the dataset); default: where an OS "
    "package installs the dataset (Fashion-MNIST: /usr/share/datasets/fashion-mnist).",
)


def _known(name: str):
    from ..data.catalogue import CATALOGUE, known_dataset
    from ..data.errors import DatasetError
    from .method_choice import did_you_mean

    try:
        return known_dataset(name)
    except DatasetError:
        raise click.ClickException(f"unknown dataset {name!r}{did_you_mean(name, CATALOGUE)}; "
                                   f"known datasets: {', '.join(CATALOGUE)}") from None


@click.group()
def datasets() -> None:
    """The known datasets (digits, mnist, fashion_mnist): list, verify and fetch them."""


@datasets.command("list")
@_data_dir_option
def datasets_list(data_dir: Path | None) -> None:
    """Show each known dataset: where it was found, its format and sample counts (or how to get it)."""
    from ..data.catalogue import CATALOGUE
    from ..data.locate import find_dataset, search_dirs

    rows = [("dataset", "format", "samples", "location")]
    for entry in CATALOGUE.values():
        if entry.bundled:
            from sklearn.datasets import load_digits

            count = len(load_digits().target)
            rows.append((entry.name, "bundled", f"{count} (seeded 80/20 split)",
                         f"ships with {entry.bundled}"))
            continue
        location = find_dataset(entry, data_dir)
        if location is None:
            dirs = search_dirs(entry, data_dir)
            looked = f"looked in {dirs[0]}" if dirs else "no --data-dir given"
            hint = entry.how_to_get(str(data_dir) if data_dir else "DIR")
            rows.append((entry.name, "-", "-", f"not found ({looked}); {hint}"))
            continue
        rows.append((entry.name, location.format, _sample_counts(location), str(location.path)))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row[:3], widths, strict=True)) + "  " + row[3])


def _sample_counts(location) -> str:
    """"60000 train, 10000 test", read from the files' headers only."""
    from ..data.errors import DatasetError
    from ..data.idx import read_idx_dims
    from ..data.npz import npz_shapes

    try:
        if location.format == "npz":
            shapes = npz_shapes(location.path)
            train, test = shapes["x_train"][0], shapes["x_test"][0]
        else:
            train = read_idx_dims(location.files["x_train"])[0]
            test = read_idx_dims(location.files["x_test"])[0]
    except (DatasetError, KeyError, IndexError) as exc:
        return f"unreadable ({exc})"
    return f"{train} train, {test} test"


@datasets.command("verify")
@click.argument("name")
@_data_dir_option
def datasets_verify(name: str, data_dir: Path | None) -> None:
    """Check every file of dataset NAME against its known digests (exit 1 when one fails).

    A .gz file passes on the canonical MD5 or, re-compressed, on the SHA-256 of its content;
    an npz passes array by array (docs/datasets.md)."""
    from ..data.errors import DatasetError
    from ..data.locate import locate
    from ..data.verify import verify_location

    entry = _known(name)
    if entry.bundled:
        click.echo(f"{entry.name}: ships with {entry.bundled}; there are no files to verify")
        return
    try:
        location = locate(entry, data_dir)
    except DatasetError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{entry.name}: {location.format} at {location.path}")
    checks = verify_location(location)
    for check in checks:
        if check.ok:
            click.echo(f"  ok    {check.label}: {check.how}")
        else:
            where = check.path if check.label == check.path.name else check.label
            click.echo(f"  FAIL  {where}: {check.how}")
    failed = sum(not c.ok for c in checks)
    if failed:
        click.echo(f"{entry.name}: {failed} of {len(checks)} files failed verification", err=True)
        raise SystemExit(1)
    click.echo(f"{entry.name}: all {len(checks)} files verified")


class _RichProgress:
    """``fetch.FetchProgress`` drawn as a rich download bar (one task per file)."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.task = None

    def start(self, name: str, total: int) -> None:
        self.task = self.progress.add_task(name, total=total)

    def advance(self, nbytes: int) -> None:
        self.progress.advance(self.task, nbytes)

    def finish(self) -> None:
        """Close the bar at what arrived (the total was an estimate without Content-Length)."""
        done = next(t.completed for t in self.progress.tasks if t.id == self.task)
        self.progress.update(self.task, total=done)


@datasets.command("fetch")
@click.argument("name")
@click.option("--to", "to", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Directory the .gz files go to (created if needed); then use --data-dir DIR.")
@click.option("--mirror", default=None,
              help="Base URL serving the .gz files (http, https or file), instead of the known mirrors.")
@click.option("--timeout", default=60.0, show_default=True, help="Seconds to wait for a connection or data.")
def datasets_fetch(name: str, to: Path, mirror: str | None, timeout: float) -> None:
    """Download dataset NAME's files into --to, verifying each (a file that fails is not kept)."""
    from ..data.errors import DatasetError
    from ..data.fetch import fetch_dataset

    entry = _known(name)
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
               TimeRemainingColumn())
    try:
        with Progress(*columns, console=Console(stderr=True)) as progress:
            fetched = fetch_dataset(entry, to, mirror=mirror, timeout=timeout,
                                    progress=_RichProgress(progress))
    except DatasetError as exc:
        raise click.ClickException(str(exc)) from None
    for f in fetched:
        click.echo(f"  {'kept   ' if f.url is None else 'fetched'}  {f.path}: {f.check.how}")
    click.echo(f"{entry.name} is in {to}: use --dataset {entry.name} --data-dir {to}")
