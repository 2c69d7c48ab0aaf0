"""The fleet's members: which devices belong to it (tier, revocation, pairing profile, the
hash of the broker password issued at pairing), the server's bookkeeping of each (profile,
runtimes, samples, status, last seen) and the pairing codes. A fleet keeps these across runs
(``fleet/fleet_store.py`` says in which file); ``FleetRegistry`` adds a run's rounds, tasks,
updates and rejections on top.

What is durable when:

* committed before the call returns: registering (``add_device``, ``add_devices``,
  ``register_paired``), ``revoke``, ``set_tier``, pairing codes;
* written behind, in one transaction every ``WRITE_INTERVAL_S`` or ``BATCH_ROWS`` devices:
  the server's bookkeeping of devices (``record_hello``, ``set_status``). ``flush``,
  ``close``, ``device``/``devices`` and ``FleetRegistry.open_round`` write it first; a crash
  loses at most the last interval of it, which the devices' next hello or status restores.

Every device's tier, revocation and bookkeeping is also held in memory (``DeviceState``), so
the server's message path (``is_known``, ``tier_of``, ``state``, ``record_hello``,
``set_status``) runs no query. Several processes share one fleet file (``fedsdk-server run``
and the ``pair-code`` / ``devices`` commands): every change of a device's row by those
commands bumps its ``rev``; at most every ``KNOWN_REFRESH_S`` the server checks SQLite's
``data_version`` and, if another process wrote, re-reads the rows with a newer ``rev``.
Pairing codes are stored hashed (``fleet/pair_codes.py``).
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import threading
import time
from pathlib import Path

from sdk_device.protocol.topics import check_name

from .device_state import BOOKKEEPING_SQL, STATE_COLUMNS, DeviceState, WriteBehind, write_one_by_one
from .registry_schema import open_registry

KNOWN_REFRESH_S = 1.0  # how stale the in-memory states may be about other processes' writes
WRITE_INTERVAL_S = 0.1  # the writer commits pending device bookkeeping this often (seconds)
BATCH_ROWS = 1000  # ... or as soon as this many devices have pending bookkeeping
NEXT_REV = "(SELECT COALESCE(MAX(rev), 0) + 1 FROM devices)"


class FleetMembers:
    """Thread-safe access to the fleet's tables in the file ``fleet_path`` (``:memory:`` for
    tests). ``db``/``lock``: a connection (and its lock) to share, when the fleet's tables are
    in the same file as a run's (``FleetRegistry``)."""

    def __init__(self, fleet_path: str | Path, db: sqlite3.Connection | None = None,
                 lock: threading.Lock | None = None) -> None:
        self.fleet_path = fleet_path
        self._fleet_db = db if db is not None else open_registry(fleet_path, run=False)
        self._fleet_lock = lock or threading.Lock()  # the connection; taken before _state_lock
        self._state_lock = threading.Lock()  # _states and _dirty
        with self._fleet_lock:
            self._data_version = self._fleet_db.execute("PRAGMA data_version").fetchone()[0]
            rows = self._fleet_db.execute(f"SELECT {STATE_COLUMNS} FROM devices").fetchall()
        self._states: dict[str, DeviceState] = {r["device_id"]: DeviceState.from_row(r) for r in rows}
        self._rev = max((r["rev"] or 0 for r in rows), default=0)  # newest rev read
        self._polled_at = time.monotonic()
        self._dirty: set[str] = set()  # devices whose bookkeeping is not written yet
        self._reported: set[str] = set()  # write failures already logged (each once)
        self._writer = WriteBehind(self.flush, WRITE_INTERVAL_S)
        self._closed = False

    def _fleet_query(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        with self._fleet_lock:
            return self._fleet_db.execute(sql, args).fetchall()

    def _fleet_write(self, sql: str, args: tuple = ()) -> int:
        with self._fleet_lock:
            return self._fleet_db.execute(sql, args).lastrowid or 0

    def _fleet_count(self, sql: str, args: tuple = ()) -> int:
        """Run an UPDATE; returns how many rows it changed."""
        with self._fleet_lock:
            return self._fleet_db.execute(sql, args).rowcount

    def flush(self) -> None:
        """Commit every pending device bookkeeping row now (one transaction). Never raises for a
        row SQLite cannot hold (dropped, reported once) or a file it cannot write now (the rows
        stay pending, reported once): no background write may end the server
        (``device_state.write_one_by_one``)."""
        with self._fleet_lock:
            with self._state_lock:
                ids, self._dirty = self._dirty, set()
                rows = {d: self._states[d].bookkeeping_row(d) for d in ids if d in self._states}
            if not rows:
                return
            try:
                self._fleet_db.execute("BEGIN")
                self._fleet_db.executemany(BOOKKEEPING_SQL, list(rows.values()))
                self._fleet_db.execute("COMMIT")
            except (sqlite3.Error, OverflowError, ValueError, TypeError):
                if self._fleet_db.in_transaction:
                    self._fleet_db.execute("ROLLBACK")
                retry = write_one_by_one(self._fleet_db, rows, self._reported)
                with self._state_lock:
                    self._dirty |= retry
            except BaseException:
                if self._fleet_db.in_transaction:
                    self._fleet_db.execute("ROLLBACK")
                with self._state_lock:
                    self._dirty |= ids
                raise

    def close(self) -> None:
        """Write what is pending and close the file (idempotent)."""
        if self._closed:
            return
        self._writer.stop()
        self.flush()
        self._closed = True
        with self._fleet_lock:
            self._fleet_db.close()

    # -- the in-memory device states ---------------------------------------------------------
    def _refresh(self) -> None:
        """Re-read the devices other processes changed, at most every KNOWN_REFRESH_S."""
        if self._closed or time.monotonic() - self._polled_at < KNOWN_REFRESH_S:
            return  # (closed: the states stay as they were; a dashboard may still read them)
        with self._fleet_lock:
            self._polled_at = time.monotonic()
            version = self._fleet_db.execute("PRAGMA data_version").fetchone()[0]
            if version == self._data_version:
                return
            self._data_version = version
            rows = self._fleet_db.execute(f"SELECT {STATE_COLUMNS} FROM devices WHERE rev > ?",
                                          (self._rev,)).fetchall()
            with self._state_lock:
                for row in rows:
                    self._rev = max(self._rev, row["rev"] or 0)
                    state = self._states.get(row["device_id"])
                    if state is None:
                        self._states[row["device_id"]] = DeviceState.from_row(row)
                        continue
                    state.tier, state.revoked = row["tier"], bool(row["revoked"])  # ours: bookkeeping
                    if state.revoked:
                        state.status = "revoked"

    def _set_state(self, device_id: str, **fields) -> None:
        """Change a device's in-memory state (a device not held yet gets a fresh one)."""
        with self._state_lock:
            state = self._states.setdefault(device_id, DeviceState(fields.get("tier")))
            for key, value in fields.items():
                setattr(state, key, value)

    def state(self, device_id: str) -> DeviceState | None:
        """A copy of the in-memory state of ``device_id`` (None: not registered). No query."""
        self._refresh()
        with self._state_lock:
            state = self._states.get(device_id)
            return dataclasses.replace(state) if state is not None else None

    def states(self) -> dict[str, DeviceState]:
        """A copy of every device's in-memory state, by id (no query; e.g. for a dashboard)."""
        self._refresh()
        with self._state_lock:
            return {d: dataclasses.replace(s) for d, s in sorted(self._states.items())}

    def _record(self, device_id: str, **fields) -> None:
        """Change the bookkeeping of a registered, non-revoked device; written behind."""
        with self._state_lock:
            state = self._states.get(device_id)
            if state is None or state.revoked:
                return
            for key, value in fields.items():
                setattr(state, key, value)
            self._dirty.add(device_id)
            many = len(self._dirty) >= BATCH_ROWS
        self._writer.nudge(now=many)

    # -- devices ---------------------------------------------------------------------------
    def add_device(self, device_id: str, name: str | None = None, tier: str | None = None) -> None:
        """Register a device (idempotent; a revoked id stays revoked); only registered devices
        may take part."""
        added = self._fleet_count(
            "INSERT OR IGNORE INTO devices (device_id, name, tier, registered_at, rev) "
            f"VALUES (?,?,?,?,{NEXT_REV})",
            (device_id, name or device_id, tier, time.time()),
        )
        if added:
            self._set_state(device_id, tier=tier)

    def add_devices(self, entries: list[tuple[str, str | None]]) -> int:
        """Register many new devices in one transaction: ``entries`` = (device id, tier or
        None). All or nothing: raises ValueError (one line) for an invalid id, an id given
        twice or one already registered. Returns how many were added."""
        seen: set[str] = set()
        for device_id, _tier in entries:
            check_name("device id", device_id)
            if device_id in seen:
                raise ValueError(f"device id {device_id!r} is given twice (nothing was registered)")
            seen.add(device_id)
        now = time.time()
        with self._fleet_lock:
            self._fleet_db.execute("BEGIN IMMEDIATE")
            try:
                ids = self._fleet_db.execute("SELECT device_id FROM devices")
                taken = [r[0] for r in ids if r[0] in seen]
                if taken:
                    raise ValueError(f"{len(taken)} device id(s) already registered, e.g. "
                                     f"{sorted(taken)[0]!r} (nothing was registered)")
                base = self._fleet_db.execute("SELECT COALESCE(MAX(rev), 0) FROM devices").fetchone()[0]
                self._fleet_db.executemany(
                    "INSERT INTO devices (device_id, name, tier, registered_at, rev) VALUES (?,?,?,?,?)",
                    [(d, d, tier, now, base + 1 + i) for i, (d, tier) in enumerate(entries)])
                self._fleet_db.execute("COMMIT")
            except BaseException:
                self._fleet_db.execute("ROLLBACK")
                raise
            with self._state_lock:
                for device_id, tier in entries:
                    self._states[device_id] = DeviceState(tier)
        return len(entries)

    def is_known(self, device_id: str) -> bool:
        """True for a registered, non-revoked device. No query (safe on the network thread);
        other processes' pairings and revocations count within KNOWN_REFRESH_S."""
        self._refresh()
        state = self._states.get(device_id)
        return state is not None and not state.revoked

    def register_paired(self, device_id: str, name: str, tier: str | None, pair_profile: dict,
                        tier_reason: dict, password_hash: str) -> None:
        """Register a device that just paired (its id must be new)."""
        self._fleet_write(
            "INSERT INTO devices (device_id, name, tier, registered_at, paired_at, pair_profile, "
            f"tier_reason, password_hash, status, rev) VALUES (?,?,?,?,?,?,?,?, 'paired', {NEXT_REV})",
            (device_id, name, tier, time.time(), time.time(), json.dumps(pair_profile),
             json.dumps(tier_reason), password_hash),
        )
        self._set_state(device_id, tier=tier, status="paired")

    def revoke(self, device_id: str) -> bool:
        """Mark a device revoked (it may no longer take part); False if it is unknown."""
        changed = self._fleet_count(
            f"UPDATE devices SET revoked=1, status='revoked', revoked_at=?, rev={NEXT_REV} WHERE device_id=?",
            (time.time(), device_id),
        )
        if changed:
            self._set_state(device_id, revoked=True, status="revoked")
        return changed > 0

    def set_tier(self, device_id: str, tier: str | None, tier_reason: dict) -> bool:
        """Change a device's tier (used from its next round on); False if it is unknown."""
        changed = self._fleet_count(
            f"UPDATE devices SET tier=?, tier_reason=?, rev={NEXT_REV} WHERE device_id=?",
            (tier, json.dumps(tier_reason), device_id),
        )
        if changed:
            self._set_state(device_id, tier=tier)
        return changed > 0

    def tier_of(self, device_id: str) -> str | None:
        """The registered tier of ``device_id`` (None: none or unknown). No query."""
        self._refresh()
        state = self._states.get(device_id)
        return state.tier if state is not None else None

    def password_hash(self, device_id: str) -> str | None:
        """The sha256 of the broker password issued at pairing (None: not paired or revoked)."""
        rows = self._fleet_query("SELECT password_hash FROM devices WHERE device_id=? AND revoked=0",
                                 (device_id,))
        return rows[0]["password_hash"] if rows else None

    def name_taken(self, device_id: str) -> bool:
        return bool(self._fleet_query("SELECT 1 FROM devices WHERE device_id=?", (device_id,)))

    def record_hello(self, device_id: str, profile: dict, runtimes: list[str], num_samples: int) -> None:
        """Keep what a device said in its hello (written behind; ignored for unknown or revoked ids)."""
        self._record(device_id, profile=profile, runtimes=list(runtimes), num_samples=num_samples,
                     last_seen=time.time(), status="online")

    def set_status(self, device_id: str, status: str) -> None:
        """Keep a device's status (written behind; ignored for unknown or revoked ids)."""
        self._record(device_id, status=status, last_seen=time.time())

    def device(self, device_id: str) -> dict | None:
        self.flush()
        rows = self._fleet_query("SELECT * FROM devices WHERE device_id=?", (device_id,))
        return device_row(rows[0]) if rows else None

    def devices(self) -> list[dict]:
        self.flush()
        return [device_row(r) for r in self._fleet_query("SELECT * FROM devices ORDER BY device_id")]

    # -- pairing codes (hashes only; see fleet/pair_codes.py) -------------------------------
    def add_pair_code(self, code_hash: str, tier: str | None, expires_at: float) -> int:
        return self._fleet_write(
            "INSERT INTO pair_codes (code_hash, tier, created_at, expires_at) VALUES (?,?,?,?)",
            (code_hash, tier, time.time(), expires_at),
        )

    def pair_codes(self, since: float) -> list[dict]:
        """Every code created after ``since`` (unix seconds), newest first."""
        return [dict(r) for r in self._fleet_query(
            "SELECT * FROM pair_codes WHERE created_at>=? ORDER BY id DESC", (since,))]

    def claim_pair_code(self, code_id: int, client_id: str, session_hash: str,
                        session_expires: float) -> bool:
        """Mark code ``code_id`` used by ``client_id`` (atomic: False if it was already used)."""
        return self._fleet_count(
            "UPDATE pair_codes SET used_at=?, used_by=?, session_hash=?, session_expires=? "
            "WHERE id=? AND used_at IS NULL",
            (time.time(), client_id, session_hash, session_expires, code_id),
        ) == 1

    def renew_pair_session(self, code_id: int, session_hash: str, session_expires: float) -> None:
        self._fleet_write("UPDATE pair_codes SET session_hash=?, session_expires=? WHERE id=?",
                          (session_hash, session_expires, code_id))

    def finish_pair_code(self, code_id: int, device_id: str) -> None:
        self._fleet_write("UPDATE pair_codes SET device_id=?, session_hash=NULL WHERE id=?",
                          (device_id, code_id))

    def forget_pair_codes(self, before: float) -> None:
        self._fleet_write("DELETE FROM pair_codes WHERE created_at<?", (before,))
        self._fleet_write("DELETE FROM pair_failures WHERE at<?", (before,))

    def add_pair_failure(self, client_id: str, detail: str) -> None:
        self._fleet_write("INSERT INTO pair_failures (at, client_id, detail) VALUES (?,?,?)",
                          (time.time(), client_id, detail[:500]))

    def pair_failures(self, since: float) -> list[float]:
        """Times (unix seconds) of wrong pairing codes after ``since``, newest first."""
        return [r["at"] for r in self._fleet_query(
            "SELECT at FROM pair_failures WHERE at>=? ORDER BY at DESC", (since,))]


def device_row(row: sqlite3.Row) -> dict:
    """A ``devices`` row as the commands show it (JSON columns decoded, secrets left out)."""
    d = dict(row)
    d.pop("password_hash", None)  # never leaves the registry
    d.pop("rev", None)  # change counter, internal
    for key in ("profile", "runtimes", "pair_profile", "tier_reason"):
        d[key] = json.loads(d[key]) if d.get(key) else None
    return d
