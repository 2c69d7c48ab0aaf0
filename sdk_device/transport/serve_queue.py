"""The blob requests waiting for an endpoint's serving thread, each at most once.

A peer whose pull waits longer than its idle time asks again for the same chunks
(``Endpoint._pull``, the swarm device). When the first request is still queued, the repeat
would make the holder send every chunk twice, and a holder already behind falls further
behind. So a request equal to one still waiting (same peer, blob, chunk size and indices) is
dropped: serving the first answers both. Once a request is taken for serving, an equal one
is queued again (its chunks may have been lost).
"""

from __future__ import annotations

import queue
import threading

from ..protocol import messages as msgs

Item = tuple[str, msgs.BlobRequest] | None  # (peer, request); None stops the serving thread


class ServeQueue:
    """A FIFO of ``(peer, BlobRequest)`` without duplicates of waiting requests."""

    def __init__(self) -> None:
        self._queue: queue.Queue[Item] = queue.Queue()
        self._waiting: set[tuple] = set()
        self._lock = threading.Lock()
        self.dropped = 0  # repeats dropped so far

    @staticmethod
    def _key(peer: str, request: msgs.BlobRequest) -> tuple:
        return peer, request.blob, request.chunk_bytes, tuple(request.indices)

    def put(self, item: Item) -> None:
        if item is not None:
            key = self._key(*item)
            with self._lock:
                if key in self._waiting:
                    self.dropped += 1
                    return
                self._waiting.add(key)
        self._queue.put(item)

    def get(self) -> Item:
        item = self._queue.get()
        if item is not None:
            with self._lock:
                self._waiting.discard(self._key(*item))
        return item
