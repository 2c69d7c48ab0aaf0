"""Pacing a round's tasks: at most ``window`` devices pulling their task's blobs at once.

A device that gets a task pulls its weights (and programs) right away and gives up when no
chunk comes for a while (the reference device: 4 stalls of 5 s). The endpoint serves blob
requests one after another, and sending a task costs far less than serving its blobs, so a
grid that sends 1,000 tasks at once queues 1,000 devices' pulls: the last ones wait for every
pull before theirs, and on a busy machine that is longer than they wait. So the grid sends a
task only while fewer than ``window`` of the round's devices are still *loading*, and handles
traffic (results, refusals, hellos) meanwhile. A device stops loading when the endpoint has
served the last chunk of every array record its task returns, when its task is resolved
(result accepted, refused, device offline), or ``load_timeout_s`` after its task was sent (a
device that had the blobs already, or one that went quiet).

Decision: a fixed window (default 64), not a measured rate: a device waits at most for the
pulls of the 63 devices ahead of it; at the 5 devices a second an edge served on a machine at
load 32 that is 13 s, inside the 25 s a device waits, and at the flat server's 50 a second it
is about 1 s, enough to keep the serving thread busy.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from sdk_device.transport.endpoint import Endpoint

DEFAULT_WINDOW = 64
DEFAULT_LOAD_TIMEOUT_S = 30.0
# A full window is looked at again at most this often: a look costs a lock per loading device,
# and the grid asks after every message it handles, which was 8 % of an edge's CPU (issue 31).
RECHECK_S = 0.01


class TaskPacer:
    """The devices of the open round still pulling their task's blobs (see the module docstring)."""

    def __init__(self, window: int = DEFAULT_WINDOW, load_timeout_s: float = DEFAULT_LOAD_TIMEOUT_S,
                 recheck_s: float = RECHECK_S) -> None:
        if window < 1:
            raise ValueError(f"the task window must be at least 1, got {window}")
        self.window = window
        self.load_timeout_s = load_timeout_s
        self._loading: dict[str, tuple[tuple[str, ...], float]] = {}  # device -> (blob ids, sent at)
        self.recheck_s = recheck_s
        self._checked = -recheck_s  # monotonic s of the last look at who is still loading

    def begin(self) -> None:
        """A new exchange: nobody is loading."""
        self._loading = {}

    def sent(self, device_id: str, blob_ids: Iterable[str]) -> None:
        """``device_id`` was sent a task whose array records ``blob_ids`` it must pull."""
        self._loading[device_id] = (tuple(blob_ids), time.monotonic())

    def has_room(self, endpoint: Endpoint, resolved: set[str]) -> bool:
        """Whether another task may go out (``resolved``: the round's devices done with their task)."""
        if len(self._loading) < self.window:
            return True
        now = time.monotonic()
        if now - self._checked < self.recheck_s:  # the grid asks once per message it handles
            return False
        self._checked = now
        for dev, (blobs, sent_at) in list(self._loading.items()):
            if (dev in resolved or now - sent_at > self.load_timeout_s
                    or all(endpoint.served(dev, blob) for blob in blobs)):
                del self._loading[dev]
        return len(self._loading) < self.window

    def loading(self) -> int:
        """How many devices count as loading (as of the last ``has_room``)."""
        return len(self._loading)
