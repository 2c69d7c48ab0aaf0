"""The fleet registry (SQLite, WAL) of one run: a run's rounds, tasks sent, accepted
updates and rejections, on top of the fleet's members (``fleet/membership.py``: devices,
tiers, pairing codes).

Never holds device data; accepted update weights live in the server's blob store and are
referenced here by blob id. Rounds, tasks, accepted updates (the MQTT grid acknowledges an
update only after ``add_update`` returned) and rejections are committed before the call
returns; what is durable when for the devices: ``fleet/membership.py``.

The run's tables live in ``path`` (``<run dir>/registry.sqlite``); the fleet's in
``fleet_path`` when given (a fleet kept across runs: ``fleet/fleet_store.py``), else in the
same file. A run directory written before the fleet had a file of its own keeps its devices
in ``registry.sqlite``: opening it with a ``fleet_path`` moves them there
(``fleet_store.adopt_run_devices``).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path

from .fleet_store import adopt_run_devices, same_file
from .membership import FleetMembers
from .registry_schema import open_registry


class FleetRegistry(FleetMembers):
    """Thread-safe access to the registry database at ``path`` (``:memory:`` for tests) and
    the fleet's tables at ``fleet_path`` (default: ``path`` too)."""

    def __init__(self, path: str | Path, fleet_path: str | Path | None = None) -> None:
        shared = fleet_path is None or same_file(path, fleet_path)
        self.path = path
        self._db = open_registry(path, fleet=shared)
        self._lock = threading.Lock()  # the run's connection; taken before _state_lock, never after
        if shared:
            super().__init__(path, db=self._db, lock=self._lock)
            return
        fleet_db = open_registry(fleet_path, run=False)
        adopt_run_devices(self._db, fleet_db)
        super().__init__(fleet_path, db=fleet_db)

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
        """Write what is pending and close the file(s) (idempotent)."""
        if self._closed:
            return
        super().close()
        if self._db is not self._fleet_db:
            with self._lock:
                self._db.close()

    # -- rounds ----------------------------------------------------------------------------
    def open_round(self, rnd: int, selected: list[str], global_blob: str) -> None:
        self.flush()  # the selected devices' hellos are on file before their round is
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

    def replayed(self, device_id: str, blob_id: str, task_id: str) -> str | None:
        """The task of another accepted update of ``device_id`` with weights ``blob_id``, or None.
        An update byte-identical to an earlier one is a replay, unless the earlier task sent the
        same global weights: training is deterministic, so a round re-run after a restart or a
        rollback to the best model honestly gives the same bytes again."""
        rows = self._query("SELECT task_id FROM updates WHERE device_id=? AND blob_id=? AND task_id<>?",
                           (device_id, blob_id, task_id))
        if not rows:  # the usual case: no task record to read
            return None
        given = _sent_weights(self.task(task_id))
        for row in rows:
            if given is None or _sent_weights(self.task(row["task_id"])) != given:
                return row["task_id"]
        return None

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


def _sent_weights(record: dict | None) -> dict | None:
    """{model name: weights blob id} a stored task record sent, or None (no record)."""
    if record is None:
        return None
    return {name: model.get("weights") for name, model in record.get("models", {}).items()}
