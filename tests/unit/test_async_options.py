"""``--mode async`` and its options are checked before anything starts: one line per mistake."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from server_toolkit.cli import main as cli


@pytest.mark.parametrize(("args", "says"), [
    (["--buffer", "3"], "--buffer apply only with --mode async"),
    (["--mode", "async", "--buffer", "0"], "--buffer must be >= 1"),
    (["--mode", "async", "--max-staleness", "-1"], "--max-staleness must be >= 0"),
    (["--mode", "async", "--concurrency", "0"], "--concurrency must be >= 1"),
    (["--mode", "async", "--server-lr", "0"], "--server-lr must be > 0"),
    (["--mode", "async", "--grid", "inprocess"], "--mode async needs --grid mqtt"),
    (["--mode", "async", "--eval-every", "0"], "--eval-every must be >= 1"),
    (["--eval-every", "2"], "--eval-every apply only with --mode async"),
    (["--mode", "async", "--method", "pfedhn"], "method pfedhn does not support --mode async"),
])
def test_simulate_refuses_a_bad_async_combination_in_one_line_before_starting(tmp_path, args, says):
    run_dir = tmp_path / "run"
    result = CliRunner().invoke(cli, ["simulate", *args, "--run-dir", str(run_dir)])
    assert result.exit_code != 0
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and says in lines[0], result.output
    assert not run_dir.exists()  # nothing started


def test_run_takes_the_same_checks():
    result = CliRunner().invoke(cli, ["run", "--fleet", "f", "--run-dir", "x", "--mode", "async",
                                      "--method", "hypemefed"])
    assert result.exit_code != 0 and "method hypemefed does not support --mode async" in result.output
