"""The C++ device client (device_cpp/) trains real FedAvg rounds with ``fedsdk-server run``.

A real server process (``python -m server_toolkit.cli run``, programs torchspec/1 and pte/1)
and two devices over a real mosquitto: the C++ client (ExecuTorch, pte/1) and the Python
agent, each with half of the digits training split. Three rounds must complete with both
updates accepted every round, the C++ client's updates recorded with runtime "executorch",
and the global model's test accuracy must rise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sdk_device.data.npz import save_npz
from sdk_device.runtimes.native_build import find_or_build_kernels
from server_toolkit.data.datasets import load_dataset
from server_toolkit.fleet.registry import FleetRegistry
from server_toolkit.sim.partition import partition
from server_toolkit.sim.simulate import start_device_process, stop_processes

from .cpp_client import start_client, write_data

pytestmark = pytest.mark.integration

ROUNDS = 3


def _cli(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "server_toolkit.cli", *args], **kw)


# The server exports the pte/1 program twice (round 1 and its pairing service, one at a time):
# ~1 min on a free 2-core machine, several on a loaded one; hence more than the default 300 s.
@pytest.mark.timeout(600)
def test_cpp_client_and_python_agent_complete_fedavg_rounds_and_accuracy_rises(
    cpp_device, mosquitto, tmp_path
):
    run_dir = tmp_path / "run"
    assert _cli("devices", "add", "--run-dir", str(run_dir), "cpp-0", "py-0").wait(60) == 0
    data = load_dataset("digits", seed=0)
    halves = partition(data.y_train, 2, "iid", seed=0)
    cpp_data = write_data(tmp_path / "cpp-0" / "data", data.x_train[halves[0]], data.y_train[halves[0]])
    py_data = tmp_path / "py-0" / "data.npz"
    py_data.parent.mkdir(parents=True)
    save_npz(py_data, data.x_train[halves[1]], data.y_train[halves[1]])

    with open(tmp_path / "server.log", "wb") as server_log:
        server = _cli(
            "run",
            "--broker",
            mosquitto.url,
            "--fleet",
            "cpp",
            "--run-dir",
            str(run_dir),
            "--programs",
            "torchspec/1,pte/1",
            "--rounds",
            str(ROUNDS),
            "--min-devices",
            "2",
            "--local-epochs",
            "2",
            "--round-timeout",
            "300",
            "--fleet-timeout",
            "300",
            stdout=server_log,
            stderr=subprocess.STDOUT,
        )
    procs = [
        start_client(
            cpp_device,
            mosquitto.url,
            "cpp",
            "cpp-0",
            cpp_data,
            tmp_path / "cpp-0" / "work",
            tmp_path / "cpp-0.log",
            "--heartbeat",
            "1",
            # The server offers fused pte/1 programs by default: the client loads the kernels.
            env={**os.environ, "FEDSDK_KERNELS_LIB": str(find_or_build_kernels())},
        ),
        start_device_process(
            mosquitto.url, "cpp", "py-0", py_data, tmp_path / "py-0" / "work", tmp_path / "py-0.log"
        ),
    ]
    try:
        code = server.wait(timeout=500)
    finally:
        if server.poll() is None:
            server.kill()
        stop_processes(procs)
    logs = {p.name: p.read_text(errors="replace")[-3000:] for p in tmp_path.glob("*.log")}
    assert code == 0, logs

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [r["round"] for r in rows] == list(range(1, ROUNDS + 1)), rows
    assert all(r["accepted"] == 2 and r["rejected"] == 0 for r in rows), rows
    assert rows[-1]["accuracy"] > rows[0]["accuracy"], rows
    assert rows[-1]["accuracy"] >= 0.8, rows

    registry = FleetRegistry(run_dir / "registry.sqlite")
    try:
        for rnd in range(1, ROUNDS + 1):
            by_device = {u["device_id"]: u for u in registry.updates(rnd)}
            assert set(by_device) == {"cpp-0", "py-0"}, by_device
            cpp = by_device["cpp-0"]["metrics"]
            assert cpp["runtime"] == "executorch" and cpp["samples"] == len(halves[0]), cpp
    finally:
        registry.close()
