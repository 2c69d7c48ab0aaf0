"""Unit tests of the fleet registry (server_toolkit.fleet.registry) on a real SQLite file."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from server_toolkit.fleet.registry import FleetRegistry


@pytest.fixture
def db_path(tmp_path):
    return tmp_path / "state" / "fleet.sqlite"  # parent does not exist yet


@pytest.fixture
def reg(db_path):
    registry = FleetRegistry(db_path)
    yield registry
    registry.close()


def test_creates_parent_directory(db_path, reg):
    assert db_path.is_file()


def test_add_device_is_idempotent(reg):
    assert not reg.is_known("d1")
    assert reg.device("d1") is None
    reg.add_device("d1", name="phone", tier="small")
    reg.add_device("d1", name="renamed", tier="large")  # ignored: already registered
    assert reg.is_known("d1")
    devices = reg.devices()
    assert len(devices) == 1
    d = devices[0]
    assert (d["device_id"], d["name"], d["tier"], d["status"], d["revoked"]) == ("d1", "phone", "small",
                                                                                   "registered", 0)
    assert d["profile"] is None and d["runtimes"] is None


def test_name_defaults_to_id_and_devices_sorted(reg):
    for dev in ("zeta", "alpha", "mid"):
        reg.add_device(dev)
    assert [d["device_id"] for d in reg.devices()] == ["alpha", "mid", "zeta"]
    assert reg.device("alpha")["name"] == "alpha"
    assert reg.device("alpha")["tier"] is None


def test_record_hello_and_status(reg):
    reg.add_device("d1")
    reg.record_hello("d1", {"ram_mb": 256, "cpu": {"cores": 4}}, ["torch"], 321)
    d = reg.device("d1")
    assert d["profile"] == {"ram_mb": 256, "cpu": {"cores": 4}}
    assert d["runtimes"] == ["torch"]
    assert d["num_samples"] == 321
    assert d["status"] == "online" and d["last_seen"] > 0
    reg.set_status("d1", "offline")
    assert reg.device("d1")["status"] == "offline"


def test_record_hello_of_unknown_device_registers_nothing(reg):
    reg.record_hello("ghost", {}, [], 1)
    assert reg.device("ghost") is None
    assert not reg.is_known("ghost")


def test_rounds(reg):
    assert reg.round_info(1) is None
    reg.open_round(1, ["d1", "d2"], "g" * 64)
    info = reg.round_info(1)
    assert info["round"] == 1 and info["status"] == "open"
    assert info["selected"] == ["d1", "d2"]
    assert info["global_blob"] == "g" * 64
    assert info["metrics"] is None and info["closed_at"] is None
    reg.close_round(1, {"accuracy": 0.9, "updates": 2})
    info = reg.round_info(1)
    assert info["status"] == "closed"
    assert info["metrics"] == {"accuracy": 0.9, "updates": 2}
    assert info["closed_at"] >= info["started_at"]
    assert reg.round_info(2) is None


def test_updates(reg):
    reg.add_update(1, "d1", "t1", "b1", 10, {"loss": 0.5})
    reg.add_update(1, "d2", "t2", "b2", 30, {"loss": 0.25, "accuracy": 1.0})
    reg.add_update(2, "d1", "t3", "b3", 12, {})
    ups = reg.updates(1)
    assert [u["task_id"] for u in ups] == ["t1", "t2"]  # in arrival order
    assert ups[0]["device_id"] == "d1" and ups[0]["blob_id"] == "b1" and ups[0]["num_samples"] == 10
    assert ups[1]["metrics"] == {"loss": 0.25, "accuracy": 1.0}
    assert reg.updates(2)[0]["metrics"] == {}
    assert reg.updates(3) == []
    assert reg.count_updates(1) == 2
    assert reg.count_updates(2) == 1
    assert reg.count_updates(3) == 0
    assert reg.count_updates() == 3


def test_duplicate_task_id_raises_and_keeps_the_first(reg):
    reg.add_update(1, "d1", "t1", "b1", 10, {})
    with pytest.raises(sqlite3.IntegrityError):
        reg.add_update(1, "d1", "t1", "other", 99, {})
    with pytest.raises(sqlite3.IntegrityError):
        reg.add_update(2, "d2", "t1", "b2", 5, {})  # unique across rounds too
    assert reg.count_updates() == 1
    assert reg.updates(1)[0]["blob_id"] == "b1"


def test_rejections(reg):
    reg.add_rejection(1, "d1", "t1", "shape_mismatch", "w: bad")
    reg.add_rejection(None, "d2", None, "unknown_device", "x" * 5000)
    reg.add_rejection(2, "d1", "t9", "non_finite", "nan")
    all_rej = reg.rejections()
    assert [r["code"] for r in all_rej] == ["shape_mismatch", "unknown_device", "non_finite"]
    assert len(all_rej[1]["detail"]) == 1000  # truncated
    assert all_rej[1]["round"] is None and all_rej[1]["task_id"] is None
    r1 = reg.rejections(1)
    assert len(r1) == 1 and r1[0]["device_id"] == "d1" and r1[0]["task_id"] == "t1"
    assert reg.rejections(5) == []


def test_data_persists_after_reopen(db_path):
    reg = FleetRegistry(db_path)
    reg.add_device("d1", tier="small")
    reg.record_hello("d1", {"a": 1}, ["torch"], 5)
    reg.open_round(1, ["d1"], "blob")
    reg.add_update(1, "d1", "t1", "b1", 5, {"loss": 1.0})
    reg.close_round(1, {"ok": True})
    reg.add_rejection(1, "d1", "t0", "late", "too late")
    reg.close()

    again = FleetRegistry(db_path)
    try:
        assert again.is_known("d1")  # the in-memory cache is rebuilt from the file
        assert again.device("d1")["profile"] == {"a": 1}
        assert again.round_info(1)["status"] == "closed"
        assert again.round_info(1)["metrics"] == {"ok": True}
        assert again.count_updates() == 1 and again.updates(1)[0]["metrics"] == {"loss": 1.0}
        assert again.rejections()[0]["code"] == "late"
        with pytest.raises(sqlite3.IntegrityError):
            again.add_update(1, "d1", "t1", "b1", 5, {})
    finally:
        again.close()


def test_in_memory_registry():
    reg = FleetRegistry(":memory:")
    reg.add_device("d")
    assert reg.is_known("d")
    reg.close()


def test_concurrent_writes_from_threads(reg):
    def worker(k: int) -> None:
        for i in range(20):
            reg.add_update(1, f"d{k}", f"t{k}-{i}", "b", 1, {})

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert reg.count_updates(1) == 80



def test_the_replay_check_and_a_rounds_updates_are_looked_up_by_index_not_by_scanning_the_run(db_path):
    db_path.parent.mkdir(parents=True)
    with sqlite3.connect(db_path) as old:  # a registry made before the indexes existed
        old.execute("CREATE TABLE updates (id INTEGER PRIMARY KEY AUTOINCREMENT, round INTEGER, "
                    "device_id TEXT, task_id TEXT UNIQUE, blob_id TEXT, num_samples INTEGER, metrics TEXT, "
                    "received_at REAL)")
    reg = FleetRegistry(db_path)  # opening it adds them
    try:
        for sql, args in [("SELECT task_id FROM updates WHERE device_id=? AND blob_id=? AND task_id<>?",
                           ("d", "b", "t")), ("SELECT * FROM updates WHERE round=? ORDER BY id", (1,))]:
            plan = [row[-1] for row in reg._db.execute(f"EXPLAIN QUERY PLAN {sql}", args)]
            assert plan and plan[0].startswith("SEARCH updates USING INDEX"), plan
        reg.add_update(1, "d1", "t1", "b" * 64, 5, {})
        reg.add_update(2, "d1", "t2", "b" * 64, 5, {})
        assert reg.replayed("d1", "b" * 64, "t2") == "t1"  # (no task records: a replay)
        assert reg.replayed("d1", "c" * 64, "t3") is None
    finally:
        reg.close()
