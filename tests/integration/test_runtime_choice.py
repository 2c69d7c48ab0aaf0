"""Devices offered several programs pick, by self-test, the fastest runtime that passes
parity on their own program; `fedsdk bench` prints the same table."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from server_toolkit.fleet.registry import FleetRegistry
from server_toolkit.sim.simulate import Simulation, SimulationConfig

pytestmark = pytest.mark.integration


def test_devices_choose_a_runtime_that_passed_parity(mosquitto, tmp_path):
    run_dir = tmp_path / "run"
    config = SimulationConfig(devices=2, rounds=1, partition="iid", broker_url=mosquitto.url,
                              program_formats=["torchspec/1", "pte/1"])
    report = Simulation(config, run_dir).run()
    assert report.rows[-1]["accepted"] == 2
    work = run_dir / "devices" / "dev000" / "work"
    choice = json.loads((work / "runtime_choice.json").read_text())
    (entry,) = choice.values()
    rows = {r["runtime"]: r for r in entry["rows"]}
    assert set(rows) == {"torch", "executorch", "executorch-native"}
    assert rows[entry["runtime"]]["passed"] is True
    assert entry["runtime"] == min((r for r in rows.values() if r["passed"]),
                                   key=lambda r: r["ms_per_step"])["runtime"]
    used = {u["metrics"]["runtime"] for u in FleetRegistry(run_dir / "registry.sqlite").updates(1)}
    assert used <= {"torch", "executorch", "executorch-native"} and len(used) >= 1

    bench = subprocess.run([sys.executable, "-m", "sdk_device.cli", "bench", "--work-dir", str(work),
                            "--data", str(run_dir / "devices" / "dev000" / "data.npz"), "--steps", "2"],
                           capture_output=True, text=True, timeout=300)
    assert bench.returncode == 0, bench.stderr
    assert "executorch" in bench.stdout and "fastest runtime that passed parity" in bench.stdout
