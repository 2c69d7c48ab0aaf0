"""Where a fleet keeps what outlives a run, and what a run directory keeps.

A fleet served with a broker security directory (``--security-dir DIR``, one fleet per
directory: ``security init --fleet``) keeps its members there, next to the broker accounts
they log in with:

==========================  ==================================================================
``DIR/fleet.sqlite``        devices (tier, revocation, pairing profile, password hash, last
                            hello), pairing codes (hashed), wrong codes
``DIR/pairing.key``         the key pairing codes are hashed with (0600)
``DIR/fleet.json``          what the last ``run`` of the fleet serves (broker URL, CA, tiers),
                            for ``pair-code`` / ``devices`` given ``--security-dir`` only
==========================  ==================================================================

A run directory keeps the run: ``registry.sqlite`` (rounds, tasks, accepted updates,
rejections), blobs, checkpoints, metrics, and its own ``fleet.json``. So a new ``run`` of the
fleet in a new run directory knows every device paired before, and a device keeps its
credentials. Without a security directory (an embedded or open broker, ``simulate``, tests)
the fleet's tables stay in the run directory's ``registry.sqlite``, as before.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from .registry_schema import DEVICE_COLUMNS, upgrade_devices

FLEET_FILE = "fleet.sqlite"
RUN_FILE = "registry.sqlite"
MOVED_TABLE = "devices_moved_to_fleet"  # an old run directory's devices, once adopted
COPIED = ("device_id, name, tier, profile, runtimes, num_samples, registered_at, last_seen, status, "
          "revoked, " + ", ".join(c for c in DEVICE_COLUMNS if c != "rev"))


def fleet_dir(run_dir: Path | None, security_dir: Path | None) -> Path:
    """The directory holding the fleet's members: the security directory when there is one,
    else the run directory."""
    if security_dir is not None:
        return Path(security_dir)
    if run_dir is None:
        raise ValueError("give the fleet's --security-dir or a --run-dir")
    return Path(run_dir)


def fleet_file(run_dir: Path | None, security_dir: Path | None) -> Path:
    """The SQLite file of the fleet's tables (see the module docstring)."""
    if security_dir is not None:
        return Path(security_dir) / FLEET_FILE
    return fleet_dir(run_dir, None) / RUN_FILE


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether two registry paths name one file (``:memory:`` is never shared with a file)."""
    if str(a) == ":memory:" or str(b) == ":memory:":
        return str(a) == str(b)
    return os.path.abspath(a) == os.path.abspath(b)


def adopt_run_devices(run_db: sqlite3.Connection, fleet_db: sqlite3.Connection) -> int:
    """Move the devices an old run directory registered in its own ``registry.sqlite`` into
    the fleet's file (a device the fleet already has keeps the fleet's row); the run's table is
    renamed ``devices_moved_to_fleet`` so they move once. Returns how many were new."""
    if not run_db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='devices'").fetchone():
        return 0
    upgrade_devices(run_db)
    rows = run_db.execute(f"SELECT {COPIED} FROM devices").fetchall()
    base = fleet_db.execute("SELECT COALESCE(MAX(rev), 0) FROM devices").fetchone()[0]
    marks = ", ".join("?" * (len(COPIED.split(",")) + 1))
    fleet_db.execute("BEGIN IMMEDIATE")
    try:
        before = fleet_db.total_changes
        fleet_db.executemany(f"INSERT OR IGNORE INTO devices ({COPIED}, rev) VALUES ({marks})",
                             [(*row, base + 1 + i) for i, row in enumerate(rows)])
        added = fleet_db.total_changes - before
        fleet_db.execute("COMMIT")
    except BaseException:
        fleet_db.execute("ROLLBACK")
        raise
    if run_db.execute("SELECT 1 FROM sqlite_master WHERE name=?", (MOVED_TABLE,)).fetchone():
        run_db.execute("DROP TABLE devices")  # moved before: these rows are in the fleet now
    else:
        run_db.execute(f"ALTER TABLE devices RENAME TO {MOVED_TABLE}")
    return added
