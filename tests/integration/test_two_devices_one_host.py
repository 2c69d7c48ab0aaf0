"""Two devices on one host, each with its own configuration directory (`--config-dir`): the
second pairing into a used directory is refused with a hint to `--config-dir`; with one of
its own it pairs, both run a round, `status` and `unpair` act on the directory given. The
option wins over $FEDSDK_CONFIG_DIR. Real CLIs as processes, the pairing flow of the README."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from sdk_device.data.npz import save_npz
from server_toolkit.data.datasets import load_dataset

from .test_pair_flow import _wait_for

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent


def _fedsdk(env: dict, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "fedsdk"), *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


def test_two_devices_pair_and_train_on_one_host_each_with_its_own_config_dir(secured_mosquitto, tmp_path):
    secured = secured_mosquitto
    run_dir, home_a, home_b = tmp_path / "run", tmp_path / "dev-a", tmp_path / "dev-b"
    data = load_dataset("digits", seed=0)
    for name, part in (("a", slice(0, 200)), ("b", slice(200, 400))):
        save_npz(tmp_path / f"{name}.npz", data.x_train[part], data.y_train[part])
    env = {**os.environ, "FEDSDK_CONFIG_DIR": str(home_a), "OMP_NUM_THREADS": "1"}
    server_log = open(tmp_path / "server.log", "w")  # noqa: SIM115
    server = subprocess.Popen(
        [str(BIN / "fedsdk-server"), "-v", "run", "--broker-security", str(secured.security.directory),
         "--fleet", secured.fleet, "--run-dir", str(run_dir), "--rounds", "1", "--min-devices", "2",
         "--local-epochs", "1", "--round-timeout", "120"],
        stdout=server_log, stderr=subprocess.STDOUT, env=env)
    try:
        _wait_for(run_dir / "fleet.json", server, 120)
        codes = subprocess.run([str(BIN / "fedsdk-server"), "pair-code", "--run-dir", str(run_dir),
                                "--count", "2"], capture_output=True, text=True, timeout=60, env=env)
        assert codes.returncode == 0, codes.stderr
        commands = [shlex.split(line.strip())[1:] for line in codes.stdout.splitlines()
                    if line.strip().startswith("fedsdk pair")]
        assert len(commands) == 2

        first = _fedsdk(env, *commands[0], "--data", str(tmp_path / "a.npz"), "--name", "pi-a")  # env dir
        assert first.returncode == 0, first.stdout + first.stderr
        refused = _fedsdk(env, *commands[1], "--data", str(tmp_path / "b.npz"), "--name", "pi-b")
        assert refused.returncode != 0
        assert "already paired as 'pi-a'" in refused.stderr and "--config-dir" in refused.stderr
        second = _fedsdk(env, *commands[1], "--data", str(tmp_path / "b.npz"), "--name", "pi-b",
                         "--config-dir", str(home_b))  # the code was not spent by the refusal
        assert second.returncode == 0, second.stdout + second.stderr
        assert f"fedsdk run --config-dir {home_b}" in second.stdout  # the next command, as typed
        stored = {d.name: json.loads((d / "device.json").read_text()) for d in (home_a, home_b)}
        assert stored["dev-a"]["device_id"] == "pi-a" and stored["dev-b"]["device_id"] == "pi-b"
        assert stored["dev-a"]["work_dir"] != stored["dev-b"]["work_dir"]
        assert stored["dev-b"]["work_dir"].startswith(str(home_b))
        assert stored["dev-b"]["ca_file"] is None or stored["dev-b"]["ca_file"].startswith(str(home_b))

        agents = [subprocess.Popen([str(BIN / "fedsdk"), "run", "--max-tasks", "1", *extra], env=env,
                                   stdout=subprocess.DEVNULL, stderr=open(tmp_path / f"{n}.log", "w"))  # noqa: SIM115
                  for n, extra in (("a", []), ("b", ["--config-dir", str(home_b)]))]
        assert [a.wait(timeout=240) for a in agents] == [0, 0], [
            (tmp_path / f"{n}.log").read_text()[-2000:] for n in "ab"]
        assert server.wait(timeout=120) == 0
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert rows[-1]["round"] == 1 and rows[-1]["accepted"] == 2

        status_b = _fedsdk(env, "status", "--config-dir", str(home_b), "--json", timeout=60)
        status_a = _fedsdk(env, "status", "--json", timeout=60)
        assert json.loads(status_b.stdout)["device_id"] == "pi-b"  # the option wins over the env var
        assert json.loads(status_a.stdout)["device_id"] == "pi-a"
        assert json.loads(status_b.stdout)["last_task"]["round"] == 1

        gone = _fedsdk(env, "unpair", "--yes", "--config-dir", str(home_b), "--timeout", "3", timeout=60)
        assert gone.returncode == 0, gone.stdout + gone.stderr
        assert not (home_b / "device.json").exists() and (home_a / "device.json").exists()
    finally:
        if server.poll() is None:
            server.terminate()
            server.wait(timeout=30)
        server_log.close()
