"""Async mode (rounds/mqtt_async.py): a device whose update is rejected for its own data (NaN,
wrong shape, a replay) is idle again at once, as a round resolves such a device: its task
closes, it holds no concurrency slot and the next dispatch may task it again, so the buffer
keeps filling. Before, its task stayed open until it expired (``--round-timeout``, 300 s by
default) while the device, told the error, never sent again.

The real ``AsyncMqttGrid`` with its real checks; the endpoint stands in for the broker: it
records what is sent and hands the grid the device's update bytes when it pulls them.
"""

from __future__ import annotations

import time
import types
from collections import Counter

import numpy as np

from fedcore import modelspec
from fedcore.recipe import Recipe
from sdk_device.protocol import messages as msgs
from sdk_device.protocol.blobs import encode_tensors, sha256_hex
from sdk_device.transport.blob_store import BlobStore
from sdk_device.transport.inbox import Inbox, RejectionLimit
from server_toolkit.fleet.registry import FleetRegistry
from server_toolkit.methods.base import DeviceInfo, TrainInstruction
from server_toolkit.models.zoo import model_spec
from server_toolkit.rounds.mqtt_async import AsyncMqttGrid

SPEC = model_spec("small_cnn", (1, 8, 8), 10)


class DeviceSide:
    """The endpoint as the grid sees it: offers go to a blob store, pulls return ``updates``."""

    def __init__(self, store: BlobStore) -> None:
        self.store = store
        self.sent: list[tuple[str, msgs.Message]] = []
        self.updates: dict[str, bytes] = {}  # blob id -> the bytes the device serves
        self.rejections = RejectionLimit()
        self.comebacks: Counter[str] = Counter()
        self.inbox = Inbox()
        self.link = types.SimpleNamespace(connects=1)

    def announce_epoch(self, epoch) -> None:
        pass

    def offer(self, peer: str, data: bytes, kind: str, fmt: str) -> msgs.BlobRef:
        return msgs.BlobRef(id=self.store.put(data), size=len(data), kind=kind, format=fmt)

    def send(self, peer: str, message: msgs.Message) -> None:
        self.sent.append((peer, message))

    def fetch(self, peer: str, ref: msgs.BlobRef, **kwargs) -> bytes:
        return self.updates[ref.id]

    def withdraw(self, peer: str) -> None:
        pass

    def cancel_fetch(self, *args) -> None:
        pass


def _answers(endpoint: DeviceSide, dev: str) -> list[msgs.Message]:
    return [m for peer, m in endpoint.sent if peer == dev and isinstance(m, msgs.Ack | msgs.Error)]


def test_a_device_whose_update_is_rejected_for_its_own_data_is_idle_again_at_once(tmp_path):
    registry = FleetRegistry(tmp_path / "registry.sqlite")
    endpoint = DeviceSide(BlobStore(tmp_path / "blobs"))
    grid = AsyncMqttGrid(endpoint, registry)
    weights = {"layers.0.weight": np.ones((4, 3), np.float32), "layers.0.bias": np.zeros(4, np.float32)}
    program = ((modelspec.FORMAT, modelspec.dumps(SPEC)),)  # (no export: the task's program as given)
    for dev in ("bad", "good"):
        registry.add_device(dev)
        grid.devices[dev] = DeviceInfo(dev, 10)
    grid.open_version(0)
    tasks = [TrainInstruction(dev, SPEC, weights, Recipe(), programs=program) for dev in ("bad", "good")]
    grid.submit(0, tasks, timeout_s=300)
    assert grid.idle() == [] and grid.in_flight() == {0: 2}
    [task] = [m for peer, m in endpoint.sent if peer == "bad" and isinstance(m, msgs.Task)]
    nan = encode_tensors({k: np.full_like(v, np.nan) for k, v in weights.items()})
    endpoint.updates[sha256_hex(nan)] = nan
    result = msgs.Result(task_id=task.task_id, round=task.round, metrics={"samples": 10}, arrays={
        "model": msgs.BlobRef(id=sha256_hex(nan), size=len(nan), kind="weights", format="safetensors")})
    grid._on_result("bad", result)
    until = time.monotonic() + 10
    while not _answers(endpoint, "bad") and time.monotonic() < until:  # the pull runs on a fetch thread
        time.sleep(0.01)
    [error] = _answers(endpoint, "bad")
    assert isinstance(error, msgs.Error) and error.code == "non_finite" and error.ref == task.task_id
    assert [d.device_id for d in grid.idle()] == ["bad"]  # its slot is free: the loop may task it again
    assert grid.in_flight() == {0: 1} and grid.live().asked == ["good"]
    grid._on_result("bad", result)  # the device sends it again: the same error, nothing pulled again
    assert _answers(endpoint, "bad") == [error, error] and grid._pulls == {}
    assert grid.counters() == {"rejected": 1, "expired": 0}
    grid.close()
    registry.close()
