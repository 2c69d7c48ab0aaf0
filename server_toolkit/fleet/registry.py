"""The fleet registry (SQLite): devices, rounds, tasks sent, accepted updates, rejections,
pairing codes.

Never holds device data; accepted update weights live in the server's blob store and are
referenced here by blob id. Every write commits before returning, so an update recorded
here survives a server crash (the MQTT grid acknowledges only after that).

Several processes share one registry file (``fedsdk-server run`` and the ``pair-code`` /
``devices`` commands): pairing codes are stored hashed (``fleet/pair_codes.py``), and a
revocation written by another process reaches ``is_known`` within ``KNOWN_REFRESH_S``.
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
CREATE TABLE IF NOT EXISTS tasks (
    task_id TEXT PRIMARY KEY, round INTEGER, device_id TEXT, record TEXT, sent_at REAL);
CREATE TABLE IF NOT EXISTS rejections (
    id INTEGER PRIMARY KEY AUTOINCREMENT, round INTEGER, device_id TEXT, task_id TEXT,
    code TEXT, detail TEXT, at REAL);
CREATE TABLE IF NOT EXISTS pair_codes (
    id INTEGER PRIMARY KEY AUTOINCREMENT, code_hash TEXT, tier TEXT, created_at REAL,
    expires_at REAL, used_at REAL, used_by TEXT, session_hash TEXT, session_expires REAL,
    device_id TEXT);
CREATE TABLE IF NOT EXISTS pair_failures (
    id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL, client_id TEXT, detail TEXT);
"""
# Columns added after the first release; old registries gain them on open.
DEVICE_COLUMNS = {"pair_profile": "TEXT", "tier_reason": "TEXT", "password_hash": "TEXT",
                  "paired_at": "REAL", "revoked_at": "REAL"}
KNOWN_REFRESH_S = 2.0  # how stale ``is_known`` may be about other processes' writes


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
            have = {r["name"] for r in self._db.execute("PRAGMA table_info(devices)")}
            for column, kind in DEVICE_COLUMNS.items():
                if column not in have:
                    self._db.execute(f"ALTER TABLE devices ADD COLUMN {column} {kind}")
        self._known: set[str] = set()
        self._known_at = 0.0
        self._refresh_known()

    def _refresh_known(self) -> None:
        self._known = {r["device_id"] for r in self._query("SELECT device_id FROM devices WHERE revoked=0")}
        self._known_at = time.monotonic()

    def _query(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def _write(self, sql: str, args: tuple = ()) -> int:
        with self._lock:
            cur = self._db.execute(sql, args)
            return cur.lastrowid or 0

    def _write_count(self, sql: str, args: tuple = ()) -> int:
        """Run an UPDATE; returns how many rows it changed."""
        with self._lock:
            return self._db.execute(sql, args).rowcount

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
        self._refresh_known()  # a revoked id stays revoked

    def is_known(self, device_id: str) -> bool:
        """True for a registered, non-revoked device. Cheap (safe on the network thread): the
        set is re-read from the file at most every KNOWN_REFRESH_S seconds, so devices paired
        or revoked by another process count soon."""
        if time.monotonic() - self._known_at > KNOWN_REFRESH_S:
            self._refresh_known()
        return device_id in self._known

    def register_paired(self, device_id: str, name: str, tier: str | None, pair_profile: dict,
                        tier_reason: dict, password_hash: str) -> None:
        """Register a device that just paired (its id must be new)."""
        self._write(
            "INSERT INTO devices (device_id, name, tier, registered_at, paired_at, pair_profile, "
            "tier_reason, password_hash, status) VALUES (?,?,?,?,?,?,?,?, 'paired')",
            (device_id, name, tier, time.time(), time.time(), json.dumps(pair_profile),
             json.dumps(tier_reason), password_hash),
        )
        self._known.add(device_id)

    def revoke(self, device_id: str) -> bool:
        """Mark a device revoked (it may no longer take part); False if it is unknown."""
        changed = self._write_count(
            "UPDATE devices SET revoked=1, status='revoked', revoked_at=? WHERE device_id=?",
            (time.time(), device_id),
        )
        self._known.discard(device_id)
        return changed > 0

    def set_tier(self, device_id: str, tier: str | None, tier_reason: dict) -> bool:
        """Change a device's tier (used from its next round on); False if it is unknown."""
        return self._write_count(
            "UPDATE devices SET tier=?, tier_reason=? WHERE device_id=?",
            (tier, json.dumps(tier_reason), device_id),
        ) > 0

    def tier_of(self, device_id: str) -> str | None:
        rows = self._query("SELECT tier FROM devices WHERE device_id=?", (device_id,))
        return rows[0]["tier"] if rows else None

    def password_hash(self, device_id: str) -> str | None:
        """The sha256 of the broker password issued at pairing (None: not paired or revoked)."""
        rows = self._query("SELECT password_hash FROM devices WHERE device_id=? AND revoked=0", (device_id,))
        return rows[0]["password_hash"] if rows else None

    def name_taken(self, device_id: str) -> bool:
        return bool(self._query("SELECT 1 FROM devices WHERE device_id=?", (device_id,)))

    def record_hello(self, device_id: str, profile: dict, runtimes: list[str], num_samples: int) -> None:
        self._write(
            "UPDATE devices SET profile=?, runtimes=?, num_samples=?, last_seen=?, status='online' "
            "WHERE device_id=? AND revoked=0",
            (json.dumps(profile), json.dumps(runtimes), num_samples, time.time(), device_id),
        )

    def set_status(self, device_id: str, status: str) -> None:
        self._write(
            "UPDATE devices SET status=?, last_seen=? WHERE device_id=? AND revoked=0",
            (status, time.time(), device_id),
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

    # -- tasks (what was sent; see rounds/task_records.py) ------------------------------------
    def add_task(self, task_id: str, rnd: int, device_id: str, record: dict) -> None:
        """Persist what task ``task_id`` asked of ``device_id`` (before it is sent)."""
        self._write("INSERT INTO tasks (task_id, round, device_id, record, sent_at) VALUES (?,?,?,?,?)",
                    (task_id, rnd, device_id, json.dumps(record), time.time()))

    def task(self, task_id: str) -> dict | None:
        """The record stored by ``add_task``, or None."""
        rows = self._query("SELECT record FROM tasks WHERE task_id=?", (task_id,))
        return json.loads(rows[0]["record"]) if rows else None

    def task_round(self, task_id: str, device_id: str) -> int | None:
        """The round of ``device_id``'s task ``task_id``, or None (no such task of that device)."""
        rows = self._query("SELECT round FROM tasks WHERE task_id=? AND device_id=?", (task_id, device_id))
        return rows[0]["round"] if rows else None

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

    def count_device_updates(self, device_id: str) -> int:
        return self._query("SELECT COUNT(*) AS n FROM updates WHERE device_id=?", (device_id,))[0]["n"]

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

    # -- pairing codes (hashes only; see fleet/pair_codes.py) -------------------------------
    def add_pair_code(self, code_hash: str, tier: str | None, expires_at: float) -> int:
        return self._write(
            "INSERT INTO pair_codes (code_hash, tier, created_at, expires_at) VALUES (?,?,?,?)",
            (code_hash, tier, time.time(), expires_at),
        )

    def pair_codes(self, since: float) -> list[dict]:
        """Every code created after ``since`` (unix seconds), newest first."""
        return [dict(r) for r in self._query(
            "SELECT * FROM pair_codes WHERE created_at>=? ORDER BY id DESC", (since,))]

    def claim_pair_code(self, code_id: int, client_id: str, session_hash: str,
                        session_expires: float) -> bool:
        """Mark code ``code_id`` used by ``client_id`` (atomic: False if it was already used)."""
        return self._write_count(
            "UPDATE pair_codes SET used_at=?, used_by=?, session_hash=?, session_expires=? "
            "WHERE id=? AND used_at IS NULL",
            (time.time(), client_id, session_hash, session_expires, code_id),
        ) == 1

    def renew_pair_session(self, code_id: int, session_hash: str, session_expires: float) -> None:
        self._write("UPDATE pair_codes SET session_hash=?, session_expires=? WHERE id=?",
                    (session_hash, session_expires, code_id))

    def finish_pair_code(self, code_id: int, device_id: str) -> None:
        self._write("UPDATE pair_codes SET device_id=?, session_hash=NULL WHERE id=?", (device_id, code_id))

    def forget_pair_codes(self, before: float) -> None:
        self._write("DELETE FROM pair_codes WHERE created_at<?", (before,))
        self._write("DELETE FROM pair_failures WHERE at<?", (before,))

    def add_pair_failure(self, client_id: str, detail: str) -> None:
        self._write("INSERT INTO pair_failures (at, client_id, detail) VALUES (?,?,?)",
                    (time.time(), client_id, detail[:500]))

    def pair_failures(self, since: float) -> list[float]:
        """Times (unix seconds) of wrong pairing codes after ``since``, newest first."""
        return [r["at"] for r in self._query(
            "SELECT at FROM pair_failures WHERE at>=? ORDER BY at DESC", (since,))]


def _device_row(row: sqlite3.Row) -> dict:
    d = dict(row)
    d.pop("password_hash", None)  # never leaves the registry
    for key in ("profile", "runtimes", "pair_profile", "tier_reason"):
        d[key] = json.loads(d[key]) if d.get(key) else None
    return d
