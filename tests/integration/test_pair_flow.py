"""The first five minutes, as a user types them: start the server on a secured mosquitto
(accounts + ACL + TLS), make a pairing code, pair the device with the printed command, run
it with no options, and one round completes. Real CLIs as processes; the device's config
lives in its own directory (FEDSDK_CONFIG_DIR)."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sdk_device.data.npz import save_npz
from server_toolkit.data.datasets import load_dataset

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent


def _wait_for(path: Path, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert proc.poll() is None, f"the server exited early ({proc.returncode})"
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.2)


def test_pair_code_pair_run_one_round(secured_mosquitto_tls, tmp_path):
    secured = secured_mosquitto_tls
    run_dir, device_home = tmp_path / "run", tmp_path / "device-config"
    data = load_dataset("digits", seed=0)
    save_npz(tmp_path / "data.npz", data.x_train[:240], data.y_train[:240])
    env = {**os.environ, "FEDSDK_CONFIG_DIR": str(device_home), "OMP_NUM_THREADS": "1"}
    server_log = open(tmp_path / "server.log", "w")  # noqa: SIM115
    server = subprocess.Popen(
        [
            str(BIN / "fedsdk-server"),
            "-v",
            "run",
            "--broker-security",
            str(secured.security.directory),
            "--fleet",
            secured.fleet,
            "--run-dir",
            str(run_dir),
            "--method",
            "heterofl",
            "--tiers",
            "1.0,0.5",
            "--rounds",
            "1",
            "--local-epochs",
            "1",
            "--round-timeout",
            "120",
        ],
        stdout=server_log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        _wait_for(run_dir / "fleet.json", server, 120)
        code = subprocess.run(
            [str(BIN / "fedsdk-server"), "pair-code", "--run-dir", str(run_dir)],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert code.returncode == 0, code.stderr
        command = next(
            line.strip() for line in code.stdout.splitlines() if line.strip().startswith("fedsdk pair")
        )
        assert "--ca-fingerprint sha256:" in command and secured.url in command

        args = shlex.split(command)
        paired = subprocess.run(
            [str(BIN / "fedsdk"), *args[1:], "--data", str(tmp_path / "data.npz"), "--name", "pi-kitchen"],
            capture_output=True,
            text=True,
            timeout=180,
            env=env,
        )
        assert paired.returncode == 0, paired.stdout + paired.stderr
        assert "paired as pi-kitchen in fleet sec, tier 1.0" in paired.stdout
        assert "ms per step" in paired.stdout  # progress while profiling
        stored = device_home / "device.json"
        assert stat.S_IMODE(stored.stat().st_mode) == 0o600
        config = json.loads(stored.read_text())
        assert config["device_id"] == "pi-kitchen" and config["ca_file"] and config["password"]
        # an unguessable MQTT client id: the public pairing account cannot take the device's over
        assert config["client_id"].startswith("fedsdk-dev-pi-kitchen-") and len(config["client_id"]) >= 38

        agent = subprocess.run(
            [str(BIN / "fedsdk"), "run", "--max-tasks", "1"],
            capture_output=True,
            text=True,
            timeout=180,
            env=env,
        )
        assert agent.returncode == 0, agent.stderr[-3000:]
        assert server.wait(timeout=120) == 0
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert rows[-1]["round"] == 1 and rows[-1]["accepted"] == 1

        status = subprocess.run(
            [str(BIN / "fedsdk"), "status"], capture_output=True, text=True, timeout=60, env=env
        )
        assert status.returncode == 0, status.stdout + status.stderr
        assert (
            "paired: pi-kitchen in fleet sec, tier 1.0" in status.stdout
            and "last task: round 1" in status.stdout
        )
        show = subprocess.run(
            [str(BIN / "fedsdk-server"), "devices", "show", "--run-dir", str(run_dir), "pi-kitchen"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert (
            show.returncode == 0
            and "tier decision (auto)" in show.stdout
            and "updates accepted" in show.stdout
        )
    finally:
        if server.poll() is None:
            server.terminate()
            server.wait(timeout=30)
        server_log.close()
