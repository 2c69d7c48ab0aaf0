"""Property-based fuzzing of a live server over mosquitto (issue 28): hypothesis strategies
for every control message type, chunk frames and statuses, schema-valid with extreme values or
invalid, published on every topic the server listens to; and a runner that drives rounds of
honest devices meanwhile. Used by tests/integration/test_fuzz_server.py (bounded, in CI) and
bench/fuzz.py (long runs).

Targets: the honest devices' ``up`` and ``up/chunk`` topics (not their status: an ``offline``
there takes a device out of the round by design, and a broker's ACLs keep others off it),
every topic of registered devices that never run ("ghosts"), and every topic of ids the fleet
does not know, from a fixed pool (so that the rate limit of strangers is what bounds the
registry).
"""

from __future__ import annotations

import json
import logging
import random
import struct
import threading
import time
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import seed as fixed_seed
from hypothesis import strategies as st

from sdk_device.protocol.blobs import CHUNK_MAGIC
from sdk_device.protocol.topics import FleetTopics
from sdk_device.transport.mqtt_link import MqttLink

GHOSTS = [f"ghost{i}" for i in range(3)]
STRANGERS = [f"stranger{i}" for i in range(8)]
TYPES = ["hello", "task", "result", "ack", "error", "heartbeat", "blob_request", "secagg", "pair_request",
         "pair_confirm", "unpair_request", "pair_ca_request", "no_such_type"]

EXTREME_INTS = st.one_of(st.sampled_from([0, -1, 1, 2**31 - 1, 2**31, 2**53, 2**63 - 1, -(2**63), 10**9,
                                          10**9 + 1]), st.integers(-(2**63), 2**63 - 1))
EXTREME_FLOATS = st.one_of(st.sampled_from([0.0, -0.0, 1e308, -1e308, 5e-324, 1.5, 1e13, 1e11]),
                           st.floats(allow_nan=False, allow_infinity=False))
TEXT = st.one_of(st.text(max_size=40),
                 st.sampled_from(["", "a" * 5000, "d/0", "\x00", "é…", "+", "#", "a" * 65]))
HEX64 = st.text("0123456789abcdef", min_size=64, max_size=64)
DEVICE_IDS = st.one_of(st.sampled_from(["good0", "good1", *GHOSTS, *STRANGERS]), TEXT)  # hello: own id, often
SCALAR = st.one_of(st.none(), st.booleans(), EXTREME_INTS, EXTREME_FLOATS, TEXT)
JSONISH = st.recursive(SCALAR, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=8), inner, max_size=5)), max_leaves=10)


def _blob_ref() -> st.SearchStrategy:
    return st.fixed_dictionaries({"id": st.one_of(HEX64, TEXT), "size": EXTREME_INTS,
                                  "kind": st.sampled_from(["weights", "program", "x" * 70]),
                                  "format": st.sampled_from(["safetensors", "torchspec/1", "a b"])})


FIELDS = {  # per type: its fields, with values of the right JSON type at their extremes
    "hello": {"device_id": DEVICE_IDS, "runtimes": st.lists(TEXT, max_size=20), "num_samples": EXTREME_INTS,
              "profile": JSONISH},
    "task": {"task_id": TEXT, "round": EXTREME_INTS, "programs": st.dictionaries(TEXT, st.lists(_blob_ref(),
             max_size=2), max_size=3), "arrays": st.dictionaries(TEXT, _blob_ref(), max_size=3),
             "config": JSONISH, "deadline": EXTREME_FLOATS},
    "result": {"task_id": TEXT, "round": EXTREME_INTS,
               "arrays": st.dictionaries(TEXT, _blob_ref(), max_size=3),
               "metrics": st.dictionaries(st.sampled_from(["samples", "loss", "x"]), SCALAR, max_size=3)},
    "ack": {"ref": TEXT, "detail": TEXT},
    "error": {"code": TEXT, "detail": TEXT, "ref": st.one_of(st.none(), TEXT, HEX64)},
    "heartbeat": {"state": TEXT, "task_id": st.one_of(st.none(), TEXT), "progress": EXTREME_FLOATS},
    "blob_request": {"blob": st.one_of(HEX64, TEXT), "indices": st.lists(EXTREME_INTS, max_size=70),
                     "chunk_bytes": EXTREME_INTS},
    "secagg": {"round": EXTREME_INTS, "stage": TEXT, "data": JSONISH},
    "pair_request": {"code": TEXT, "name": TEXT, "profile": JSONISH},
    "pair_confirm": {"session": TEXT, "name": TEXT, "profile": JSONISH},
    "unpair_request": {"device_id": DEVICE_IDS, "password": TEXT},
    "pair_ca_request": {},
    "no_such_type": {"x": SCALAR},
}


@st.composite
def control_payload(draw) -> bytes:
    """A control message: schema-valid with extreme values, or broken in one way."""
    kind = draw(st.sampled_from(TYPES))
    body = {"schema": 2, "type": kind, "msg_id": draw(st.one_of(st.just("m" * 32), TEXT)),
            "sent_at": draw(EXTREME_FLOATS), **{k: draw(v) for k, v in FIELDS[kind].items()}}
    how = draw(st.sampled_from(["valid", "valid", "valid", "drop", "retype", "schema", "extra", "bytes"]))
    if how == "drop" and len(body) > 2:
        body.pop(draw(st.sampled_from(sorted(body))))
    elif how == "retype":
        body[draw(st.sampled_from(sorted(body)))] = draw(JSONISH)
    elif how == "schema":
        body["schema"] = draw(st.one_of(st.sampled_from([1, 3, "2", 2.0, True, None]), EXTREME_INTS))
    elif how == "extra":
        body[draw(st.text(max_size=10))] = draw(JSONISH)
    elif how == "bytes":
        return draw(st.one_of(st.binary(max_size=200), st.just(b"[" * 5000), st.just(b"\xff\xfe{}"),
                              st.just(b'{"schema":2,"type":"hello","num_samples":1' + b"0" * 500 + b"}")))
    return json.dumps(body, allow_nan=False).encode()


@st.composite
def chunk_payload(draw) -> bytes:
    """A chunk frame: a well-formed header with extreme values, or a broken frame."""
    header = {"blob": draw(st.one_of(HEX64, TEXT)), "index": draw(EXTREME_INTS), "count": draw(EXTREME_INTS),
              "size": draw(EXTREME_INTS), "chunk_bytes": draw(EXTREME_INTS), "sha256": draw(HEX64)}
    if draw(st.booleans()):
        header[draw(st.sampled_from(sorted(header)))] = draw(JSONISH)
    raw = json.dumps(header).encode()
    length = draw(st.one_of(st.just(len(raw)), EXTREME_INTS.map(lambda n: n & 0xFFFFFFFF)))
    magic = draw(st.sampled_from([CHUNK_MAGIC, b"XXXX"]))
    return magic + struct.pack(">I", length) + raw + draw(st.binary(max_size=64))


@dataclass
class Fuzzer:
    """Publishes generated payloads for ``honest`` devices' and the others' topics of ``topics``."""

    link: MqttLink
    topics: FleetTopics
    honest: list[str]
    sent: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def item(self) -> st.SearchStrategy:
        targets = [(d, rest) for d in self.honest for rest in ("up", "up/chunk")]
        targets += [(d, rest) for d in GHOSTS + STRANGERS for rest in ("up", "up/chunk", "status")]
        return st.tuples(st.sampled_from(targets), control_payload(), chunk_payload(),
                         st.sampled_from([b"online", b"offline", b"", b"\xff" * 10, b"online" * 100]))

    def publish(self, target: tuple[str, str], control: bytes, chunk: bytes, status: bytes) -> None:
        dev, rest = target
        base = self.topics.device_base(dev)
        payload = {"up": control, "up/chunk": chunk, "status": status}[rest]
        self.link.publish(f"{base}/{rest}", payload, qos=0)
        self.sent += 1

    def run(self, count: int, seed: int | None = None, unique: int | None = None, rate: float = 0.0) -> int:
        """Publish ``count`` generated messages (fewer if ``stop`` is set); how many were sent.
        ``unique``: generate only that many with hypothesis (~15 ms each on a busy 2-core
        machine) and publish them in a seeded random order, on their targets, until ``count``
        were sent (a long run), at most ``rate`` a second (0: as fast as paho takes them); None:
        every message a new example."""
        if unique is None:
            self.generate(count, seed, lambda item: self.publish(*item))
            return self.sent
        pool: list = []
        self.generate(min(unique, count), seed, pool.append)
        rng = random.Random(seed)
        started = time.monotonic()
        while self.sent < count and not self.stop.is_set():
            self.publish(*rng.choice(pool))
            if self.sent % 100 == 0:
                ahead = self.sent / rate - (time.monotonic() - started) if rate else 0.0
                time.sleep(max(0.001, ahead))  # (also lets paho's thread drain its queue)
        return self.sent

    def generate(self, count: int, seed: int | None, use) -> None:
        """Hand ``count`` hypothesis examples of ``item()`` to ``use`` (stops early on ``stop``)."""
        @settings(max_examples=count, deadline=None, database=None, derandomize=seed is None,
                  suppress_health_check=list(HealthCheck), phases=["generate"])
        @given(self.item())
        def one(item) -> None:
            if not self.stop.is_set():
                use(item)

        if seed is not None:
            one = fixed_seed(seed)(one)
        one()


def fuzzed_fleet(fleet, honest: list[str]) -> tuple[dict, Fuzzer]:
    """Data for the ``honest`` devices of ``fleet`` (tests/integration/harness.py), the ghosts
    registered, and a connected fuzzer (close its ``link``): (data paths, fuzzer)."""
    paths = fleet.write_data(honest, "iid")
    for ghost in GHOSTS:
        fleet.registry.add_device(ghost)
    link = MqttLink(fleet.broker, "fuzzer", lambda *a: None, clean_session=True).connect()
    return paths, Fuzzer(link, FleetTopics(fleet.fleet), honest)


class Tracebacks(logging.Handler):
    """Counts log records that carry an exception (a traceback in the server's log) and
    exceptions that ended a thread."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[str] = []
        self._hook = threading.excepthook

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info or "Traceback" in record.getMessage():
            self.records.append(f"{record.name}: {record.getMessage()[:200]}")

    def __enter__(self) -> Tracebacks:
        logging.getLogger().addHandler(self)
        threading.excepthook = lambda args: self.records.append(f"thread {args.thread}: {args.exc_value!r}")
        return self

    def __exit__(self, *exc) -> None:
        logging.getLogger().removeHandler(self)
        threading.excepthook = self._hook
