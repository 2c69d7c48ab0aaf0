"""`fedsdk-server simulate --method hypemefed` over a real mosquitto with three exit tiers."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_hypemefed_simulation_with_three_tiers_completes_rounds(mosquitto, tmp_path):
    cmd = [sys.executable, "-m", "server_toolkit.cli", "simulate", "--method", "hypemefed",
           "--model", "vgg_multi_exit", "--tiers", "1,2,3", "--devices", "3", "--rounds", "2",
           "--local-epochs", "1", "--partition", "iid", "--broker", mosquitto.url,
           "--method-option", "rank=100", "--method-option", "hn_gate=false",  # generate from round 1
           "--runs-dir", str(tmp_path / "runs")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run_dir,) = list((tmp_path / "runs").iterdir())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2]
    for row in rows:
        assert row["accepted"] == 3 and row["rejected"] == 0
        # the tier-1 device gets segments 2 and 3 generated (2 convs each), the tier-2 one segment 3
        assert row["generated"] == 4 + 2
        assert row["hn_trained"] == 4 and 0 < row["hn_rel_mse"] < 10
        assert all(0 <= row[f"accuracy_exit{i}"] <= 1 for i in (1, 2, 3))
        assert row["accuracy"] == row["accuracy_exit3"]  # the paper's metric: the final exit
    state = json.loads((run_dir / "state.json").read_text())
    assert state["method"] == "hypemefed" and len(state["method_state"]["hypernets"]["trained"]) == 4
