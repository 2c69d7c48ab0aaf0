"""What an ``Endpoint`` hands its owner: an inbox in which results go first, and the
bookkeeping of traffic from ids that are not in the fleet.

``Inbox`` is a ``queue.Queue`` with two FIFO lanes: ``Result`` messages (a round waits for
them) in ``urgent``, everything else (hellos, heartbeats, statuses, rejections) in ``queue``;
``get`` takes from ``urgent`` first. So a result is handled next even behind thousands of
hellos. Order within each lane is arrival order.

``Strangers`` counts messages from unknown ids and lets one through per id per
``window_s`` (60 s), so that an unknown id costs one log line, one reply and one registry
row a minute, whatever it sends.

``RejectionLimit`` does the same per (peer, code) for rejected messages of *registered* peers
that name nothing of the peer's own (garbage on its topics, which anyone able to publish there
could send: an envelope error, a result for a task it does not have, a chunk frame nobody
pulls): one per (peer, code) a minute is booked (logged, answered with an ``error``, recorded),
the rest are only counted, and a summary line every ``window_s`` says how many and whose.
Measured (bench/fuzz.py at 1,000 messages/s): booking each one cost ~3 ms of the round loop's
thread (a committed registry row), so a flood queued honest traffic behind it.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter, deque
from collections.abc import Hashable

from ..protocol import messages as msgs

log = logging.getLogger(__name__)

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

    def admit(self, peer: Hashable) -> int | None:
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


class RejectionLimit:
    """Rejected messages of registered peers naming nothing of their own: one per (peer, code)
    per ``window_s`` is booked, the rest counted (``dropped``); a warning every ``window_s`` (at
    the next rejection or ``summarize`` call) sums up what was dropped since the last one."""

    def __init__(self, window_s: float = 60.0, max_keys: int = 10_000) -> None:
        self.window_s = window_s
        self.dropped = 0  # rejections only counted, since start
        self._keys = Strangers(window_s, max_keys)
        self._since_summary: Counter[tuple[str, str]] = Counter()  # (peer, code) -> dropped
        self._summary_at = time.monotonic()
        self._lock = threading.Lock()

    def admit(self, peer: str, code: str) -> bool:
        """Count one rejection of ``peer``'s message with ``code``; whether to book it."""
        booked = self._keys.admit((peer, code)) is not None
        if not booked:
            with self._lock:
                self.dropped += 1
                self._since_summary[(peer, code)] += 1
        self.summarize()
        return booked

    def summarize(self) -> None:
        """Log what was dropped since the last summary, if ``window_s`` has passed since it."""
        now = time.monotonic()
        if now - self._summary_at < self.window_s:
            return
        with self._lock:
            dropped, self._since_summary, since = self._since_summary, Counter(), self._summary_at
            self._summary_at = now
        if dropped:
            top = ", ".join(f"{peer} {code} x{n}" for (peer, code), n in dropped.most_common(5))
            more = f" and {len(dropped) - 5} more (device, code) pairs" if len(dropped) > 5 else ""
            log.warning("%d rejected messages of registered devices in the last %.0f s were only counted "
                        "(one per device and code a minute is answered and recorded): %s%s",
                        sum(dropped.values()), now - since, top, more)
