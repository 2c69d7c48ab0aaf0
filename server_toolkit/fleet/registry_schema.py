"""The tables of the fleet registry (``fleet/registry.py``, ``fleet/membership.py``), and
opening its files.

Two groups of tables: the fleet's (``FLEET_SCHEMA``: devices, pairing codes, wrong codes),
which a fleet keeps across runs, and a run's (``RUN_SCHEMA``: rounds, tasks, updates,
rejections). They share one file when the fleet lives in the run directory (no
``--security-dir``, ``simulate``, tests); see ``fleet/fleet_store.py`` for where each goes.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

FLEET_SCHEMA = """
CREATE TABLE IF NOT EXISTS devices (
    device_id TEXT PRIMARY KEY, name TEXT, tier TEXT, profile TEXT, runtimes TEXT,
    num_samples INTEGER, registered_at REAL, last_seen REAL, status TEXT DEFAULT 'registered',
    revoked INTEGER DEFAULT 0);
CREATE TABLE IF NOT EXISTS pair_codes (
    id INTEGER PRIMARY KEY AUTOINCREMENT, code_hash TEXT, tier TEXT, created_at REAL,
    expires_at REAL, used_at REAL, used_by TEXT, session_hash TEXT, session_expires REAL,
    device_id TEXT);
CREATE TABLE IF NOT EXISTS pair_failures (
    id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL, client_id TEXT, detail TEXT);
"""
RUN_SCHEMA = """
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
CREATE INDEX IF NOT EXISTS updates_device_blob ON updates(device_id, blob_id);
CREATE INDEX IF NOT EXISTS updates_round ON updates(round);
"""
# The two indexes (stop 38): ``replayed`` looks up a device's updates by blob for every pulled
# result and ``updates``/``count_updates`` a round's; without them each was a scan of every
# update of the run, so an edge's cost per update grew with the run (issue 31).
SCHEMA = FLEET_SCHEMA + RUN_SCHEMA
# Columns added after the first release; old registries gain them on open.
DEVICE_COLUMNS = {"pair_profile": "TEXT", "tier_reason": "TEXT", "password_hash": "TEXT",
                  "paired_at": "REAL", "revoked_at": "REAL", "rev": "INTEGER DEFAULT 0"}


def open_registry(path: str | Path, fleet: bool = True, run: bool = True) -> sqlite3.Connection:
    """Open (or create) the registry at ``path`` in WAL mode with the fleet's tables
    (``fleet``) and/or a run's (``run``), every column of each. Autocommit connection
    (``isolation_level=None``): transactions are explicit."""
    if str(path) != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
    db.row_factory = sqlite3.Row
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript((FLEET_SCHEMA if fleet else "") + (RUN_SCHEMA if run else ""))
    if fleet:
        upgrade_devices(db)
    return db


def upgrade_devices(db: sqlite3.Connection) -> None:
    """Give an old ``devices`` table the columns added since (and the index on ``rev``)."""
    have = {r["name"] for r in db.execute("PRAGMA table_info(devices)")}
    for column, kind in DEVICE_COLUMNS.items():
        if column not in have:
            db.execute(f"ALTER TABLE devices ADD COLUMN {column} {kind}")
    db.execute("CREATE INDEX IF NOT EXISTS devices_rev ON devices(rev)")
