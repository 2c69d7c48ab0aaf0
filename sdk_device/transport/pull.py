"""Pulling one blob from its holder, chunk by chunk, and naming the chunks that are bad
(docs/protocol.md §7.3). Used by ``Endpoint.fetch``.

Each frame is checked on arrival against the sha256 it declares: a frame that is not what it
says (damaged on the way) is dropped and its chunk asked for again at once (the third damaged
copy of one chunk ends the pull with ``checksum_mismatch``). A frame can also be
*forged*: self-consistent bytes published on the holder's chunk topic by someone else. Only
the whole blob's sha256 (its id) shows that, and the receiver cannot tell from one copy which
chunk lied; but the holder answers every request too, so a forged chunk arrives beside the
holder's copy with another digest. Such an index is *contested*. When the whole blob fails its
id, the contested chunks are fetched again (the pull resumes; the other chunks are kept); when
none was seen contested (the forged copy was the only one to arrive), every chunk is fetched
once more from the holder (a second opinion), after which the copies that differ are
contested. Decision: no new field on the wire, so every existing holder (the C++ client too)
works unchanged; a forger must win the race on every attempt to make a pull fail.
"""

from __future__ import annotations

import logging
import queue
import time
from collections import deque
from collections.abc import Callable

from ..protocol import messages as msgs
from ..protocol.blobs import Chunk
from ..protocol.errors import ProtocolError
from .blob_store import PartialBlob

log = logging.getLogger(__name__)

ATTEMPTS = 3  # passes over a blob before it fails with checksum_mismatch
GRACE_S = 0.5  # after a failed whole-blob check: how long late copies of chunks are awaited


class BlobPull:
    """One pull of ``ref`` from ``peer`` into ``part``; ``request(indices)`` sends a
    ``blob_request``; frames (and the holder's refusal, as a ProtocolError) arrive on
    ``arrivals``. ``contested``/``damaged``/``refetched``: chunk counts over this pull, for the
    endpoint's tallies."""

    def __init__(self, peer: str, ref: msgs.BlobRef, part: PartialBlob,
                 arrivals: queue.Queue[Chunk | ProtocolError], request: Callable[[list[int]], None],
                 window: int) -> None:
        self.peer, self.ref, self.part, self.arrivals = peer, ref, part, arrivals
        self.request, self.window = request, window
        self.suspect: set[int] = set()  # indices of which two different copies arrived
        self.contested = 0
        self.refetched = 0  # chunks fetched again after the whole blob failed its id
        self._damaged_at: dict[int, int] = {}  # index -> damaged copies taken for it
        self.damaged = 0
        self.bytes_received = 0

    def run(self, deadline: float, idle_s: float) -> bool:
        """Pull until the blob matches its id (True) or ``ATTEMPTS`` passes failed (False).
        Raises TimeoutError or the holder's ProtocolError."""
        for attempt in range(ATTEMPTS):
            self._pass(deadline, idle_s)
            if self.part.verified():
                return True
            self._drain(min(GRACE_S, max(0.0, deadline - time.monotonic())))
            again = sorted(self.suspect) or (list(range(self.part.count)) if attempt == 0 else [])
            log.warning("blob %s from %s fails its sha256; fetching %s chunk(s) again (%s)", self.ref.id[:12],
                        self.peer, len(again), "contested" if self.suspect else "second opinion")
            if not again:
                return False
            self.suspect.clear()
            self.refetched += len(again)
            self.part.forget(again)
        return False

    def _pass(self, deadline: float, idle_s: float) -> None:
        """Request and receive every missing chunk into ``part``."""
        missing = deque(self.part.missing())
        outstanding: set[int] = set()
        idle_rounds = 0
        while missing or outstanding:
            if missing and len(outstanding) <= self.window // 2:
                batch = [missing.popleft() for _ in range(min(len(missing), self.window - len(outstanding)))]
                outstanding.update(batch)
                self.request(batch)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"blob {self.ref.id[:12]} from {self.peer}: deadline passed")
            try:
                chunk = self.arrivals.get(timeout=min(idle_s, remaining))
            except queue.Empty:
                idle_rounds += 1
                if idle_rounds > 4:
                    raise TimeoutError(f"blob {self.ref.id[:12]} from {self.peer}: no chunk for "
                                       f"{idle_rounds * idle_s:.0f} s") from None
                log.info("blob %s from %s stalled; asking again for %d chunks", self.ref.id[:12], self.peer,
                         len(outstanding))
                missing.extendleft(sorted(outstanding, reverse=True))
                outstanding.clear()
                continue
            if isinstance(chunk, ProtocolError):
                raise chunk
            idle_rounds = 0
            if self._take(chunk, outstanding):
                outstanding.discard(chunk.index)

    def _take(self, chunk: Chunk, outstanding: set[int]) -> bool:
        """Write ``chunk`` if it is one we wait for and is what it declares; True when written."""
        if chunk.size != self.ref.size or chunk.chunk_bytes != self.part.chunk_bytes:
            return False  # not what we asked for
        if chunk.index not in outstanding:
            self._compare(chunk)  # a second copy: the holder's, or a forger's
            return False
        if not chunk.intact:  # damaged on the way: ask for it again now, ATTEMPTS times per chunk
            self.damaged += 1
            self._damaged_at[chunk.index] = self._damaged_at.get(chunk.index, 0) + 1
            if self._damaged_at[chunk.index] >= ATTEMPTS:
                raise ProtocolError("checksum_mismatch", f"chunk {chunk.index} of blob {self.ref.id[:12]} "
                                    f"from {self.peer} came damaged {ATTEMPTS} times")
            log.warning("chunk %d of blob %s from %s is not what it declares; asking again", chunk.index,
                        self.ref.id[:12], self.peer)
            self.request([chunk.index])
            return False
        self.part.write(chunk.index, chunk.data, chunk.sha256)
        self.bytes_received += len(chunk.data)
        return True

    def _compare(self, chunk: Chunk) -> None:
        """A copy of a chunk already written: another digest makes the index contested."""
        have = self.part.have.get(chunk.index)
        if have is not None and have != chunk.sha256 and chunk.intact and chunk.index not in self.suspect:
            self.suspect.add(chunk.index)
            self.contested += 1
            log.warning("chunk %d of blob %s from %s arrived twice with different bytes (one is forged)",
                        chunk.index, self.ref.id[:12], self.peer)

    def _drain(self, grace_s: float) -> None:
        """Take late copies of chunks for ``grace_s`` (to find contested ones)."""
        end = time.monotonic() + grace_s
        while (left := end - time.monotonic()) > 0:
            try:
                chunk = self.arrivals.get(timeout=left)
            except queue.Empty:
                return
            if isinstance(chunk, ProtocolError):
                raise chunk
            if chunk.size == self.ref.size and chunk.chunk_bytes == self.part.chunk_bytes:
                self._compare(chunk)
