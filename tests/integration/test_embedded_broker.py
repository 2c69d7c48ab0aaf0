"""The zero-setup path: `fedsdk-server simulate` on the embedded (amqtt) broker."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from server_toolkit.broker.embedded import EmbeddedBroker

pytestmark = pytest.mark.integration


def test_simulate_command_runs_a_federation_on_the_embedded_broker(tmp_path):
    cmd = [sys.executable, "-m", "server_toolkit.cli", "simulate", "--devices", "3", "--rounds", "2",
           "--partition", "iid", "--runs-dir", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "embedded amqtt" in done.stdout
    (run_dir,) = list(tmp_path.iterdir())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2]
    assert all(r["accepted"] == 3 for r in rows)
    assert rows[-1]["accuracy"] > 0.6
    for name in ("metrics.csv", "accuracy.png", "summary.json", "state.json", "registry.sqlite"):
        assert (run_dir / name).is_file(), name
    summary = json.loads((run_dir / "summary.json").read_text())  # the quality guard kept the best
    assert summary["status"] == "finished" and "divergence" not in summary
    assert summary["guard"] == {"on_divergence": "rollback", "rollbacks": 0, "lr_scale": 1.0, "verdict": None}
    assert summary["best"]["round"] == summary["best_round"] and (run_dir / summary["best"]["path"]).is_file()
    assert summary["last"] == {"round": 2, "accuracy": rows[-1]["accuracy"],
                               "path": "checkpoints/global_r0002.safetensors"}


def test_resume_continues_from_the_last_checkpoint(tmp_path):
    base = [sys.executable, "-m", "server_toolkit.cli", "simulate", "--devices", "2", "--partition", "iid",
            "--runs-dir", str(tmp_path)]
    first = subprocess.run([*base, "--rounds", "1"], capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    (run_dir,) = list(tmp_path.iterdir())
    again = subprocess.run([*base, "--rounds", "2", "--resume", str(run_dir)], capture_output=True,
                           text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2]  # round 1 was not run again
    assert json.loads((run_dir / "state.json").read_text())["round"] == 2


def test_embedded_broker_refuses_a_public_address():
    with pytest.raises(ValueError, match="loopback"):
        EmbeddedBroker(host="0.0.0.0")
    assert EmbeddedBroker(host="0.0.0.0", allow_remote=True).host == "0.0.0.0"
