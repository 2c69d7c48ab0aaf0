"""Per-run report of a federated simulation.

A ``RunReport`` owns one run directory and keeps these files in it:

* ``metrics.jsonl`` - one JSON object per round, appended and flushed as each round closes;
* ``metrics.csv``   - the same rows as a table, rewritten after every round;
* ``accuracy.png``  - accuracy (and loss, if reported) per round, from ``write_plot()``;
* ``summary.json``  - a short summary of the run, from ``write_summary()``.

The JSONL file is the record of truth: ``RunReport.load()`` reads it back when a run resumes.
"""

import copy
import csv
import io
import json
import logging
import math
import numbers
import os
from pathlib import Path
from typing import Any

from rich.table import Table

log = logging.getLogger(__name__)

METRICS_JSONL = "metrics.jsonl"
METRICS_CSV = "metrics.csv"
ACCURACY_PNG = "accuracy.png"
SUMMARY_JSON = "summary.json"

# Columns shown by summary_table(), in this order, when present in the rows.
_TABLE_COLUMNS = ("round", "accuracy", "loss", "accepted", "rejected", "seconds")
TIER_PREFIX = "accuracy_tier_"  # each tier's deployable accuracy (methods/tier_accuracy.py)
HOLDOUT_PREFIX = "accuracy_holdout_tier_"  # ... on the devices' held-back data (methods/holdout_accuracy.py)
_PREFIXES = {TIER_PREFIX: "tier ", HOLDOUT_PREFIX: "holdout "}  # a tier column's key prefix -> its header


def final_accuracy(rows: list[dict[str, Any]]) -> float | None:
    """Return the accuracy of the last row that has one, or None."""
    for row in reversed(rows):
        value = row.get("accuracy")
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            return float(value)
    return None


class RunReport:
    """Metrics, plot and summary of one federated run, kept in ``run_dir``.

    Constructing a ``RunReport`` starts a fresh report: an existing ``metrics.jsonl`` in
    ``run_dir`` is emptied (with a warning). Use ``RunReport.load()`` to resume instead.
    """

    def __init__(self, run_dir: Path, name: str | None = None) -> None:
        self._setup(Path(run_dir), name)
        if self.jsonl_path.exists() and self.jsonl_path.stat().st_size > 0:
            log.warning("starting a new report: emptying existing %s", self.jsonl_path)
        self.jsonl_path.write_text("", encoding="utf-8")
        self.csv_path.unlink(missing_ok=True)

    def _setup(self, run_dir: Path, name: str | None) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self.run_dir = run_dir
        self.name = name if name is not None else run_dir.resolve().name
        self.jsonl_path = run_dir / METRICS_JSONL
        self.csv_path = run_dir / METRICS_CSV
        self.plot_path = run_dir / ACCURACY_PNG
        self.summary_path = run_dir / SUMMARY_JSON
        self._rows: list[dict[str, Any]] = []

    @classmethod
    def load(cls, run_dir: Path, name: str | None = None) -> "RunReport":
        """Read an existing run's ``metrics.jsonl`` back, so that new rounds follow the old ones.

        Blank or corrupt lines (typically a half-written last line after a crash) are skipped
        with a warning, and the file is rewritten without them. A missing ``metrics.jsonl``
        gives an empty report.
        """
        run_dir = Path(run_dir)
        if not run_dir.is_dir():
            raise FileNotFoundError(f"run directory not found: {run_dir}")
        report = cls.__new__(cls)
        report._setup(run_dir, name)
        if report.jsonl_path.exists():
            report._rows = _read_jsonl(report.jsonl_path)
        else:
            log.info("no %s in %s: resuming with an empty report", METRICS_JSONL, run_dir)
        # Rewrite both files from the rows kept, so appends start on a clean line.
        jsonl_text = "".join(_jsonl_line(row) for row in report._rows)
        _replace_text(report.jsonl_path, jsonl_text)
        report._write_csv()
        return report

    @property
    def rows(self) -> list[dict[str, Any]]:
        """A copy of the rows reported so far, oldest first."""
        return copy.deepcopy(self._rows)

    def add_round(self, row: dict[str, Any]) -> None:
        """Record the metrics of one closed round and write them out at once.

        ``row`` needs an int ``round``; other values must be numbers, strings, booleans,
        None, or lists/dicts of those (numpy scalars are accepted and stored as plain
        numbers). Raises ValueError otherwise, including for NaN or infinite numbers.
        """
        clean = _validate_row(row)
        handed = False  # a Ctrl-C during fsync must not leave the line on disk but out of the summary
        try:
            with self.jsonl_path.open("a", encoding="utf-8") as f:
                f.write(_jsonl_line(clean))
                handed = True
                f.flush()
                os.fsync(f.fileno())
        finally:
            if handed:
                self._rows.append(clean)
        self._write_csv()

    def _write_csv(self) -> None:
        """Rewrite metrics.csv from the in-memory rows (columns in first-seen key order)."""
        columns: list[str] = []
        for row in self._rows:
            for key in row:
                if key not in columns:
                    columns.append(key)
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        if columns:
            writer.writerow(columns)
        for row in self._rows:
            writer.writerow([_csv_cell(row.get(key)) for key in columns])
        _replace_text(self.csv_path, buffer.getvalue())

    def write_plot(self) -> Path:
        """Plot accuracy (and loss on a second axis, if reported) per round to accuracy.png."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator

        acc_points = _points(self._rows, "accuracy")
        loss_points = _points(self._rows, "loss")

        fig, ax = plt.subplots(figsize=(7, 4.5), dpi=100)
        try:
            lines = []
            if acc_points:
                rounds, values = zip(*acc_points, strict=True)
                lines += ax.plot(rounds, values, marker="o", color="tab:blue", label="accuracy")
            else:
                ax.text(0.5, 0.5, "no accuracy reported", ha="center", va="center",
                        transform=ax.transAxes)
            ax.set_xlabel("round")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_ylabel("accuracy", color="tab:blue")
            ax.grid(True, alpha=0.3)
            if loss_points:
                ax_loss = ax.twinx()
                rounds, values = zip(*loss_points, strict=True)
                lines += ax_loss.plot(rounds, values, marker="s", linestyle="--",
                                      color="tab:red", label="loss")
                ax_loss.set_ylabel("loss", color="tab:red")
            ax.set_title(f"Run {self.name}: accuracy per round")
            if lines:
                # Below the axes, so it never hides data points.
                fig.legend(lines, [line.get_label() for line in lines], loc="lower center",
                           ncol=len(lines), frameon=False)
                fig.tight_layout(rect=(0, 0.07, 1, 1))
            else:
                fig.tight_layout()
            tmp = self.plot_path.with_name(self.plot_path.name + ".tmp")
            fig.savefig(tmp, format="png")
            os.replace(tmp, self.plot_path)
        finally:
            plt.close(fig)
        return self.plot_path

    def summary_table(self, title: str | None = None) -> Table:
        """A rich Table with one line per round (round, accuracy, each tier's deployable
        accuracy ``accuracy_tier_<t>`` as "tier <t>", then on the devices' held-back splits
        ``accuracy_holdout_tier_<t>`` as "holdout <t>", loss, accepted, rejected, seconds -
        whichever of these the rows have)."""
        tiers = [key for prefix in _PREFIXES
                 for key in sorted({k for row in self._rows for k in row if k.startswith(prefix)})]
        columns = [key for key in _TABLE_COLUMNS if any(key in row for row in self._rows)]
        after = columns.index("accuracy") + 1 if "accuracy" in columns else int("round" in columns)
        columns[after:after] = tiers
        table = Table(title=title if title is not None else f"Run {self.name}")
        for key in columns:
            table.add_column(_header(key), justify="right")
        for row in self._rows:
            table.add_row(*[_table_cell(key, row.get(key)) for key in columns])
        return table

    def write_summary(self, extra: dict[str, Any] | None = None) -> Path:
        """Write summary.json: round count, final and best accuracy, total seconds, plus
        ``extra`` (whose keys win over the computed ones)."""
        summary: dict[str, Any] = {
            "run": self.name,
            "rounds": len(self._rows),
            "first_round": self._rows[0]["round"] if self._rows else None,
            "last_round": self._rows[-1]["round"] if self._rows else None,
            "final_accuracy": final_accuracy(self._rows),
        }
        acc_points = _points(self._rows, "accuracy")
        if acc_points:
            best_round, best_acc = max(acc_points, key=lambda point: point[1])
            summary["best_accuracy"] = best_acc
            summary["best_round"] = best_round
        seconds = [value for _, value in _points(self._rows, "seconds")]
        if seconds:
            summary["total_seconds"] = sum(seconds)
        if extra is not None:
            if not isinstance(extra, dict):
                raise ValueError(f"extra must be a dict, got {type(extra).__name__}")
            summary.update(_clean_value(extra, "extra"))
        _replace_text(self.summary_path, json.dumps(summary, indent=2, allow_nan=False) + "\n")
        return self.summary_path


def _validate_row(row: Any) -> dict[str, Any]:
    """Check a round's row and return a plain-Python copy of it; raise ValueError if bad."""
    if not isinstance(row, dict):
        raise ValueError(f"a round's row must be a dict, got {type(row).__name__}")
    if "round" not in row:
        raise ValueError("a round's row needs a 'round' key")
    round_no = row["round"]
    if isinstance(round_no, bool) or not isinstance(round_no, numbers.Integral):
        raise ValueError(f"'round' must be an int, got {round_no!r}")
    clean = _clean_value(row, "row")
    clean["round"] = int(round_no)
    return clean


def _clean_value(value: Any, where: str) -> Any:
    """Return ``value`` as plain JSON types (tuples become lists); raise ValueError if it
    cannot be written as strict JSON."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        number = float(value)
        if not math.isfinite(number):
            raise ValueError(f"{where}: {value!r} is not a finite number")
        return number
    if isinstance(value, list | tuple):
        return [_clean_value(item, f"{where}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, dict):
        clean = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"{where}: key {key!r} is not a string")
            clean[key] = _clean_value(item, f"{where}.{key}")
        return clean
    raise ValueError(f"{where}: {type(value).__name__} value {value!r} is not JSON-serialisable")


def _jsonl_line(row: dict[str, Any]) -> str:
    return json.dumps(row, allow_nan=False) + "\n"


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Read the rows of a metrics.jsonl, skipping blank or corrupt lines with a warning."""
    rows = []
    with path.open(encoding="utf-8", errors="replace") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                log.warning("%s:%d: skipping blank line", path, line_no)
                continue
            try:
                rows.append(_validate_row(json.loads(line)))
            except ValueError as err:  # json.JSONDecodeError is a ValueError too
                log.warning("%s:%d: skipping corrupt line (%s)", path, line_no, err)
    return rows


def _replace_text(path: Path, text: str) -> None:
    """Write a file atomically: to a temporary file next to it, then rename over it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8", newline="")
    os.replace(tmp, path)


def _csv_cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return json.dumps(value)
    return value


def _points(rows: list[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    """(round, value) pairs of the rows whose ``key`` holds a number."""
    points = []
    for row in rows:
        value = row.get(key)
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            points.append((row["round"], float(value)))
    return points


def _header(key: str) -> str:
    """A summary_table column's header: "tier 0.5", "holdout 0.5", else the key."""
    prefix = next((p for p in _PREFIXES if key.startswith(p)), None)
    return key if prefix is None else _PREFIXES[prefix] + key[len(prefix):]


def _table_cell(key: str, value: Any) -> str:
    """Format one summary_table cell."""
    if value is None:
        return "-"
    if isinstance(value, list | dict):
        return str(len(value))  # e.g. the ids of accepted clients: show how many
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return str(value)
    if key == "accuracy" or key.startswith(tuple(_PREFIXES)):
        return f"{value:.3f}"
    if key == "loss":
        return f"{value:.4f}"
    if key == "seconds":
        return f"{value:.1f}"
    return str(value)
