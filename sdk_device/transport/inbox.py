"""What an ``Endpoint`` hands its owner: an inbox in which results go first, and the
bookkeeping of traffic from ids that are not in the fleet.

``Inbox`` is a ``queue.Queue`` with two FIFO lanes: ``Result`` messages (a round waits for
them) in ``urgent``, everything else (hellos, heartbeats, statuses, rejections) in ``queue``;
``get`` takes from ``urgent`` first. So a result is handled next even behind thousands of
hellos. Order within each lane is arrival order.

``Strangers`` counts messages from unknown ids and lets one through per id per
``window_s`` (60 s), so that an unknown id costs one log line, one reply and one registry
row a minute, whatever it sends.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque

from ..protocol import messages as msgs

URGENT = (msgs.Result,)  # message types handled before anything else waiting


class Inbox(queue.Queue):
    """A queue whose ``get`` returns urgent items (``URGENT`` messages) first."""

    def _init(self, maxsize: int) -> None:
        self.queue: deque = deque()
        self.urgent: deque = deque()

    def _qsize(self) -> int:
        return len(self.queue) + len(self.urgent)

    def _put(self, item) -> None:
        lane = self.urgent if isinstance(getattr(item, "message", None), URGENT) else self.queue
        lane.append(item)

    def _get(self):
        return self.urgent.popleft() if self.urgent else self.queue.popleft()


class Strangers:
    """Traffic from ids outside the fleet: counted; one message per id per ``window_s``
    seconds is let through (to be logged, answered and recorded). Remembers at most
    ``max_ids`` ids; beyond that, new ids are only counted."""

    def __init__(self, window_s: float = 60.0, max_ids: int = 10_000) -> None:
        self.window_s = window_s
        self.max_ids = max_ids
        self.total = 0  # messages from unknown ids since start
        self._since: dict[str, tuple[float, int]] = {}  # id -> (window start, monotonic s; dropped in it)
        self._lock = threading.Lock()

    def admit(self, peer: str) -> int | None:
        """Count one message from ``peer``. Returns how many of its messages were dropped in
        its previous window when this one should be logged, None when it is dropped."""
        now = time.monotonic()
        with self._lock:
            self.total += 1
            seen = self._since.get(peer)
            if seen is not None and now - seen[0] < self.window_s:
                self._since[peer] = (seen[0], seen[1] + 1)
                return None
            if seen is None and len(self._since) >= self.max_ids:
                self._since = {p: s for p, s in self._since.items() if now - s[0] < self.window_s}
                if len(self._since) >= self.max_ids:
                    return None
            self._since[peer] = (now, 0)
            return seen[1] if seen is not None else 0
