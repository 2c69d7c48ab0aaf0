"""One side of the fedsdk conversation: an MQTT link, a blob store and blob transfer.

The server has one ``Endpoint`` for its whole fleet (peers are device ids); a device has
one whose only peer is ``"server"``. The endpoint

* routes incoming traffic: control messages go to ``inbox`` (already validated; results
  first, see ``inbox.py``), chunk
  frames go to the transfer waiting for them, blob requests go to a serving thread;
* answers a malformed or refused message with an ``Error`` to its sender and logs it; garbage
  on a known peer's topics (one it could not tell from the peer's own) at most once per (peer,
  code) a minute, the rest only counted (``inbox.RejectionLimit``); chunk frames while no
  pull from their peer runs are dropped unread (``stray_chunks``);
* moves blobs by *pull*: the receiver asks for a window of chunks (``BlobRequest``), the
  holder publishes them, the receiver writes each verified chunk to disk, asks for more,
  and checks the whole blob's sha256 at the end; bad chunks are named and fetched again
  (``pull.py``). Interrupted fetches resume from disk.
  A peer may only pull blobs that were offered to it.

A device endpoint reports ``on_server_event(kind, value, retained)`` on paho's thread: kinds
"status" (str), "epoch" (ServerEpoch), "connected" (True on a reconnect). See ``announce_epoch``.

With ``PairTopics`` the same machinery runs pairing (peers are pairing client ids);
``ephemeral`` then makes a one-off client: clean session and no retained status.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ..protocol import messages as msgs
from ..protocol.blobs import (
    DEFAULT_CHUNK_BYTES,
    MAX_CHUNK_BYTES,
    Chunk,
    chunk_count,
    decode_chunk,
    encode_chunk,
    sha256_hex,
)
from ..protocol.epoch import ServerEpoch
from ..protocol.errors import ProtocolError
from ..protocol.pair_topics import PairTopics
from ..protocol.topics import FleetTopics
from .blob_store import BlobStore
from .inbox import Inbox, RejectionLimit, Strangers
from .mqtt_link import BrokerAddress, MqttLink
from .pull import BlobPull
from .routes import SERVER, Routes
from .serve_queue import ServeQueue
from .status_exchange import status_exchange

log = logging.getLogger(__name__)

DEFAULT_MAX_BLOB_BYTES = 512 * 1024 * 1024


@dataclass(frozen=True)
class Incoming:
    """Something that arrived from ``peer``: a valid message, a status, or a rejection."""

    peer: str
    message: msgs.Message | None = None
    status: str | None = None
    rejected: ProtocolError | None = None
    arrived: float = field(default_factory=time.monotonic)  # monotonic seconds (the clock rule)


class Endpoint:
    """Send messages and blobs to peers, receive theirs. See the module docstring."""

    def __init__(
        self,
        broker: BrokerAddress,
        topics: FleetTopics | PairTopics,
        store: BlobStore,
        *,
        device_id: str | None = None,
        is_known_peer: Callable[[str], bool] = lambda peer: True,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        window: int = 16,
        max_blob_bytes: int = DEFAULT_MAX_BLOB_BYTES,
        username: str | None = None,
        password: str | None = None,
        ca_file: str | None = None,
        client_id: str | None = None,
        ephemeral: bool = False,
        tls_verify: bool = True,
        insecure: bool = False,
    ) -> None:
        if not 0 < chunk_bytes <= MAX_CHUNK_BYTES:
            raise ValueError(f"chunk_bytes must be in 1..{MAX_CHUNK_BYTES}, got {chunk_bytes}")
        self.topics = topics
        self.routes = Routes(topics, device_id)
        self.store = store
        self.device_id = device_id
        self.is_known_peer = is_known_peer
        self.chunk_bytes = chunk_bytes
        self.window = max(1, window)
        self.max_blob_bytes = max_blob_bytes
        self.inbox: Inbox = Inbox()  # results first (inbox.py)
        self.strangers = Strangers()  # traffic from ids outside the fleet: counted, rate-limited
        self.rejections = RejectionLimit()  # known peers' garbage: one booked per (peer, code) a minute
        self.stray_chunks = 0  # chunk frames that arrived while no pull from their peer ran
        self.bytes_sent = 0
        self.bytes_received = 0
        self.corrupt_chunks = 0  # chunk frames not what they declared (damaged), asked for again
        self.contested_chunks = 0  # chunks that arrived twice with different bytes (forged), asked again
        self.refetched_chunks = 0  # chunks fetched again after a blob failed its id (pull.py)
        self.comebacks: Counter[str] = Counter()  # peer -> its status turned "online" live (back, restarted)
        self._lock = threading.Lock()
        self._transfers: dict[tuple[str, str], queue.Queue[Chunk | ProtocolError]] = {}
        self._offered: dict[str, set[str]] = {}
        self._served: dict[str, set[str]] = {}  # peer -> offered blobs whose last chunk it was sent
        self._chunk_shas: dict[tuple[str, int], list[str]] = {}  # (blob, chunk_bytes) -> sha per chunk
        self._serve_queue = ServeQueue()  # blob requests, repeats of waiting ones dropped
        self._server_thread = threading.Thread(target=self._serve_loop, daemon=True)
        self.on_server_event: Callable[[str, object, bool], None] | None = None  # device side, see above
        if device_id is None:
            status_topic, subscriptions = topics.server_status, topics.server_subscriptions
            client_id = client_id or f"fedsdk-server-{topics.fleet}"
        else:
            status_topic = topics.device_status(device_id)
            subscriptions = topics.device_subscriptions(device_id)
            client_id = client_id or f"fedsdk-dev-{topics.fleet}-{device_id}"
        if ephemeral:  # a one-off client (pairing): clean session, no retained status left behind
            status_topic = None
        self.link = MqttLink(
            broker,
            client_id,
            self._on_message,
            status_topic=status_topic,
            subscriptions=subscriptions,
            username=username,
            password=password,
            ca_file=ca_file,
            tls_verify=tls_verify,
            clean_session=ephemeral,
            max_payload=max(MAX_CHUNK_BYTES + 4096, msgs.MAX_CONTROL_BYTES),
            insecure=insecure,
            pass_retain=True,
            on_connected=lambda reconnect: self._server_event("connected", reconnect, False),
        )

    # -- lifecycle -----------------------------------------------------------------------
    def start(self, timeout_s: float = 15.0) -> Endpoint:
        self.link.connect(timeout_s)
        self._server_thread.start()
        return self

    def close(self) -> None:
        self._serve_queue.put(None)
        self.link.close()

    # -- sending -------------------------------------------------------------------------
    def send(self, peer: str, message: msgs.Message, *, qos: int = 1) -> None:
        """Publish a control message to ``peer`` (a device id, or SERVER on a device). QoS 0
        (heartbeats) is never queued for an offline peer, and dropped while we are offline. A task
        gets ``server_time`` = now at each sending (the clock rule, ``protocol/clock.py``)."""
        if isinstance(message, msgs.Task):
            message = replace(message, server_time=time.time())
        self.link.publish(self.routes.control_topic(peer), msgs.encode(message), qos=qos)

    def announce_epoch(self, epoch: ServerEpoch) -> None:
        """Server side: publish ``epoch`` retained now and on every reconnect, before "online"."""
        self.epoch: ServerEpoch | None = epoch  # what a status_request is answered with (§3.2)
        self.link.keep_retained(self.topics.server_epoch, epoch.encode())

    def offer(self, peer: str, data: bytes, kind: str, fmt: str) -> msgs.BlobRef:
        """Store ``data`` and allow ``peer`` to pull it; returns the reference to send."""
        blob_id = self.store.put(data)
        if (blob_id, self.chunk_bytes) not in self._chunk_shas:  # hash once, serve many times
            shas = [
                sha256_hex(data[i : i + self.chunk_bytes])
                for i in range(0, max(len(data), 1), self.chunk_bytes)
            ]
            self._chunk_shas[(blob_id, self.chunk_bytes)] = shas
            while len(self._chunk_shas) > 256:
                self._chunk_shas.pop(next(iter(self._chunk_shas)))
        with self._lock:
            self._offered.setdefault(peer, set()).add(blob_id)
        return msgs.BlobRef(id=blob_id, size=len(data), kind=kind, format=fmt)

    def withdraw(self, peer: str) -> None:
        """Forget every blob offered to ``peer``."""
        with self._lock:
            self._offered.pop(peer, None)
            self._served.pop(peer, None)

    def served(self, peer: str, blob_id: str) -> bool:
        """Whether ``peer`` was sent the last chunk of offered blob ``blob_id`` (its pull is done)."""
        with self._lock:
            return blob_id in self._served.get(peer, ())

    # -- receiving blobs -----------------------------------------------------------------
    def fetch(self, peer: str, ref: msgs.BlobRef, *, timeout_s: float = 120.0, idle_s: float = 5.0,
              durable: bool = False, from_peer: bool = False) -> bytes:
        """Pull blob ``ref`` from ``peer``; returns its verified bytes. A blob already in the
        store is not pulled again unless ``from_peer`` (the peer must show it holds the blob:
        a device's result may not name one the server already has, e.g. the weights it sent).

        Raises ProtocolError ("too_large" before anything is allocated; "checksum_mismatch"
        when the blob is not what its id says after 3 passes (``pull.py``); the
        holder's refusal such as "not_offered") or TimeoutError.
        """
        if ref.size > self.max_blob_bytes:
            raise ProtocolError(
                "too_large", f"blob {ref.id[:12]} is {ref.size} bytes; limit {self.max_blob_bytes}"
            )
        if self.store.has(ref.id) and not from_peer:
            return self.store.get(ref.id)
        part = self.store.partial(ref.id, ref.size, self.chunk_bytes)
        arrivals: queue.Queue[Chunk | ProtocolError] = queue.Queue()
        key = (peer, ref.id)
        with self._lock:
            self._transfers[key] = arrivals
        pull = BlobPull(peer, ref, part, arrivals, window=self.window, request=lambda indices: self.send(
            peer, msgs.BlobRequest(blob=ref.id, indices=indices, chunk_bytes=self.chunk_bytes)))
        try:
            if pull.run(time.monotonic() + timeout_s, idle_s):
                return part.commit(durable=durable)
            part.discard()
            raise ProtocolError("checksum_mismatch", f"blob {ref.id[:12]} from {peer} does not match its id")
        finally:
            self.bytes_received += pull.bytes_received
            self.corrupt_chunks += pull.damaged
            self.contested_chunks += pull.contested
            self.refetched_chunks += pull.refetched
            part.close()
            with self._lock:
                self._transfers.pop(key, None)

    def cancel_fetch(self, peer: str, blob_id: str, reason: str) -> None:
        """Make a running ``fetch`` of ``blob_id`` from ``peer`` raise ProtocolError("cancelled")."""
        with self._lock:
            arrivals = self._transfers.get((peer, blob_id))
        if arrivals is not None:
            arrivals.put(ProtocolError("cancelled", reason))

    # -- serving blobs (own thread) ------------------------------------------------------
    def _serve_loop(self) -> None:
        while (item := self._serve_queue.get()) is not None:
            peer, request = item
            try:
                self._serve(peer, request)
            except ProtocolError as err:  # server: a blob it never had is garbage, rate-limited
                if (self.device_id is not None or self.store.has(request.blob)
                        or self.rejections.admit(peer, err.code)):
                    log.warning("blob request from %s refused: %s", peer, err)
                    self._reply_error(peer, err, ref=request.blob)
            except Exception:
                log.exception("serving blob %s to %s failed", request.blob[:12], peer)

    def _serve(self, peer: str, request: msgs.BlobRequest) -> None:
        with self._lock:
            allowed = request.blob in self._offered.get(peer, ())
        if not allowed or not self.store.has(request.blob):
            raise ProtocolError("not_offered", f"blob {request.blob[:12]} was not offered to {peer}")
        if not 0 < request.chunk_bytes <= MAX_CHUNK_BYTES:
            raise ProtocolError("invalid_field", f"chunk_bytes {request.chunk_bytes} out of range")
        size = self.store.size(request.blob)
        count = chunk_count(size, request.chunk_bytes)
        topic = self.routes.chunk_topic(peer)
        shas = self._chunk_shas.get((request.blob, request.chunk_bytes))
        for index in request.indices:
            if not 0 <= index < count:
                raise ProtocolError("invalid_field", f"chunk index {index} not in 0..{count - 1}")
            data = self.store.read_range(request.blob, index * request.chunk_bytes, request.chunk_bytes)
            frame = self.frame_chunk(
                request.blob, index, size, request.chunk_bytes, data, shas[index] if shas else None
            )
            self.link.publish(topic, frame)
            self.bytes_sent += len(data)
        if count - 1 in request.indices:
            with self._lock:
                self._served.setdefault(peer, set()).add(request.blob)

    def frame_chunk(self, blob: str, index: int, size: int, chunk_bytes: int, data: bytes,
                    sha: str | None = None) -> bytes:
        """Frame one outgoing chunk (a seam for fault-injection tests)."""
        return encode_chunk(blob, index, size, chunk_bytes, data, sha)

    # -- routing (paho's network thread: parse and enqueue only) -------------------------
    def _server_event(self, kind: str, value: object, retained: bool) -> None:
        if self.device_id is not None and self.on_server_event is not None:
            self.on_server_event(kind, value, retained)

    def _on_message(self, topic: str, payload: bytes, retained: bool = False) -> None:
        try:
            peer, kind = self.routes.classify(topic)
        except ValueError:
            log.debug("ignoring message on unexpected topic %s", topic)
            return
        if kind == "status":
            if peer == SERVER or self.is_known_peer(peer):
                status = payload.decode("utf-8", "replace")
                self.comebacks[peer] += status == "online" and not retained  # before its later traffic
                self.inbox.put(Incoming(peer, status=status))
                if peer == SERVER:
                    self._server_event("status", status, retained)
            return
        if kind == "epoch":
            try:
                self._server_event("epoch", ServerEpoch.decode(payload), retained)
            except ProtocolError as err:
                log.warning("ignoring the server epoch: %s", err)
            return
        if not self.is_known_peer(peer):
            dropped = self.strangers.admit(peer)  # one message per id a minute goes on
            if dropped is None:
                return
            err = ProtocolError("unknown_device", f"device {peer!r} is not in this fleet")
            log.warning("rejected %s traffic from %s (%d more dropped in the last minute; further "
                        "traffic from it is only counted for a minute)", kind, err.detail, dropped)
            if kind == "control":
                self._reply_error(peer, err)
                self.inbox.put(Incoming(peer, rejected=err))
            return
        if kind == "chunk":
            self._on_chunk(peer, payload)
            return
        try:
            message = msgs.decode(payload)
        except ProtocolError as err:
            if not self.rejections.admit(peer, err.code):  # only counted (inbox.RejectionLimit)
                return
            log.warning("rejected message from %s: %s", peer, err)
            if not msgs.says_error(payload):  # never answer an error with an error: two peers could loop
                self._reply_error(peer, err)
            self.inbox.put(Incoming(peer, rejected=err))
            return
        if isinstance(message, msgs.BlobRequest):
            self._serve_queue.put((peer, message))
            return
        if isinstance(message, msgs.StatusRequest | msgs.ServerStatus):
            return status_exchange(self, peer, message)  # §3.2: answered here, the loop may be busy
        if isinstance(message, msgs.Error) and message.ref:
            with self._lock:
                arrivals = self._transfers.get((peer, message.ref))
            if arrivals is not None:  # the holder refused a blob we are fetching: stop now
                arrivals.put(ProtocolError(message.code, message.detail))
        self.inbox.put(Incoming(peer, message=message))

    def _on_chunk(self, peer: str, payload: bytes) -> None:
        with self._lock:
            awaited = any(holder == peer for holder, _ in self._transfers)
        if not awaited:  # nobody pulls from this peer now: dropped unread
            self.stray_chunks += 1
            return
        try:
            chunk = decode_chunk(payload)
        except ProtocolError as err:
            if self.rejections.admit(peer, f"chunk:{err.code}"):
                log.warning("rejected chunk frame from %s: %s", peer, err)
            return
        with self._lock:
            arrivals = self._transfers.get((peer, chunk.blob))
        if arrivals is not None:
            arrivals.put(chunk)

    def _reply_error(self, peer: str, err: ProtocolError, ref: str | None = None) -> None:
        try:
            self.send(peer, msgs.Error(code=err.code, detail=err.detail[:500], ref=ref))
        except Exception:
            log.exception("could not send error to %s", peer)

