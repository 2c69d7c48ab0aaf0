"""An in-process driver of one secure round: the real device client (``SecAggClient``) and
the real server state machine (``SecAggRound``) exchange their stage messages as JSON
strings in memory, without a broker. Used by the unit tests and ``bench/secagg.py`` (the
MQTT grid, ``secagg/mqtt_grid.py``, moves the same messages over the broker).

``updates``: per device, (its trained sub-model tensors, sample count, class counts or None);
``drop``: devices that vanish after sending their shares. Byte counts are of the JSON
messages and the masked vectors (8 bytes per element) each device sends and receives."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import numpy as np

from fedcore.secagg.layout import Layout
from sdk_device.secagg_client import SecAggClient

from .protocol import SecAggRound


@dataclass
class SecureRoundStats:
    """What one in-process round cost: bytes each device sent + received, seconds spent in
    the server's state machine, seconds spent in each device's client."""

    total: np.ndarray
    bytes_per_device: dict[str, int] = field(default_factory=dict)
    device_seconds: dict[str, float] = field(default_factory=dict)
    server_seconds: float = 0.0
    dropped: list[str] = field(default_factory=list)


def run_secure_round(round_number: int, layouts: dict[str, Layout],
                     updates: dict[str, tuple[dict, int, np.ndarray | None]], drop: set[str] = frozenset(),
                     fraction: float = 0.5, degree: int | None = None, seed: int = 0) -> SecureRoundStats:
    """One round through every stage; the unmasked sum and the costs."""
    devices = sorted(layouts)
    length = layouts[devices[0]].vector_length
    server = SecAggRound(round_number, devices, length, fraction, degree, seed)
    stats = SecureRoundStats(np.zeros(0, np.uint64))
    sent = dict.fromkeys(devices, 0)
    device_s = dict.fromkeys(devices, 0.0)
    clients: dict[str, SecAggClient] = {}

    def on_device(dev, fn, message):  # a message to a device and its answer, as JSON
        text = json.dumps(message)
        sent[dev] += len(text)
        clock = time.perf_counter()
        answer = fn(json.loads(text))
        device_s[dev] += time.perf_counter() - clock
        return answer

    def on_server(fn, *args):
        clock = time.perf_counter()
        out = fn(*args)
        stats.server_seconds += time.perf_counter() - clock
        return out

    for dev in devices:
        setup = {"layout": layouts[dev].to_json()}
        clients[dev] = on_device(dev, lambda m, d=dev: SecAggClient(d, round_number, m), setup)
        advert = on_device(dev, lambda m, d=dev: clients[d].advertise(), {})
        sent[dev] += len(json.dumps(advert))
        on_server(server.on_advertise, dev, json.loads(json.dumps(advert)))
    for dev, message in on_server(server.keys_messages).items():
        answer = on_device(dev, clients[dev].share, message)
        sent[dev] += len(json.dumps(answer))
        on_server(server.on_shares, dev, json.loads(json.dumps(answer)))
    for dev, message in on_server(server.collect_messages).items():
        if dev in drop:
            sent[dev] += len(json.dumps(message))
            continue
        tensors, samples, counts = updates[dev]
        vector = on_device(dev, lambda m, d=dev, t=tensors, n=samples, c=counts:
                           clients[d].masked_input(m, t, n, c), message)
        sent[dev] += vector.nbytes
        on_server(server.on_masked, dev, vector)
    for dev, message in on_server(server.unmask_messages).items():
        answer = on_device(dev, clients[dev].reveal, message)
        sent[dev] += len(json.dumps(answer))
        on_server(server.on_reveal, dev, json.loads(json.dumps(answer)))
    stats.total = on_server(server.unmasked_sum)
    stats.bytes_per_device, stats.device_seconds, stats.dropped = sent, device_s, server.dropped
    return stats
