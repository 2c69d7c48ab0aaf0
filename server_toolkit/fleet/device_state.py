"""The registry's in-memory view of one device, and the background thread that writes the
server's bookkeeping of it (hellos, statuses) to SQLite in batches.

The server reads these states on its message path without any query; ``FleetRegistry``
keeps them in step with the ``devices`` table (see its docstring for what is durable when).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

# The columns a DeviceState is read from, in this order.
STATE_COLUMNS = "device_id, tier, revoked, status, last_seen, num_samples, profile, runtimes, rev"
# How the writer stores the bookkeeping of one device (revoked devices keep their row as is).
BOOKKEEPING_SQL = ("UPDATE devices SET profile=?, runtimes=?, num_samples=?, last_seen=?, status=? "
                   "WHERE device_id=? AND revoked=0")


@dataclass
class DeviceState:
    """What the server's message path needs of one registered device. ``last_seen``: unix
    seconds of its last hello or status change (None: never seen)."""

    tier: str | None
    revoked: bool = False
    status: str = "registered"
    last_seen: float | None = None
    num_samples: int | None = None
    profile: dict | None = None
    runtimes: list[str] | None = None

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> DeviceState:
        """A state from a row selected with ``STATE_COLUMNS``."""
        return cls(row["tier"], bool(row["revoked"]), row["status"] or "registered", row["last_seen"],
                   row["num_samples"], json.loads(row["profile"]) if row["profile"] else None,
                   json.loads(row["runtimes"]) if row["runtimes"] else None)

    def bookkeeping_row(self, device_id: str) -> tuple:
        """The parameters of ``BOOKKEEPING_SQL`` for this device."""
        return (json.dumps(self.profile) if self.profile is not None else None,
                json.dumps(self.runtimes) if self.runtimes is not None else None,
                self.num_samples, self.last_seen, self.status, device_id)


# A bookkeeping row SQLite refuses for its values (e.g. an integer beyond 64 bits): not the file's fault.
DATA_ERRORS = (OverflowError, ValueError, TypeError, sqlite3.InterfaceError, sqlite3.IntegrityError,
               sqlite3.DataError)


def write_one_by_one(db: sqlite3.Connection, rows: dict[str, tuple], reported: set[str]) -> set[str]:
    """After a batch of bookkeeping ``rows`` (device id -> ``BOOKKEEPING_SQL`` parameters) failed:
    write them one at a time (``db`` in autocommit). A row SQLite cannot hold is dropped and
    reported once per device (the device's next hello or status writes it again); rows that
    fail for another reason (the file locked or full) are returned, to be retried, and the
    reason reported once. ``reported``: the failures already logged (updated)."""
    retry: set[str] = set()
    for device_id, row in rows.items():
        try:
            db.execute(BOOKKEEPING_SQL, row)
        except DATA_ERRORS as exc:
            if f"row:{device_id}" not in reported:
                reported.add(f"row:{device_id}")
                log.error("device %s: its bookkeeping cannot be stored (%s: %s); dropped, the run goes on",
                          device_id, type(exc).__name__, exc)
        except sqlite3.Error as exc:
            retry.add(device_id)
            if f"db:{exc}" not in reported:
                reported.add(f"db:{exc}")
                log.error("device bookkeeping not written (%s); retried in the background", exc)
    return retry


class WriteBehind:
    """Calls ``flush`` on its own thread every ``interval_s`` seconds (started by the first
    ``nudge``), at once when nudged with ``now=True``, and stops on ``stop``."""

    def __init__(self, flush: Callable[[], None], interval_s: float = 0.1) -> None:
        self._flush = flush
        self._interval_s = interval_s
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def nudge(self, now: bool = False) -> None:
        """Something waits to be written: start the thread if needed; ``now``: write soon."""
        if self._thread is None:
            with self._start_lock:
                if self._thread is None and not self._stopping:
                    self._thread = threading.Thread(target=self._run, name="registry-writer", daemon=True)
                    self._thread.start()
        if now:
            self._wake.set()

    def _run(self) -> None:
        while not self._stopping:
            self._wake.wait(self._interval_s)
            self._wake.clear()
            try:
                self._flush()
            except Exception:  # e.g. the file is locked by another process for too long: next time
                log.exception("writing device bookkeeping to the fleet registry failed; will retry")

    def stop(self) -> None:
        """End the thread (the caller flushes what is left)."""
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
