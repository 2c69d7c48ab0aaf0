"""The Java binding (device_java/, JNI over libfedsdk_device's C ABI) on the host JVM against a
real ``fedsdk-server run`` over mosquitto: the Java program supplies digits samples through its
DataProvider, refuses a broker whose CA does not match the pin, pairs with a one-time code over
mqtts://, and trains three FedAvg rounds whose global accuracy rises; as a registered device it
passes the conformance kit."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from sdk_device.runtimes.native_build import find_or_build_kernels
from server_toolkit.conformance import check_names, run_checks
from server_toolkit.data.datasets import load_dataset
from server_toolkit.fleet.registry import FleetRegistry
from server_toolkit.sim.simulate import stop_processes

from .java_device import build_java, java_command, write_samples

pytestmark = pytest.mark.integration

ROUNDS = 3


@pytest.fixture(scope="session")
def java_binding():
    return build_java()


def _cli(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "server_toolkit.cli", *args], **kw)


def _wait_for(path, proc, timeout_s: float) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert proc.poll() is None, f"the server exited early ({proc.returncode})"
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.2)


# The server exports the pte/1 program for pairing and for round 1 (seconds each when idle).
@pytest.mark.timeout(1200)
def test_java_device_refuses_a_foreign_ca_pairs_with_a_code_and_trains_fedavg_rounds(
    java_binding, secured_mosquitto_tls, tmp_path
):
    secured, run_dir = secured_mosquitto_tls, tmp_path / "run"
    data = load_dataset("digits", seed=0)
    samples = write_samples(tmp_path / "samples.bin", data.x_train[:600], data.y_train[:600])
    with open(tmp_path / "server.log", "wb") as server_log:
        server = _cli(
            "run",
            "--broker-security",
            str(secured.security.directory),
            "--fleet",
            secured.fleet,
            "--run-dir",
            str(run_dir),
            "--programs",
            "torchspec/1,pte/1",
            "--rounds",
            str(ROUNDS),
            "--min-devices",
            "1",
            "--local-epochs",
            "2",
            "--round-timeout",
            "300",
            stdout=server_log,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_for(run_dir / "fleet.json", server, 120)
        made = subprocess.run(
            [sys.executable, "-m", "server_toolkit.cli", "pair-code", "--run-dir", str(run_dir)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert made.returncode == 0, made.stderr
        code = re.search(r"--code (\S+)", made.stdout).group(1)
        work = tmp_path / "work"
        pin = re.search(r"--ca-fingerprint (sha256:[0-9a-f]{64})", made.stdout).group(1)
        java = subprocess.run(
            java_command(*java_binding, "pair", secured.url, pin, code, str(samples), str(work), str(ROUNDS)),
            capture_output=True,
            text=True,
            timeout=1100,
            # The server offers fused pte/1 programs by default: the binding loads the kernels.
            env={**os.environ, "FEDSDK_KERNELS_LIB": str(find_or_build_kernels())},
        )
        out = java.stdout
        assert java.returncode == 0, (out[-3000:], java.stderr[-3000:])
        server_code = server.wait(timeout=120)
    finally:
        if server.poll() is None:
            server.kill()
    assert "FOREIGN CA REFUSED: pairing: the broker's CA is sha256:" in out, out
    assert "PAIRED java-phone sec" in out, out
    assert [line.split()[1] for line in out.splitlines() if " accepted " in line] == ["1", "2", "3"], out
    status = json.loads(out.split("STATUS ", 1)[1].splitlines()[0])
    assert status["device_id"] == "java-phone" and status["tasks_done"] == ROUNDS, status
    assert server_code == 0, (tmp_path / "server.log").read_text()[-3000:]

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [r["round"] for r in rows] == [1, 2, 3] and all(r["accepted"] == 1 for r in rows), rows
    assert rows[-1]["accuracy"] > rows[0]["accuracy"] and rows[-1]["accuracy"] >= 0.75, rows
    registry = FleetRegistry(run_dir / "registry.sqlite")
    try:
        metrics = [registry.updates(rnd)[0]["metrics"] for rnd in range(1, ROUNDS + 1)]
    finally:
        registry.close()
    assert all(m["runtime"] == "executorch" and m["samples"] == 600 for m in metrics), metrics


def test_java_device_passes_every_conformance_check(java_binding, mosquitto, tmp_path):
    data = load_dataset("digits", seed=0)
    samples = write_samples(tmp_path / "samples.bin", data.x_train[:200], data.y_train[:200])
    procs, work = [], tmp_path / "work"

    def start_device() -> None:
        with open(tmp_path / "device.log", "ab") as log:
            procs.append(
                subprocess.Popen(
                    java_command(
                        *java_binding, "run", mosquitto.url, "conf", "java-dev", str(samples), str(work)
                    ),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )

    try:
        outcomes = run_checks(mosquitto.url, "conf", "java-dev", ["pte/1"], ready=start_device)
    finally:
        stop_processes(procs)
    failed = {o.name: o.reason for o in outcomes if not o.passed}
    assert [o.name for o in outcomes] == check_names()
    assert not failed, (failed, (tmp_path / "device.log").read_text(errors="replace")[-3000:])
