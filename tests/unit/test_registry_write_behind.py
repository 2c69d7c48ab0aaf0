"""The registry's in-memory device states and write-behind bookkeeping
(server_toolkit.fleet.registry, fleet/device_state.py), on real SQLite files and, for other
processes, real ``fedsdk-server devices`` subprocesses."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import server_toolkit.fleet.membership as registry_module
from server_toolkit.fleet.registry import FleetRegistry
from server_toolkit.methods.base import DeviceInfo
from server_toolkit.rounds.mqtt_grid import MqttGrid

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _on_file(path, device_id: str) -> dict:
    """The device's row as another connection sees it."""
    db = sqlite3.connect(path)
    db.row_factory = sqlite3.Row
    try:
        return dict(db.execute("SELECT * FROM devices WHERE device_id=?", (device_id,)).fetchone())
    finally:
        db.close()


@pytest.fixture
def slow_writer(monkeypatch):
    """The writer commits only when told (flush/close) or when BATCH_ROWS devices wait."""
    monkeypatch.setattr(registry_module, "WRITE_INTERVAL_S", 3600.0)


def test_hello_bookkeeping_is_written_behind_and_on_file_after_flush(tmp_path, slow_writer):
    path = tmp_path / "registry.sqlite"
    registry = FleetRegistry(path)
    registry.add_device("d1")
    registry.record_hello("d1", {"arch": "x86_64"}, ["torch"], 42)
    assert registry.state("d1").num_samples == 42 and registry.state("d1").status == "online"
    assert _on_file(path, "d1")["profile"] is None  # not yet written
    registry.flush()
    row = _on_file(path, "d1")
    assert (row["profile"], row["runtimes"], row["num_samples"], row["status"]) == (
        '{"arch": "x86_64"}', '["torch"]', 42, "online")
    registry.set_status("d1", "offline")
    registry.close()
    assert _on_file(path, "d1")["status"] == "offline"  # close writes what is pending


def test_the_writer_commits_pending_bookkeeping_within_a_fraction_of_a_second(tmp_path):
    path = tmp_path / "registry.sqlite"
    registry = FleetRegistry(path)
    registry.add_device("d1")
    registry.record_hello("d1", {}, ["torch"], 7)
    deadline = time.monotonic() + 5
    while _on_file(path, "d1")["num_samples"] != 7 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _on_file(path, "d1")["num_samples"] == 7
    registry.close()


def test_thousands_of_hellos_are_written_in_a_few_transactions(tmp_path, slow_writer):
    path = tmp_path / "registry.sqlite"
    registry = FleetRegistry(path)
    ids = [f"d{i:04d}" for i in range(2500)]
    registry.add_devices([(d, None) for d in ids])
    statements: list[str] = []
    registry._db.set_trace_callback(statements.append)
    for dev in ids:
        registry.record_hello(dev, {}, ["torch"], 5)
    registry.close()
    assert 1 <= statements.count("COMMIT") <= 3  # BATCH_ROWS = 1000 per early batch, then close
    db = sqlite3.connect(path)
    online = db.execute("SELECT COUNT(*) FROM devices WHERE status='online' AND num_samples=5").fetchone()[0]
    assert online == 2500
    db.close()


def test_the_message_path_runs_no_query(tmp_path, slow_writer, monkeypatch):
    monkeypatch.setattr(registry_module, "KNOWN_REFRESH_S", 3600.0)
    monkeypatch.setattr(registry_module, "BATCH_ROWS", 10**6)  # no batch commit while we trace
    registry = FleetRegistry(tmp_path / "registry.sqlite")
    registry.add_devices([(f"d{i}", "0.5") for i in range(1000)])
    grid = MqttGrid(None, registry)
    statements: list[str] = []
    registry._db.set_trace_callback(statements.append)
    for i in range(1000):
        dev = f"d{i}"
        assert registry.is_known(dev) and registry.tier_of(dev) == "0.5"
        registry.record_hello(dev, {}, ["torch"], 10)
        registry.set_status(dev, "online")
        grid.devices[dev] = DeviceInfo(dev, 10, "0.5")
    assert len(grid.online()) == 1000 and registry.state("d7").num_samples == 10
    assert statements == []
    grid.close()  # flushes
    assert statements.count("COMMIT") == 1
    registry.close()


def test_a_crash_before_flush_loses_only_hello_bookkeeping(tmp_path):
    path = tmp_path / "registry.sqlite"
    script = textwrap.dedent(f"""
        import os
        import server_toolkit.fleet.registry as module
        module.WRITE_INTERVAL_S = 3600.0
        registry = module.FleetRegistry({str(path)!r})
        registry.add_devices([("d1", "0.5"), ("d2", None)])
        registry.record_hello("d1", {{"arch": "arm"}}, ["torch"], 9)
        registry.open_round(1, ["d1"], "")  # writes the hello above first
        registry.record_hello("d2", {{"arch": "arm"}}, ["torch"], 3)  # never written: the crash
        registry.add_update(1, "d1", "t1", "b1", 9, {{}})
        registry.revoke("d2")
        os._exit(0)  # no flush, no close
    """)
    subprocess.run([sys.executable, "-c", script], check=True, env=ENV, timeout=60)
    registry = FleetRegistry(path)
    assert registry.device("d1")["num_samples"] == 9 and registry.device("d1")["status"] == "online"
    assert registry.round_info(1)["selected"] == ["d1"] and registry.count_updates(1) == 1
    d2 = registry.device("d2")
    assert d2["revoked"] == 1 and d2["num_samples"] is None and d2["profile"] is None
    registry.close()


def test_revoke_retier_and_add_from_other_processes_reach_the_running_server(tmp_path):
    run_dir = tmp_path / "run"
    registry = FleetRegistry(run_dir / "registry.sqlite")
    registry.add_devices([("a", "1.0"), ("b", "1.0")])
    grid = MqttGrid(None, registry)
    grid.devices = {dev: DeviceInfo(dev, 10, "1.0") for dev in ("a", "b")}
    assert [d.device_id for d in grid.online()] == ["a", "b"]
    for command in (["revoke", "b"], ["retier", "a", "0.25"], ["add", "c"]):
        subprocess.run([sys.executable, "-m", "server_toolkit.cli", "devices", command[0], "--run-dir",
                        str(run_dir), *command[1:]], check=True, env=ENV, capture_output=True, timeout=120)
    changed = time.monotonic()
    while grid.online() != [DeviceInfo("a", 10, "0.25")] and time.monotonic() - changed < 10:
        time.sleep(0.05)
    assert grid.online() == [DeviceInfo("a", 10, "0.25")]
    assert time.monotonic() - changed <= registry_module.KNOWN_REFRESH_S + 0.5
    assert registry.is_known("c") and not registry.is_known("b") and registry.state("b").status == "revoked"
    registry.record_hello("b", {}, ["torch"], 1)  # a late hello does not un-revoke it
    grid.close()
    registry.close()
    again = FleetRegistry(run_dir / "registry.sqlite")
    assert again.device("b")["status"] == "revoked" and again.device("a")["tier"] == "0.25"
    again.close()
