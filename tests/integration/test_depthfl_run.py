"""A short DepthFL run with mutual self-distillation learns, and scores tiers on the ensemble.

``simulate --grid inprocess`` on digits: 4 devices on tiers 1 and 2 of LeNet-5's multi-exit
variant, IID, 5 rounds of 2 local epochs with the device Adam lr at 0.003 (the paper's 5e-4
needs more rounds than a test can spend). Measured: tier 2's ensemble accuracy 0.93 at
round 5 (chance 0.1); the test asks for more than 0.8. About 20 s.
"""

from __future__ import annotations

import json

from click.testing import CliRunner

from server_toolkit.cli import main


def test_depthfl_with_self_distillation_learns_and_scores_the_full_tier_on_its_exit_ensemble(tmp_path,
                                                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["simulate", "--method", "depthfl", "--model", "lenet5_multi_exit", "--tiers", "1,2",
            "--grid", "inprocess", "--devices", "4", "--rounds", "5", "--partition", "iid",
            "--local-epochs", "2", "--method-option", "client_lr=0.003", "--run-dir", "run"]
    result = CliRunner().invoke(main, args, prog_name="fedsdk-server", catch_exceptions=False)
    assert result.exit_code == 0, result.output
    last = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()][-1]
    assert last["accuracy_tier_2"] > 0.8 and last["accuracy_tier_1"] > 0.6
    # tier 2 deploys the whole model: its score is the ensemble of both exits, not the final exit
    assert last["accuracy_tier_2"] == last["accuracy_ensemble"]
    assert last["accuracy_tier_1"] == last["accuracy_exit1"]  # one exit: its ensemble is that exit
