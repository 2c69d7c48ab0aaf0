"""Ctrl-C on ``simulate`` keeps what the finished rounds produced: metrics, the plot and a
summary.json saying the run was stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ctrl_c_on_simulate_writes_the_summary_and_plot_of_the_finished_rounds(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "server_toolkit.cli", "simulate", "--grid", "inprocess", "--devices", "3",
         "--rounds", "200", "--local-epochs", "1", "--partition", "iid", "--run-dir", str(run_dir)],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
        # a test session started in the background of a script ignores SIGINT, and so would the
        # child: Ctrl-C is what this test sends, so the child starts with SIGINT's default
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 2):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    summary = json.loads((run_dir / "summary.json").read_text())
    done = len(metrics.read_text().splitlines())
    assert summary["status"] == "stopped" and summary["rounds"] == done >= 2
    assert (run_dir / "accuracy.png").stat().st_size > 0
    assert f"stopped after round {summary['last_round']}" in out
    assert "Traceback" not in err
