"""Unit tests of server_toolkit.report.run_report (fast, no torch)."""

import csv
import json
import logging
from pathlib import Path

import pytest

from server_toolkit.report.run_report import RunReport, final_accuracy

ROWS = [
    {"round": 1, "accuracy": 0.50, "loss": 1.20, "accepted": 3, "rejected": 0, "seconds": 2.0},
    {"round": 2, "accuracy": 0.70, "loss": 0.80, "accepted": 2, "rejected": 1, "seconds": 2.5,
     "clients": {"pi4": 0.7, "esp32": 0.6}},
    {"round": 3, "accuracy": 0.80, "loss": 0.55, "accepted": 3, "rejected": 0, "seconds": 1.5},
]


def _report_with_rows(run_dir: Path) -> RunReport:
    report = RunReport(run_dir)
    for row in ROWS:
        report.add_round(row)
    return report


def _jsonl_rows(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_jsonl_and_csv_after_three_rounds(tmp_path: Path) -> None:
    report = _report_with_rows(tmp_path / "run")

    assert _jsonl_rows(tmp_path / "run") == ROWS
    assert report.rows == ROWS

    with (tmp_path / "run" / "metrics.csv").open(newline="") as f:
        table = list(csv.reader(f))
    header = ["round", "accuracy", "loss", "accepted", "rejected", "seconds", "clients"]
    assert table[0] == header
    assert len(table) == 1 + len(ROWS)
    assert table[1] == ["1", "0.5", "1.2", "3", "0", "2.0", ""]  # no "clients" in round 1
    assert json.loads(table[2][6]) == {"pi4": 0.7, "esp32": 0.6}
    assert table[3][0] == "3" and table[3][6] == ""


def test_rows_property_is_a_copy(tmp_path: Path) -> None:
    report = _report_with_rows(tmp_path)
    report.rows[1]["clients"]["pi4"] = 0.0
    assert report.rows[1]["clients"]["pi4"] == 0.7


def test_write_plot_makes_a_png(tmp_path: Path) -> None:
    report = _report_with_rows(tmp_path)
    path = report.write_plot()
    assert path == tmp_path / "accuracy.png"
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    assert len(data) > 1024


def test_load_round_trips_then_appends(tmp_path: Path) -> None:
    _report_with_rows(tmp_path)

    resumed = RunReport.load(tmp_path)
    assert resumed.rows == ROWS

    resumed.add_round({"round": 4, "accuracy": 0.85})
    assert [row["round"] for row in _jsonl_rows(tmp_path)] == [1, 2, 3, 4]
    assert [row["round"] for row in RunReport.load(tmp_path).rows] == [1, 2, 3, 4]
    with (tmp_path / "metrics.csv").open(newline="") as f:
        assert len(list(csv.reader(f))) == 1 + 4


def test_load_skips_corrupt_trailing_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _report_with_rows(tmp_path)
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('\n{"round": 4, "accur')  # a blank line, then a half-written row

    with caplog.at_level(logging.WARNING):
        resumed = RunReport.load(tmp_path)
    assert resumed.rows == ROWS
    assert "corrupt" in caplog.text

    # The next round lands on its own line, after the rows that were kept.
    resumed.add_round({"round": 4, "accuracy": 0.9})
    assert [row["round"] for row in _jsonl_rows(tmp_path)] == [1, 2, 3, 4]


@pytest.mark.parametrize(
    "row",
    [
        {"accuracy": 0.5},  # no round
        {"round": "1"},
        {"round": 1.0},
        {"round": True},
        {"round": 1, "model": object()},
        {"round": 1, "loss": float("nan")},
        {"round": 1, "per_client": {2: 0.5}},  # non-string key
        ["round", 1],
    ],
)
def test_invalid_row_raises(tmp_path: Path, row: object) -> None:
    report = RunReport(tmp_path)
    with pytest.raises(ValueError):
        report.add_round(row)  # type: ignore[arg-type]
    assert report.rows == []
    assert (tmp_path / "metrics.jsonl").read_text() == ""


def test_summary_table_has_a_line_per_round(tmp_path: Path) -> None:
    report = _report_with_rows(tmp_path)
    table = report.summary_table("digits")
    assert table.row_count == len(ROWS)
    assert [column.header for column in table.columns] == [
        "round", "accuracy", "loss", "accepted", "rejected", "seconds",
    ]
    assert list(table.columns[1].cells) == ["0.500", "0.700", "0.800"]
    assert list(table.columns[5].cells) == ["2.0", "2.5", "1.5"]


def test_summary_table_shows_each_tiers_deployable_accuracy_after_the_accuracy(tmp_path: Path) -> None:
    report = RunReport(tmp_path)
    report.add_round({"round": 1, "accuracy": 0.6, "accuracy_tier_1.0": 0.6, "accuracy_tier_0.5": 0.41234})
    table = report.summary_table()
    assert [column.header for column in table.columns] == ["round", "accuracy", "tier 0.5", "tier 1.0"]
    assert list(table.columns[2].cells) == ["0.412"]


def test_write_summary(tmp_path: Path) -> None:
    report = _report_with_rows(tmp_path)
    path = report.write_summary({"method": "fedavg"})
    summary = json.loads(path.read_text())
    assert summary["rounds"] == 3
    assert summary["final_accuracy"] == 0.8
    assert summary["best_round"] == 3
    assert summary["total_seconds"] == pytest.approx(6.0)
    assert summary["method"] == "fedavg"


def test_final_accuracy() -> None:
    assert final_accuracy([]) is None
    assert final_accuracy([{"round": 1, "loss": 1.0}]) is None
    assert final_accuracy([{"round": 1, "accuracy": 0.4}, {"round": 2, "loss": 0.9}]) == 0.4
