"""A fleet's members live in a file of their own (server_toolkit/fleet/fleet_store.py):
a second run of the fleet knows the devices paired before, a run's rounds stay with the run,
and an old run directory's devices move into the fleet once."""

from __future__ import annotations

import sqlite3

from server_toolkit.fleet.fleet_store import MOVED_TABLE, fleet_file
from server_toolkit.fleet.registry import FleetRegistry
from server_toolkit.fleet.registry_schema import SCHEMA


def _tables(path) -> set[str]:
    db = sqlite3.connect(path)
    try:
        return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    finally:
        db.close()


def test_a_second_run_of_the_fleet_knows_its_paired_devices_and_not_the_first_runs_rounds(tmp_path):
    fleet = tmp_path / "broker" / "fleet.sqlite"
    first = FleetRegistry(tmp_path / "run1" / "registry.sqlite", fleet)
    first.register_paired("dev1", "dev1", "0.5", {"arch": "arm64"}, {"mode": "auto"}, "ab" * 32)
    first.open_round(1, ["dev1"], "")
    first.add_update(1, "dev1", "t1", "blob", 10, {})
    first.close()

    second = FleetRegistry(tmp_path / "run2" / "registry.sqlite", fleet)
    assert second.is_known("dev1") and second.tier_of("dev1") == "0.5"
    assert second.password_hash("dev1") == "ab" * 32
    assert second.round_info(1) is None and second.count_updates() == 0
    second.close()
    assert "devices" not in _tables(tmp_path / "run2" / "registry.sqlite")
    assert "rounds" not in _tables(fleet)


def test_an_old_run_directory_hands_its_devices_to_the_fleet_once(tmp_path):
    old = tmp_path / "old" / "registry.sqlite"
    old.parent.mkdir()
    db = sqlite3.connect(old)  # the layout before fleets had a file: devices in the run's registry
    db.executescript(SCHEMA)
    db.execute("INSERT INTO devices (device_id, name, tier, revoked) VALUES ('a', 'a', '1.0', 0)")
    db.execute("INSERT INTO devices (device_id, name, tier, revoked) VALUES ('gone', 'gone', NULL, 1)")
    db.execute("INSERT INTO rounds (round, status) VALUES (4, 'closed')")
    db.commit()
    db.close()
    fleet = tmp_path / "broker" / "fleet.sqlite"

    registry = FleetRegistry(old, fleet)
    assert registry.is_known("a") and registry.tier_of("a") == "1.0"
    assert not registry.is_known("gone")  # a revocation moves too
    assert registry.round_info(4)["status"] == "closed"  # the run's own rows stay
    registry.revoke("a")
    registry.close()
    assert MOVED_TABLE in _tables(old) and "devices" not in _tables(old)

    again = FleetRegistry(old, fleet)  # opening it again moves nothing back
    assert not again.is_known("a")
    again.close()


def test_without_a_security_directory_the_fleet_stays_in_the_run_directory(tmp_path):
    assert fleet_file(tmp_path / "run", None) == tmp_path / "run" / "registry.sqlite"
    assert fleet_file(tmp_path / "run", tmp_path / "broker") == tmp_path / "broker" / "fleet.sqlite"
    registry = FleetRegistry(tmp_path / "run" / "registry.sqlite")  # simulate, tests: one file
    registry.add_device("x")
    registry.open_round(1, ["x"], "")
    registry.close()
    assert {"devices", "rounds"} <= _tables(tmp_path / "run" / "registry.sqlite")
