"""Two aggregation features at once (privacy, secure aggregation, async mode, edges) are refused
in one line before anything starts, until the pair is built and tested together."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from server_toolkit.cli import main

PAIRS = [
    (["--secagg", "--mode", "async"], "--secagg and --mode async"),
    (["--dp-clip", "1.0", "--dp-noise-multiplier", "1.0", "--secagg"],
     "--dp-*/--label-noise-epsilon/--robust and --secagg"),
    (["--robust", "median", "--mode", "async"], "--dp-*/--label-noise-epsilon/--robust and --mode async"),
    (["--robust", "median", "--edges", "2"], "--dp-*/--label-noise-epsilon/--robust and --edges"),
]


@pytest.mark.parametrize(("extra", "words"), PAIRS, ids=[w for _, w in PAIRS])
def test_two_aggregation_features_are_refused_before_anything_starts(extra, words, tmp_path):
    runner = CliRunner()
    with runner.isolated_filesystem(temp_dir=tmp_path):
        result = runner.invoke(main, ["simulate", "--rounds", "1", "--devices", "2", *extra])
        assert result.exit_code == 2, result.output
        assert words in result.output and "do not combine" in result.output
        assert not any(tmp_path.rglob("runs"))
