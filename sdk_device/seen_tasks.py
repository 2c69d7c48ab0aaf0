"""The task ids a device process has taken, so a task sent again is not run twice.

A server sends a device's open task again when the device may have missed it (after a broker
restart, a reconnect, a new hello: docs/protocol.md §10.1). The copy has the same ``task_id``;
a device that already took the task ignores it (its result, if one waits for an answer, is
offered again on reconnects anyway: ``announce.py``). Decision: remembered in memory only,
the last ``MAX_SEEN`` ids: a restarted process has lost the task, so it must run the copy.
"""

from __future__ import annotations

MAX_SEEN = 256


class SeenTasks:
    """A bounded, insertion-ordered set of task ids."""

    def __init__(self, limit: int = MAX_SEEN) -> None:
        self.limit = limit
        self._ids: dict[str, None] = {}

    def first_time(self, task_id: str) -> bool:
        """True (and remember it) the first time ``task_id`` is seen; False for a copy."""
        if task_id in self._ids:
            return False
        self._ids[task_id] = None
        while len(self._ids) > self.limit:
            self._ids.pop(next(iter(self._ids)))
        return True
