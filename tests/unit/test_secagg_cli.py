"""``--secagg`` refuses what it cannot serve with one line, before anything starts."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from server_toolkit.cli import main as cli


@pytest.mark.parametrize("args, says", [
    (["--method", "hypemefed"], "hypernetworks are trained on each device's own model"),
    (["--method", "feddm"], "similarity tree"),
    (["--method", "fedavg", "--grid", "inprocess"], "--secagg runs over MQTT"),
])
def test_secagg_refuses_methods_and_grids_it_cannot_serve_in_one_line(tmp_path, args, says):
    result = CliRunner().invoke(cli, ["simulate", "--secagg", "--runs-dir", str(tmp_path), *args])
    assert result.exit_code != 0
    error = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(error) == 1 and says in error[0], result.output
    assert not any(tmp_path.iterdir())  # nothing started, no run directory


def test_secagg_threshold_below_one_half_is_refused(tmp_path):
    result = CliRunner().invoke(cli, ["simulate", "--secagg", "--secagg-threshold", "0.4",
                                      "--runs-dir", str(tmp_path)])
    assert result.exit_code != 0 and "0.4" in result.output
