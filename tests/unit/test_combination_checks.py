"""Aggregation features combine pair by pair: a refused pair is refused in one line with its
reason before anything starts, and docs/privacy.md's table says what the code decides."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from click.testing import CliRunner

from server_toolkit.cli import main
from server_toolkit.cli.combination_checks import FEATURES, NEEDS_EDGES, REFUSED, features, refusal

DOC = Path(__file__).resolve().parents[2] / "docs" / "privacy.md"

PAIRS = [
    (["--secagg", "--mode", "async"], "do not combine without --edges: the masks cancel only over a cohort"),
    (["--dp-adaptive-clip", "0.5", "--dp-noise-multiplier", "1.0", "--secagg"], "needs each device's norm"),
    (["--robust", "median", "--secagg"], "a median or trimmed mean cannot be computed from a masked sum"),
    (["--dp-clip", "1.0", "--dp-mode", "local", "--mode", "async"], "several updates per version"),
]


@pytest.mark.parametrize(("extra", "words"), PAIRS, ids=[w for _, w in PAIRS])
def test_a_refused_pair_is_refused_in_one_line_with_its_reason_before_anything_starts(extra, words, tmp_path):
    runner = CliRunner()
    with runner.isolated_filesystem(temp_dir=tmp_path):
        result = runner.invoke(main, ["simulate", "--rounds", "1", "--devices", "2", *extra])
        assert result.exit_code == 2, result.output
        assert words in result.output and "do not combine" in result.output
        assert not any(tmp_path.rglob("runs"))


def test_the_options_name_the_features_they_switch_on():
    on = features({"edges": 2, "mode": "async", "dp_clip": 1.0, "dp_mode": "central", "robust": None,
                   "label_noise_epsilon": 1.0, "secagg": None})
    assert on == ["edges", "async", "central DP", "label noise"]
    assert features({"dp_clip": 1.0, "dp_mode": "local"}) == ["local DP"]
    assert refusal(on[:3]) is None  # edges + async + central DP: no refused pair among them
    assert refusal(on).startswith("--mode async and --label-noise-epsilon do not combine: ")
    four = features({"edges": 2, "mode": "async", "secagg": {"threshold": 0.5}, "dp_clip": 1.0,
                     "dp_mode": "central"})
    assert four == ["edges", "async", "secagg", "central DP"] and refusal(four) is None  # the four-way stack
    assert refusal(four[1:]).startswith("--mode async and --secagg do not combine without --edges: ")
    assert refusal(four[1:], flat=False) is None  # run: its edges say hello themselves


def _doc_table() -> dict[frozenset[str], tuple[str, str]]:
    text = DOC.read_text(encoding="utf-8").split("## Features together", 1)[1].split("\n## ", 1)[0]
    out = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and " + " in cells[0]:
            pair = frozenset(name.lower() for name in cells[0].split(" + "))
            out[pair] = (cells[1], cells[2].replace("`", ""))
    return out


def test_the_docs_table_decides_every_pair_as_the_code_does():
    table = _doc_table()
    refused = {frozenset(name.lower() for name in pair): why for pair, why in REFUSED.items()}
    behind = {frozenset(name.lower() for name in pair): why for pair, why in NEEDS_EDGES.items()}
    pairs = {frozenset(name.lower() for name in p) for p in itertools.combinations(FEATURES, 2)}
    assert set(table) == pairs  # every pair once, no other
    for pair, (decision, why) in table.items():
        expected = "refused" if pair in refused else "works behind edges" if pair in behind else "works"
        assert decision == expected, sorted(pair)
        if pair in refused or pair in behind:
            assert why == {**refused, **behind}[pair], sorted(pair)  # the code's reason, word for word


@pytest.mark.parametrize("extra", [["--programs", "pte/1"], ["--device-runtime", "executorch-native"]],
                         ids=["pte programs", "torch-free runtime"])
def test_simulate_refuses_fedconvs_edges_for_devices_that_cannot_run_the_torchspec_programs_they_forward(
        extra, tmp_path):
    runner = CliRunner()
    with runner.isolated_filesystem(temp_dir=tmp_path):
        result = runner.invoke(main, ["simulate", "--method", "fedconv", "--rounds", "1", "--devices", "4",
                                      "--edges", "2", *extra])
        assert result.exit_code == 2, result.output
        assert "--edges with FedConv: its clustering edges forward the server's programs" in result.output
        assert not any(tmp_path.rglob("runs"))
