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

Every repeat uses fresh random bytes, so nothing is served from the receiver's store, and
the three methods take turns within each repeat, so background load hits them alike. The
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
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import paho.mqtt.client as mqtt

from sdk_device.protocol import FleetTopics
from sdk_device.transport.blob_store import BlobStore
from sdk_device.transport.endpoint import SERVER, Endpoint
from sdk_device.transport.mqtt_link import BrokerAddress
from server_toolkit.broker.mosquitto import MosquittoBroker

MB = 1_000_000
# The raw baseline sends each blob as ONE message, which fedsdk's broker config refuses above
# 16 MiB (max_packet_size); allow MQTT's maximum. fedsdk's chunks are far below either limit.
BROKER_CONFIG = "max_packet_size 268435455"
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
    """Two plain paho clients: one publishes on ``topic``, the other is subscribed to it."""

    def __init__(self, broker: BrokerAddress, *, nodelay: bool = False) -> None:
        self.broker = broker
        self.nodelay = nodelay
        self.topic = f"bench/raw/{'nodelay' if nodelay else 'default'}"
        self.arrivals: queue.Queue[tuple[float, bytes | None]] = queue.Queue()
        self._subscribed = threading.Event()
        self.publisher = self._client()
        self.subscriber = self._client()
        self.subscriber.on_subscribe = lambda *args: self._subscribed.set()
        self.subscriber.on_message = self._on_message
        self.publisher.on_disconnect = self._on_publisher_disconnect

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
            client.subscribe(self.topic, qos=1)
        connected.set()

    def _on_message(self, client: mqtt.Client, userdata, message: mqtt.MQTTMessage) -> None:
        self.arrivals.put((time.perf_counter(), message.payload))

    def _on_publisher_disconnect(self, client: mqtt.Client, userdata, flags, reason_code,
                                 properties) -> None:
        self.arrivals.put((time.perf_counter(), None))  # wakes a waiting transfer() at once

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
        self.publisher.publish(self.topic, payload, qos=1)
        try:
            arrived, received = self.arrivals.get(timeout=timeout_s)
        except queue.Empty:
            raise TimeoutError(
                f"raw: a {len(payload)}-byte message did not arrive within {timeout_s} s"
            ) from None
        if received is None:
            raise ConnectionError(
                f"raw: the broker dropped the publisher while it sent {len(payload)} bytes "
                "(larger than the broker's max_packet_size?)"
            )
        return arrived - start, received == payload

    def close(self) -> None:
        for client in (self.publisher, self.subscriber):
            client.disconnect()
            client.loop_stop()


class FedsdkPair:
    """A server ``Endpoint`` offering blobs to a device ``Endpoint`` that fetches them."""

    def __init__(self, broker: BrokerAddress, workdir: Path, *, chunk_bytes: int = 256 * 1024,
                 window: int = 16, timeout_s: float = 120.0) -> None:
        topics = FleetTopics("bench")
        self.timeout_s = timeout_s
        self.server = Endpoint(broker, topics, BlobStore(workdir / "server"),
                               chunk_bytes=chunk_bytes, window=window)
        self.device = Endpoint(broker, topics, BlobStore(workdir / "device"), device_id=DEVICE_ID,
                               chunk_bytes=chunk_bytes, window=window)

    def start(self, timeout_s: float = 10.0) -> FedsdkPair:
        """Connect both endpoints and fetch a small blob, so both subscriptions are active."""
        self.server.start(timeout_s)
        self.device.start(timeout_s)
        self.transfer(os.urandom(1024))
        return self

    def transfer(self, data: bytes) -> tuple[float, bool]:
        """Offer ``data`` and time the device's fetch; returns (seconds, bytes matched)."""
        ref = self.server.offer(DEVICE_ID, data, "weights", "safetensors")
        start = time.perf_counter()
        got = self.device.fetch(SERVER, ref, timeout_s=self.timeout_s)
        took = time.perf_counter() - start
        for store in (self.server.store, self.device.store):
            store.path(ref.id).unlink(missing_ok=True)  # keep the temp dir small
        return took, got == data

    def close(self) -> None:
        self.device.close()
        self.server.close()


# -- measuring -----------------------------------------------------------------------------
Transport = RawPair | FedsdkPair


@contextmanager
def open_transports(broker: BrokerAddress, workdir: Path, chunk_bytes: int,
                    window: int) -> Iterator[dict[str, Transport]]:
    """The three ways of moving a blob, connected and warmed up; closed on exit."""
    with ExitStack() as stack:
        transports: dict[str, Transport] = {
            "raw": RawPair(broker, nodelay=False),
            "raw_nodelay": RawPair(broker, nodelay=True),
            "fedsdk": FedsdkPair(broker, workdir, chunk_bytes=chunk_bytes, window=window),
        }
        for transport in transports.values():
            stack.callback(transport.close)
            transport.start()
        yield transports


def measure(transports: dict[str, Transport], size_bytes: int, repeats: int) -> dict[str, Measurement]:
    """Time ``repeats`` transfers of fresh random ``size_bytes`` blobs with every transport.

    The transports take turns within each repeat, so a busy machine slows all of them alike.
    """
    seconds: dict[str, list[float]] = {name: [] for name in transports}
    matched = dict.fromkeys(transports, True)
    for _ in range(repeats):
        for name, transport in transports.items():
            took, ok = transport.transfer(os.urandom(size_bytes))
            seconds[name].append(took)
            matched[name] = matched[name] and ok
    return {name: Measurement(size_bytes, seconds[name], matched[name]) for name in transports}


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
    """Measure every transport at every size (MB = 10**6 bytes)."""
    with open_transports(broker, workdir, chunk_bytes, window) as transports:
        return [SizeResult(**measure(transports, int(size_mb * MB), repeats)) for size_mb in sizes_mb]


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
    try:
        sizes_mb = [float(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        sizes_mb = []
    if not sizes_mb or min(sizes_mb) <= 0:
        parser.error(f"--sizes must list positive numbers of MB, like 1,20 (got {args.sizes!r})")
    if args.repeats < 1 or not 1 <= args.chunk_kib <= 4096 or args.window < 1:
        parser.error("need --repeats >= 1, --chunk-kib in 1..4096 and --window >= 1")

    with tempfile.TemporaryDirectory(prefix="fedsdk-bench-") as tmp:
        workdir = Path(tmp)
        (workdir / "broker").mkdir()
        with MosquittoBroker(workdir=workdir / "broker", extra_config=BROKER_CONFIG) as broker:
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
