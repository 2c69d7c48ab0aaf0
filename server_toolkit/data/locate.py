"""Finding a known dataset's files: an npz or four IDX files, in a data dir or where an OS
package installs them.

Search order: the data dir (or, when none is given, the dataset's ``system_dirs``), then its
sub-directories named after the dataset (``fashion_mnist/``, ``fashion-mnist/``); in each
directory the npz (``fashion_mnist.npz``) first, then the IDX files (each ``.gz`` or plain).
So one data dir can hold several datasets: npz files side by side, or IDX files in
sub-directories (their names are the same for MNIST and Fashion-MNIST).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .catalogue import KnownDataset
from .errors import DatasetError


@dataclass(frozen=True)
class Location:
    """Where a dataset was found. ``format`` "npz": ``path`` is the npz file; "idx": ``path``
    is the directory and ``files`` maps x_train, y_train, x_test, y_test to the IDX files."""

    dataset: KnownDataset
    format: str
    path: Path
    files: dict[str, Path] = field(default_factory=dict)


def search_dirs(dataset: KnownDataset, data_dir: str | Path | None) -> list[Path]:
    """The directories looked in, in order."""
    roots = [Path(data_dir)] if data_dir is not None else list(dataset.system_dirs)
    return [d for root in roots for d in (root, *(root / sub for sub in dataset.subdir_names))]


def _idx_files(dataset: KnownDataset, directory: Path) -> dict[str, Path]:
    """The IDX files present in ``directory`` (key -> path; the plain file wins over .gz)."""
    found = {}
    for f in dataset.files:
        for candidate in (directory / f.name, directory / f.gz_name):
            if candidate.is_file():
                found[f.key] = candidate
                break
    return found


def find_dataset(dataset: KnownDataset, data_dir: str | Path | None) -> Location | None:
    """The first complete copy of the dataset in ``search_dirs``, or None."""
    for directory in search_dirs(dataset, data_dir):
        npz = directory / dataset.npz_name
        if npz.is_file():
            return Location(dataset, "npz", npz)
        files = _idx_files(dataset, directory)
        if len(files) == len(dataset.files):
            return Location(dataset, "idx", directory, files)
    return None


def not_found_message(dataset: KnownDataset, data_dir: str | Path | None) -> str:
    """One line: where we looked, what for, what is missing from a partial copy, how to get it."""
    wanted = (f"{dataset.npz_name} or the IDX files "
              f"{', '.join(f.name for f in dataset.files)} (each .gz or plain)")
    subdirs = ", ".join(f"{s}/" for s in dataset.subdir_names)
    roots = [Path(data_dir)] if data_dir is not None else list(dataset.system_dirs)
    if not roots:
        return (f"{dataset.name} not found: no data dir given; pass --data-dir DIR holding {wanted}; "
                f"{dataset.how_to_get()}")
    where = []
    for root in roots:
        notes = [f"and its {subdirs} sub-directories" if root.is_dir() else "does not exist"]
        if data_dir is None and dataset.package:
            notes.append(f"{dataset.package}'s directory; no --data-dir given")
        where.append(f"{root} ({'; '.join(notes)})")
    partial = ""
    for directory in search_dirs(dataset, data_dir):
        files = _idx_files(dataset, directory)
        if files:
            missing = [f.name for f in dataset.files if f.key not in files]
            partial = f"; {directory} lacks {', '.join(missing)}"
            break
    to = str(data_dir) if data_dir is not None else "DIR"
    return (f"{dataset.name} not found: looked in {'; '.join(where)} for {wanted}{partial}; "
            f"{dataset.how_to_get(to)}")


def locate(dataset: KnownDataset, data_dir: str | Path | None) -> Location:
    """Like ``find_dataset``, but DatasetError (one line, see ``not_found_message``) when absent."""
    location = find_dataset(dataset, data_dir)
    if location is None:
        raise DatasetError(not_found_message(dataset, data_dir))
    return location
