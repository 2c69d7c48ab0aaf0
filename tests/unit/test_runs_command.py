"""``fedsdk-server runs list | show`` over run directories that finished, failed and were stopped."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from server_toolkit.cli.runs import runs
from server_toolkit.report.run_status import record_status, run_status


def _run(path: Path, rounds_planned: int, accuracies: list[float], summary: dict | None) -> None:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"method": "fedprox", "dataset": "digits",
                                                  "rounds": rounds_planned}))
    (path / "metrics.jsonl").write_text("".join(json.dumps({"round": i + 1, "accuracy": a}) + "\n"
                                                for i, a in enumerate(accuracies)))
    if summary is not None:
        (path / "summary.json").write_text(json.dumps(summary))


def test_runs_list_prints_a_finished_and_a_failed_run_with_their_status(tmp_path):
    _run(tmp_path / "runs" / "20260101-120000", 3, [0.5, 0.7, 0.81], {"final_accuracy": 0.81,
                                                                      "status": "finished"})
    _run(tmp_path / "runs" / "20260101-130000", 3, [0.4], None)  # crashed after round 1: no summary
    result = CliRunner().invoke(runs, ["list", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    lines = [line.split() for line in result.output.splitlines()]
    assert lines[0] == ["run", "method", "dataset", "rounds", "final", "accuracy", "best", "status"]
    assert lines[1] == ["20260101-120000", "fedprox", "digits", "3/3", "0.8100", "–", "finished"]
    assert lines[2] == ["20260101-130000", "fedprox", "digits", "1/3", "0.4000", "–", "failed"]


def test_the_status_rule_reads_summary_status_first_then_rounds_done_against_planned(tmp_path):
    _run(tmp_path / "old-complete", 2, [0.5, 0.6], {"final_accuracy": 0.6})  # no "status": older summary
    _run(tmp_path / "old-short", 3, [0.5], {"final_accuracy": 0.5})
    _run(tmp_path / "interrupted", 5, [0.5, 0.6], None)
    record_status(tmp_path / "interrupted", "stopped")
    assert run_status(tmp_path / "old-complete", 2) == "finished"
    assert run_status(tmp_path / "old-short", 3) == "stopped"
    assert run_status(tmp_path / "interrupted", 5) == "stopped"
    summary = json.loads((tmp_path / "interrupted" / "summary.json").read_text())
    assert summary == {"run": "interrupted", "rounds": 2, "status": "stopped"}


def test_runs_show_prints_the_status_config_and_each_round(tmp_path):
    _run(tmp_path / "runs" / "r1", 2, [0.5, 0.75], {"status": "finished"})
    result = CliRunner().invoke(runs, ["show", "r1", "--dir", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    assert "run r1" in result.output and "finished, 2/2 rounds, fedprox on digits" in result.output
    assert result.output.splitlines()[-1].split() == ["2", "0.7500"]
    missing = CliRunner().invoke(runs, ["show", "nope", "--dir", str(tmp_path / "runs")])
    assert missing.exit_code != 0 and "no run 'nope'" in missing.output
