"""The server side of the conformance kit: one MQTT client playing the fleet's server towards
one device, with hooks to damage the chunk frames it serves (docs/protocol.md §3, §7).

Everything the device publishes is kept in arrival order; checks wait for the first message
that matches a predicate (and consume it) or assert that none arrives.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import paho.mqtt.client as mqtt

from sdk_device.protocol.blobs import chunk_count, decode_chunk, encode_chunk, sha256_hex
from sdk_device.protocol.topics import FleetTopics
from sdk_device.transport.mqtt_link import BrokerAddress

# A fault: (blob id, chunk index, how many times this chunk was served before, frame) ->
# the payloads to publish instead (``[]`` drops the frame).
Fault = Callable[[str, int, int, bytes], list[bytes]]


@dataclass
class Received:
    """A control message from the device: its JSON object, the QoS it arrived with, when."""

    body: dict
    qos: int
    at: float = field(default_factory=time.monotonic)
    used: bool = False


class ServerPeer:
    """Acts as the server of ``fleet`` towards ``device_id`` (client id ``fedsdk-server-<fleet>``)."""

    def __init__(self, broker_url: str, fleet: str, device_id: str, ca_file: str | None = None) -> None:
        self.address = BrokerAddress.parse(broker_url)
        self.topics = FleetTopics(fleet)
        self.device = device_id
        self.received: list[Received] = []
        self.chunks: list[bytes] = []
        self.offered: dict[str, bytes] = {}
        self.faults: dict[str, Fault] = {}  # blob id -> fault
        self.served: dict[tuple[str, int], int] = {}
        self.requests: list[dict] = []
        self.refuse: set[str] = set()  # blob ids answered with not_offered
        self._cond = threading.Condition()
        self._client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=f"fedsdk-server-{fleet}",
            clean_session=True,
            protocol=mqtt.MQTTv311,
        )
        if self.address.username:
            self._client.username_pw_set(self.address.username, self.address.password)
        if self.address.tls:
            self._client.tls_set(ca_certs=ca_file)
        self._client.will_set(self.topics.server_status, b"offline", qos=1, retain=self.address.retain)
        self._client.on_message = self._on_message
        self._connected = threading.Event()
        self._client.on_connect = lambda *a: self._connected.set()

    # -- connection ------------------------------------------------------------------------
    def start(self, timeout_s: float = 15.0) -> ServerPeer:
        self._client.connect(self.address.host, self.address.port, keepalive=30)
        self._client.loop_start()
        if not self._connected.wait(timeout_s):
            raise RuntimeError(f"no CONNACK from {self.address.host}:{self.address.port}")
        base = self.topics.device_base(self.device)
        self._client.subscribe([(f"{base}/up", 1), (f"{base}/up/chunk", 1), (f"{base}/status", 1)])
        self.new_epoch(window_s=0.0)
        self.status("online")
        return self

    def close(self) -> None:
        self.status("offline")
        self._client.disconnect()
        self._client.loop_stop()

    def status(self, value: str) -> None:
        self._client.publish(self.topics.server_status, value.encode(), qos=1,
                             retain=self.address.retain).wait_for_publish(
            5
        )

    def new_epoch(self, window_s: float) -> None:
        """Publish a new server epoch (retained, live to subscribers): a 'restarted server'."""
        body = {"epoch": uuid.uuid4().hex, "started_at": time.time(), "announce_window_s": window_s}
        self._client.publish(
            self.topics.server_epoch, json.dumps(body).encode(), qos=1, retain=self.address.retain
        ).wait_for_publish(5)

    # -- sending ---------------------------------------------------------------------------
    def send(self, body: dict) -> None:
        self.send_raw(json.dumps(body, separators=(",", ":")).encode())

    def send_raw(self, payload: bytes) -> None:
        self._client.publish(self.topics.down(self.device), payload, qos=1)

    def offer(self, data: bytes, kind: str, fmt: str) -> dict:
        blob_id = sha256_hex(data)
        self.offered[blob_id] = data
        return {"id": blob_id, "size": len(data), "kind": kind, "format": fmt}

    # -- receiving -------------------------------------------------------------------------
    def wait_for(self, pred: Callable[[dict], bool], timeout_s: float, since: float = 0.0) -> Received | None:
        """The first unconsumed device message matching ``pred`` (and received at or after the
        monotonic time ``since``) within ``timeout_s``; it is marked consumed."""
        end = time.monotonic() + timeout_s
        with self._cond:
            while True:
                for item in self.received:
                    if not item.used and item.at >= since and pred(item.body):
                        item.used = True
                        return item
                left = end - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)

    def pull(self, ref: dict, chunk_bytes: int = 65536, timeout_s: float = 30.0) -> bytes:
        """Pull a blob the device offered (all chunks in requests of <= 64); raises on failure."""
        count = chunk_count(ref["size"], chunk_bytes)
        with self._cond:
            self.chunks.clear()
        for start in range(0, count, 64):
            self.send(
                message(
                    "blob_request",
                    blob=ref["id"],
                    indices=list(range(start, min(count, start + 64))),
                    chunk_bytes=chunk_bytes,
                )
            )
        parts: dict[int, bytes] = {}
        end = time.monotonic() + timeout_s
        with self._cond:
            while len(parts) < count:
                for payload in self.chunks:
                    chunk = decode_chunk(payload)
                    if chunk.blob == ref["id"]:
                        parts[chunk.index] = chunk.data
                self.chunks.clear()
                refused = [
                    r
                    for r in self.received
                    if not r.used and r.body.get("type") == "error" and r.body.get("ref") == ref["id"]
                ]
                if refused:
                    refused[0].used = True
                    raise RuntimeError(f"the device refused to serve its blob: {refused[0].body.get('code')}")
                if len(parts) < count:
                    left = end - time.monotonic()
                    if left <= 0:
                        raise RuntimeError(
                            f"pulling {ref['id'][:12]} timed out ({len(parts)}/{count} chunks)"
                        )
                    self._cond.wait(left)
        data = b"".join(parts[i] for i in range(count))
        if sha256_hex(data) != ref["id"]:
            raise RuntimeError("the device's blob does not hash to its id")
        return data

    def _on_message(self, client, userdata, msg) -> None:
        if msg.topic.endswith("/up/chunk"):
            with self._cond:
                self.chunks.append(msg.payload)
                self._cond.notify_all()
            return
        if not msg.topic.endswith("/up"):
            return
        try:
            body = json.loads(msg.payload)
        except ValueError:
            body = {"type": "<not json>"}
        if not isinstance(body, dict):
            body = {"type": "<not an object>"}
        if body.get("type") == "blob_request":
            self._serve(body)
        with self._cond:
            self.received.append(Received(body, msg.qos))
            self._cond.notify_all()

    def _serve(self, request: dict) -> None:
        blob_id, chunk_bytes = request.get("blob"), request.get("chunk_bytes")
        self.requests.append(request)
        if blob_id in self.refuse or blob_id not in self.offered:
            self.send(message("error", code="not_offered", detail="not offered", ref=blob_id))
            return
        data = self.offered[blob_id]
        for index in request.get("indices", []):
            piece = data[index * chunk_bytes : (index + 1) * chunk_bytes]
            frame = encode_chunk(blob_id, index, len(data), chunk_bytes, piece)
            times = self.served.get((blob_id, index), 0)
            self.served[(blob_id, index)] = times + 1
            fault = self.faults.get(blob_id)
            for payload in fault(blob_id, index, times, frame) if fault else [frame]:
                self._client.publish(self.topics.down_chunk(self.device), payload, qos=1)


def message(kind: str, **fields) -> dict:
    """A v2 control message as the reference server would send it."""
    return {"schema": 2, "type": kind, "msg_id": uuid.uuid4().hex, "sent_at": time.time(), **fields}
