"""The whole combination matrix over a real mosquitto (``bench/combinations.py`` holds the
whole matrix and its runner): real device processes, and an edge process where edges are in the
pair, on digits, 2 rounds of 3 devices; each run ends above the threshold written in the case
and reports the accountant's epsilon (or the label epsilon) in every row. Every refused pair is
refused in one line with its reason before anything starts.

Every case of the matrix runs here (20 runs, 10-15 s each on an idle machine); the issue's
HeteroFL pairs are among them. The four-way stack is in ``test_combinations.py``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from server_toolkit.cli import main

pytestmark = pytest.mark.integration

BENCH = Path(__file__).resolve().parents[2] / "bench" / "combinations.py"
_spec = importlib.util.spec_from_file_location("bench_combinations", BENCH)
bench = sys.modules.setdefault("bench_combinations", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(bench)  # registered first: its dataclass looks its module up

CASES = {case.name: case for case in bench.cases()}


@pytest.mark.parametrize("name", list(CASES))
def test_a_supported_pair_trains_digits_over_mosquitto_above_its_threshold(name, mosquitto, tmp_path):
    row = bench.run_case(CASES[name], mosquitto.url, tmp_path / "run")
    assert row["problems"] == [], row
    assert row["rounds"] == bench.ROUNDS and row["accuracy"] >= CASES[name].threshold


REFUSED = bench.refused_flags()


@pytest.mark.parametrize(("pair", "flags", "why"), REFUSED, ids=[r[0] for r in REFUSED])
def test_a_refused_pair_is_refused_in_one_line_with_its_reason_before_anything_starts(pair, flags, why,
                                                                                    tmp_path):
    result = CliRunner().invoke(main, ["simulate", "--rounds", "1", "--devices", "3", *flags,
                                       "--runs-dir", str(tmp_path / "runs")])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if "do not combine" in line]
    assert len(lines) == 1 and why in " ".join(result.output.split()), result.output
    assert not (tmp_path / "runs").exists()


def test_the_matrix_runs_every_supported_pair_and_the_heterofl_pairs_the_issue_names():
    pairs = {frozenset(case.features) for case in CASES.values()}
    assert pairs == {frozenset(p) for p in bench.supported_pairs()}
    heterofl = {frozenset(case.features) for case in CASES.values() if case.method == "heterofl"}
    assert {frozenset(p) for p in bench.HETEROFL_EXTRA} <= heterofl
