"""Blob transfer throughput: fedsdk's chunked pull versus one plain MQTT message.

What is measured, against ONE mosquitto started by this script on a loopback port:

* **raw** - a plain paho-mqtt 2.x client (MQTT 3.1.1, QoS 1, default socket options)
  publishes the whole blob as one message; a second plain client subscribed to the topic
  notes when the complete message reaches ``on_message``. Time = publish call to arrival.
* **raw+nodelay** - the same, with TCP_NODELAY set on both clients' sockets (Nagle's
  algorithm off), as the fedsdk link does itself (``_disable_nagle`` in mqtt_link.py).
* **fedsdk** - a server ``Endpoint`` offers the blob to a device ``Endpoint``, which pulls it
  chunk by chunk (``Endpoint.fetch``: windows of ``BlobRequest``s, every chunk verified and
  written to disk, sha256 of the whole blob checked at the end). Time = the ``fetch`` call.

Every repeat uses fresh random bytes, so nothing is served from the receiver's store; the
median of the repeats is reported, with MB = 10**6 bytes. The headline ratio is
fedsdk / raw (goal >= 0.8); fedsdk / raw+nodelay is an extra column. The broker's resident
memory (VmRSS) is printed after the runs.

Run from the repository root::

    .venv/bin/python bench/transport.py [--sizes 1,20] [--repeats 5] [--chunk-kib 256] [--window 16]
"""

from __future__ import annotations

import argparse
import os
import queue
import socket
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import paho.mqtt.client as mqtt

from sdk_device.protocol import FleetTopics
from sdk_device.transport.blob_store import BlobStore
from sdk_device.transport.endpoint import SERVER, Endpoint
from sdk_device.transport.mqtt_link import BrokerAddress
from server_toolkit.broker.mosquitto import MosquittoBroker

MB = 1_000_000
RAW_TOPIC = "bench/raw/blob"
DEVICE_ID = "dev1"


@dataclass
class Measurement:
    """Durations (seconds) of ``repeats`` transfers of ``size_bytes`` each."""

    size_bytes: int
    seconds: list[float]
    matched: bool  # every transfer delivered exactly the bytes sent

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)

    @property
    def mb_per_s(self) -> float:
        return self.size_bytes / self.median_s / MB


# -- raw paho baseline ---------------------------------------------------------------------
class RawPair:
    """Two plain paho clients: one publishes on ``RAW_TOPIC``, the other is subscribed to it."""

    def __init__(self, broker: BrokerAddress, *, nodelay: bool = False) -> None:
        self.broker = broker
        self.nodelay = nodelay
        self.arrivals: queue.Queue[tuple[float, bytes]] = queue.Queue()
        self._subscribed = threading.Event()
        self.publisher = self._client()
        self.subscriber = self._client()
        self.subscriber.on_subscribe = lambda *args: self._subscribed.set()
        self.subscriber.on_message = self._on_message

    def _client(self) -> mqtt.Client:
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv311)
        client.user_data_set(threading.Event())  # set once connected
        client.on_connect = self._on_connect
        return client

    def _on_connect(self, client: mqtt.Client, connected: threading.Event, flags, reason_code,
                    properties) -> None:
        if reason_code.is_failure:
            return
        if self.nodelay:
            client.socket().setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if client is self.subscriber:
            client.subscribe(RAW_TOPIC, qos=1)
        connected.set()

    def _on_message(self, client: mqtt.Client, userdata, message: mqtt.MQTTMessage) -> None:
        self.arrivals.put((time.perf_counter(), message.payload))

    def start(self, timeout_s: float = 10.0) -> RawPair:
        """Connect both clients, wait for the subscription, and check a probe gets through."""
        for client in (self.subscriber, self.publisher):
            client.connect(self.broker.host, self.broker.port)
            client.loop_start()
            if not client.user_data_get().wait(timeout_s):
                raise TimeoutError(f"raw client: no CONNACK from {self.broker.url} within {timeout_s} s")
        if not self._subscribed.wait(timeout_s):
            raise TimeoutError(f"raw subscriber: no SUBACK within {timeout_s} s")
        self.transfer(b"probe", timeout_s)
        return self

    def transfer(self, payload: bytes, timeout_s: float = 60.0) -> tuple[float, bool]:
        """Publish ``payload`` once; returns (seconds until it arrived, bytes matched)."""
        while not self.arrivals.empty():  # nothing stale may be mistaken for this payload
            self.arrivals.get_nowait()
        start = time.perf_counter()
        self.publisher.publish(RAW_TOPIC, payload, qos=1)
        try:
            arrived, received = self.arrivals.get(timeout=timeout_s)
        except queue.Empty:
            raise TimeoutError(
                f"raw: a {len(payload)}-byte message did not arrive within {timeout_s} s"
            ) from None
        return arrived - start, received == payload

    def close(self) -> None:
        for client in (self.publisher, self.subscriber):
            client.disconnect()
            client.loop_stop()


def measure_raw(broker: BrokerAddress, size_bytes: int, repeats: int, *, nodelay: bool = False,
                timeout_s: float = 60.0) -> Measurement:
    """Time ``repeats`` single-message transfers of fresh random blobs of ``size_bytes``."""
    pair = RawPair(broker, nodelay=nodelay)
    try:
        pair.start()
        seconds, matched = [], True
        for _ in range(repeats):
            took, ok = pair.transfer(os.urandom(size_bytes), timeout_s)
            seconds.append(took)
            matched = matched and ok
        return Measurement(size_bytes, seconds, matched)
    finally:
        pair.close()


# -- fedsdk endpoints ----------------------------------------------------------------------
def measure_fedsdk(broker: BrokerAddress, size_bytes: int, repeats: int, *, workdir: Path,
                   chunk_bytes: int = 256 * 1024, window: int = 16,
                   timeout_s: float = 120.0) -> Measurement:
    """Time ``repeats`` ``Endpoint.fetch`` calls, each of a freshly offered random blob."""
    topics = FleetTopics("bench")
    server_store, device_store = BlobStore(workdir / "server"), BlobStore(workdir / "device")
    server = Endpoint(broker, topics, server_store, chunk_bytes=chunk_bytes, window=window)
    device = Endpoint(broker, topics, device_store, device_id=DEVICE_ID,
                      chunk_bytes=chunk_bytes, window=window)
    try:
        server.start()
        device.start()
        _fetch(server, device, os.urandom(1024), timeout_s)  # warm-up: both subscriptions active
        seconds, matched = [], True
        for _ in range(repeats):
            took, ok = _fetch(server, device, os.urandom(size_bytes), timeout_s)
            seconds.append(took)
            matched = matched and ok
        return Measurement(size_bytes, seconds, matched)
    finally:
        device.close()
        server.close()


def _fetch(server: Endpoint, device: Endpoint, data: bytes, timeout_s: float) -> tuple[float, bool]:
    """Offer ``data`` to the device and time its fetch; the blob is deleted afterwards."""
    ref = server.offer(DEVICE_ID, data, "weights", "safetensors")
    start = time.perf_counter()
    got = device.fetch(SERVER, ref, timeout_s=timeout_s)
    took = time.perf_counter() - start
    for store in (server.store, device.store):
        store.path(ref.id).unlink(missing_ok=True)  # keep the temp dir small
    return took, got == data


# -- reporting -----------------------------------------------------------------------------
@dataclass
class SizeResult:
    raw: Measurement
    raw_nodelay: Measurement
    fedsdk: Measurement

    @property
    def label(self) -> str:
        return f"{self.raw.size_bytes / MB:g}MB"

    @property
    def ratio(self) -> float:
        return self.fedsdk.mb_per_s / self.raw.mb_per_s

    @property
    def ratio_nodelay(self) -> float:
        return self.fedsdk.mb_per_s / self.raw_nodelay.mb_per_s

    @property
    def matched(self) -> bool:
        return self.raw.matched and self.raw_nodelay.matched and self.fedsdk.matched


def run(broker: BrokerAddress, sizes_mb: list[float], repeats: int, chunk_bytes: int, window: int,
        workdir: Path) -> list[SizeResult]:
    """All three measurements for every size, in order."""
    results = []
    for size_mb in sizes_mb:
        size = int(size_mb * MB)
        results.append(SizeResult(
            raw=measure_raw(broker, size, repeats),
            raw_nodelay=measure_raw(broker, size, repeats, nodelay=True),
            fedsdk=measure_fedsdk(broker, size, repeats, workdir=workdir / f"fedsdk-{size}",
                                  chunk_bytes=chunk_bytes, window=window),
        ))
    return results


def broker_rss_kib(pid: int) -> int | None:
    """The resident set size of process ``pid`` in KiB (Linux), or None if unknown."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def format_table(results: list[SizeResult]) -> str:
    header = (f"{'size':>7} {'raw MB/s':>9} {'raw ms':>8} {'nodelay MB/s':>13} {'fedsdk MB/s':>12}"
              f" {'fedsdk ms':>10} {'fedsdk/raw':>11} {'fedsdk/nodelay':>15}")
    lines = [header, "-" * len(header)]
    for r in results:
        lines.append(
            f"{r.label:>7} {r.raw.mb_per_s:9.1f} {r.raw.median_s * 1e3:8.1f} {r.raw_nodelay.mb_per_s:13.1f}"
            f" {r.fedsdk.mb_per_s:12.1f} {r.fedsdk.median_s * 1e3:10.1f} {r.ratio:11.2f}"
            f" {r.ratio_nodelay:15.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", default="1,20", help="blob sizes in MB (10**6 bytes), comma separated")
    parser.add_argument("--repeats", type=int, default=5, help="transfers per size and method (median)")
    parser.add_argument("--chunk-kib", type=int, default=256, help="fedsdk chunk size in KiB")
    parser.add_argument("--window", type=int, default=16, help="fedsdk chunks requested per window")
    args = parser.parse_args(argv)
    sizes_mb = [float(s) for s in args.sizes.split(",") if s.strip()]
    if not sizes_mb or min(sizes_mb) <= 0 or args.repeats < 1:
        parser.error("--sizes must list positive numbers and --repeats must be >= 1")

    with tempfile.TemporaryDirectory(prefix="fedsdk-bench-") as tmp:
        workdir = Path(tmp)
        (workdir / "broker").mkdir()
        with MosquittoBroker(workdir=workdir / "broker") as broker:
            print(f"mosquitto at {broker.url}; {args.repeats} repeats per size (median); "
                  f"fedsdk chunk {args.chunk_kib} KiB, window {args.window}", flush=True)
            results = run(broker.address, sizes_mb, args.repeats, args.chunk_kib * 1024, args.window,
                          workdir)
            rss = broker_rss_kib(broker.proc.pid)

    print(format_table(results))
    print(f"broker VmRSS after the runs: {f'{rss / 1024:.1f} MiB' if rss is not None else 'unknown'}")
    print("ratio " + ", ".join(f"{r.label}={r.ratio:.2f}" for r in results))
    if not all(r.matched for r in results):
        print("ERROR: some transfer delivered different bytes than were sent", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
