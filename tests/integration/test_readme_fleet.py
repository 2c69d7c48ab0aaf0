"""README "A real fleet", typed as written: certificates, a security directory with a TLS
listener, mosquitto enforcing it, `fedsdk-server run`, two pairing codes, two devices on this
host (each with its own config directory) paired with the printed command and run with the
default recipe on half of digits' training split each. Twenty rounds complete with a useful
model, the server's stdout (a file, not a terminal) says what happened, and a second `run` of
the same fleet in a new run directory serves the same devices without `devices add`.

Loopback only: the certificate and the listener are for 127.0.0.1 where the README has a LAN
address, on a free port."""

from __future__ import annotations

import json
import os
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sdk_device.data.npz import save_npz
from server_toolkit.broker.mosquitto import free_port
from server_toolkit.broker.ports import port_in_use
from server_toolkit.data.datasets import load_dataset

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def server(cwd: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    done = subprocess.run([str(BIN / "fedsdk-server"), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=ENV)
    assert done.returncode == 0, f"fedsdk-server {' '.join(args)}: {done.stdout}{done.stderr}"
    return done


def device(config_dir: Path, *args: str) -> tuple[list[str], dict]:
    """A `fedsdk` command line (``args[0]`` the subcommand) of the device whose config lives in
    ``config_dir``, as docs/fleet.md's "Several devices on one host" types it, and its env."""
    return [str(BIN / "fedsdk"), args[0], "--config-dir", str(config_dir), *args[1:]], ENV


def wait_until(check, timeout_s: float, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert proc is None or proc.poll() is None, f"{what}: the process exited ({proc.returncode})"
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:.0f} s"
        time.sleep(0.3)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT if proc.args[0].endswith("fedsdk") else signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.timeout(1800)  # two pairings time every runtime; twenty rounds; a second run
def test_the_readme_fleet_trains_twenty_rounds_and_a_second_run_serves_the_same_devices(tmp_path):
    port = free_port()
    data = load_dataset("digits", seed=0)  # the server evaluates on the test split: devices hold the rest
    half = len(data.y_train) // 2
    save_npz(tmp_path / "kitchen.npz", data.x_train[:half], data.y_train[:half])
    save_npz(tmp_path / "garage.npz", data.x_train[half:], data.y_train[half:])

    server(tmp_path, "certs", "init", "--dir", "broker", "--host", "127.0.0.1")
    server(tmp_path, "security", "init", "--security-dir", "broker", "--fleet", "lab",
           "--host", "127.0.0.1", "--port", str(port))
    names = ("broker", "run", "run2", "kitchen", "garage")
    logs = {name: open(tmp_path / f"{name}.log", "w") for name in names}  # noqa: SIM115
    procs: list[subprocess.Popen] = []
    try:
        broker = subprocess.Popen([str(BIN / "fedsdk-server"), "broker", "--mosquitto",
                                   "--security-dir", "broker"], cwd=tmp_path, stdout=logs["broker"],
                                  stderr=subprocess.STDOUT, env=ENV)
        procs.append(broker)
        wait_until(lambda: port_in_use("127.0.0.1", port), 60, "mosquitto listening", broker)

        first = subprocess.Popen(
            [str(BIN / "fedsdk-server"), "run", "--security-dir", "broker", "--fleet", "lab",
             "--run-dir", "runs/lab", "--min-devices", "2", "--rounds", "20"],
            cwd=tmp_path, stdout=logs["run"], stderr=(tmp_path / "run.err").open("w"), env=ENV)
        procs.append(first)
        wait_until(lambda: (tmp_path / "runs/lab/fleet.json").exists(), 180, "the server serving", first)

        devices = {}
        for name in ("kitchen", "garage"):
            printed = server(tmp_path, "pair-code", "--run-dir", "runs/lab").stdout
            command = next(line.strip() for line in printed.splitlines()
                           if line.strip().startswith("fedsdk pair"))
            assert f"--server mqtts://127.0.0.1:{port} --ca-fingerprint sha256:" in command
            args, env = device(tmp_path / f"{name}-config", *shlex.split(command)[1:],
                               "--data", str(tmp_path / f"{name}.npz"), "--name", name)
            paired = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
            assert paired.returncode == 0, paired.stdout + paired.stderr
            assert f"paired as {name} in fleet lab" in paired.stdout
            args, env = device(tmp_path / f"{name}-config", "run")
            devices[name] = subprocess.Popen(args, cwd=tmp_path, stdout=logs[name], stderr=subprocess.STDOUT,
                                             env=env)
            procs.append(devices[name])

        assert first.wait(timeout=1500) == 0, (tmp_path / "run.err").read_text()[-3000:]
        first_rows = rows(tmp_path / "runs/lab")
        assert [r["round"] for r in first_rows] == list(range(1, 21))
        assert all(r["accepted"] == 2 for r in first_rows)
        assert first_rows[-1]["accuracy"] >= 0.8, [round(r["accuracy"], 3) for r in first_rows]

        out = (tmp_path / "run.log").read_text()  # stdout of a server whose output is a file
        final = first_rows[-1]["accuracy"]
        closed = f"round 20 closed: 2/2 updates accepted, 0 rejected; accuracy {final:.3f}"
        for line in ("fleet lab: 0 device(s) registered", "device kitchen online:", "device garage online:",
                     "round 1 opens: 2 device(s) asked of 2 online", "round 1: accepted update from kitchen",
                     "round 1: accepted update from garage", closed):
            assert line in out, f"{line!r} not in the server's stdout:\n{out[-3000:]}"
        assert "rejected" not in (tmp_path / "run.err").read_text()

        # The same fleet, a new run directory: no `devices add`, the devices still running.
        second = subprocess.Popen(
            [str(BIN / "fedsdk-server"), "run", "--security-dir", "broker", "--fleet", "lab",
             "--run-dir", "runs/lab2", "--min-devices", "2", "--rounds", "3"],
            cwd=tmp_path, stdout=logs["run2"], stderr=subprocess.STDOUT, env=ENV)
        procs.append(second)
        assert second.wait(timeout=600) == 0, (tmp_path / "run2.log").read_text()[-3000:]
        second_rows = rows(tmp_path / "runs/lab2")
        assert [r["round"] for r in second_rows] == [1, 2, 3]
        assert all(r["accepted"] == 2 for r in second_rows)
        assert "fleet lab: 2 device(s) registered" in (tmp_path / "run2.log").read_text()
        db = sqlite3.connect(tmp_path / "runs/lab2/registry.sqlite")
        senders = {r[0] for r in db.execute("SELECT device_id FROM updates")}
        db.close()
        assert senders == {"kitchen", "garage"}
        listed = server(tmp_path, "devices", "list", "--security-dir", "broker").stdout
        assert "kitchen" in listed and "garage" in listed
    finally:
        for proc in reversed(procs):
            stop(proc)
        for log in logs.values():
            log.close()
