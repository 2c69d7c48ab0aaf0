"""The fleet registry (SQLite): devices, rounds, accepted updates, rejections.

Never holds device data; accepted update weights live in the server's blob store and are
referenced here by blob id. Every write commits before returning, so an update recorded
here survives a server crash (the orchestrator acknowledges only after that).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS devices (
    device_id TEXT PRIMARY KEY, name TEXT, tier TEXT, profile TEXT, runtimes TEXT,
    num_samples INTEGER, registered_at REAL, last_seen REAL, status TEXT DEFAULT 'registered',
    revoked INTEGER DEFAULT 0);
CREATE TABLE IF NOT EXISTS rounds (
    round INTEGER PRIMARY KEY, started_at REAL, closed_at REAL, status TEXT,
    selected TEXT, global_blob TEXT, metrics TEXT);
CREATE TABLE IF NOT EXISTS updates (
    id INTEGER PRIMARY KEY AUTOINCREMENT, round INTEGER, device_id TEXT, task_id TEXT UNIQUE,
    blob_id TEXT, num_samples INTEGER, metrics TEXT, received_at REAL);
CREATE TABLE IF NOT EXISTS rejections (
    id INTEGER PRIMARY KEY AUTOINCREMENT, round INTEGER, device_id TEXT, task_id TEXT,
    code TEXT, detail TEXT, at REAL);
"""


class FleetRegistry:
    """Thread-safe access to the registry database at ``path`` (``:memory:`` for tests)."""

    def __init__(self, path: str | Path) -> None:
        if str(path) != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.executescript(SCHEMA)
        self._known = {r["device_id"] for r in self._query("SELECT device_id FROM devices WHERE revoked=0")}

    def _query(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def _write(self, sql: str, args: tuple = ()) -> int:
        with self._lock:
            cur = self._db.execute(sql, args)
            return cur.lastrowid or 0

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- devices ---------------------------------------------------------------------------
    def add_device(self, device_id: str, name: str | None = None, tier: str | None = None) -> None:
        """Register a device (idempotent); only registered devices may take part."""
        self._write(
            "INSERT OR IGNORE INTO devices (device_id, name, tier, registered_at) VALUES (?,?,?,?)",
            (device_id, name or device_id, tier, time.time()),
        )
        self._known.add(device_id)

    def is_known(self, device_id: str) -> bool:
        """True for a registered, non-revoked device (cheap: safe on the network thread)."""
        return device_id in self._known

    def record_hello(self, device_id: str, profile: dict, runtimes: list[str], num_samples: int) -> None:
        self._write(
            "UPDATE devices SET profile=?, runtimes=?, num_samples=?, last_seen=?, status='online' "
            "WHERE device_id=?",
            (json.dumps(profile), json.dumps(runtimes), num_samples, time.time(), device_id),
        )

    def set_status(self, device_id: str, status: str) -> None:
        self._write(
            "UPDATE devices SET status=?, last_seen=? WHERE device_id=?", (status, time.time(), device_id)
        )

    def device(self, device_id: str) -> dict | None:
        rows = self._query("SELECT * FROM devices WHERE device_id=?", (device_id,))
        return _device_row(rows[0]) if rows else None

    def devices(self) -> list[dict]:
        return [_device_row(r) for r in self._query("SELECT * FROM devices ORDER BY device_id")]

    # -- rounds ----------------------------------------------------------------------------
    def open_round(self, rnd: int, selected: list[str], global_blob: str) -> None:
        self._write(
            "INSERT OR REPLACE INTO rounds (round, started_at, status, selected, global_blob) "
            "VALUES (?,?,?,?,?)",
            (rnd, time.time(), "open", json.dumps(selected), global_blob),
        )

    def close_round(self, rnd: int, metrics: dict) -> None:
        self._write(
            "UPDATE rounds SET closed_at=?, status='closed', metrics=? WHERE round=?",
            (time.time(), json.dumps(metrics), rnd),
        )

    def round_info(self, rnd: int) -> dict | None:
        rows = self._query("SELECT * FROM rounds WHERE round=?", (rnd,))
        if not rows:
            return None
        info = dict(rows[0])
        info["selected"] = json.loads(info["selected"] or "[]")
        info["metrics"] = json.loads(info["metrics"]) if info["metrics"] else None
        return info

    # -- updates and rejections ------------------------------------------------------------
    def add_update(
        self, rnd: int, device_id: str, task_id: str, blob_id: str, num_samples: int, metrics: dict
    ) -> None:
        """Record an accepted update (committed when this returns)."""
        self._write(
            "INSERT INTO updates (round, device_id, task_id, blob_id, num_samples, metrics, "
            "received_at) VALUES (?,?,?,?,?,?,?)",
            (rnd, device_id, task_id, blob_id, num_samples, json.dumps(metrics), time.time()),
        )

    def updates(self, rnd: int) -> list[dict]:
        rows = self._query("SELECT * FROM updates WHERE round=? ORDER BY id", (rnd,))
        return [{**dict(r), "metrics": json.loads(r["metrics"])} for r in rows]

    def count_updates(self, rnd: int | None = None) -> int:
        if rnd is None:
            return self._query("SELECT COUNT(*) AS n FROM updates")[0]["n"]
        return self._query("SELECT COUNT(*) AS n FROM updates WHERE round=?", (rnd,))[0]["n"]

    def add_rejection(
        self, rnd: int | None, device_id: str, task_id: str | None, code: str, detail: str
    ) -> None:
        self._write(
            "INSERT INTO rejections (round, device_id, task_id, code, detail, at) VALUES (?,?,?,?,?,?)",
            (rnd, device_id, task_id, code, detail[:1000], time.time()),
        )

    def rejections(self, rnd: int | None = None) -> list[dict]:
        if rnd is None:
            return [dict(r) for r in self._query("SELECT * FROM rejections ORDER BY id")]
        return [dict(r) for r in self._query("SELECT * FROM rejections WHERE round=? ORDER BY id", (rnd,))]


def _device_row(row: sqlite3.Row) -> dict:
    d = dict(row)
    for key in ("profile", "runtimes"):
        d[key] = json.loads(d[key]) if d[key] else None
    return d
