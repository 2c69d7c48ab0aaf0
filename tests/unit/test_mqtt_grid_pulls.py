"""The MQTT grid never pulls one blob id twice at once: two pulls of one id share its partial
file in the blob store, and the second commit of it fails outside the protocol's errors (two
edges' equal ``coverage`` records lost one edge's result, and the round waited out its
deadline). Pulls of different blobs still run side by side."""

from __future__ import annotations

import hashlib
import threading
import time
from types import SimpleNamespace

import pytest

from sdk_device.protocol import messages as msgs
from sdk_device.protocol.errors import ProtocolError
from server_toolkit.fleet.registry import FleetRegistry
from server_toolkit.rounds.mqtt_grid import MqttGrid


class CountingEndpoint:
    """``fetch`` takes 0.2 s, notes how many fetches overlap, then refuses (ends the pull)."""

    def __init__(self) -> None:
        self.running = self.most = 0
        self.lock = threading.Lock()

    def fetch(self, dev, ref, **_kwargs) -> bytes:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        time.sleep(0.2)
        with self.lock:
            self.running -= 1
        raise ProtocolError("not_offered", "test")


def _overlap(tmp_path, ids: tuple[str, str]) -> int:
    registry = FleetRegistry(tmp_path / "registry.sqlite")
    grid = MqttGrid(None, registry)
    grid.endpoint, grid._open_round = CountingEndpoint(), 1
    pending = SimpleNamespace(round=1)

    def pull(dev: str, blob: str) -> None:
        ref = msgs.BlobRef(id=blob, size=4, kind="weights", format="safetensors")
        with pytest.raises(ProtocolError):
            grid._pull_result(dev, msgs.Result(task_id=f"t-{dev}", round=1, arrays={"coverage": ref},
                                               metrics={"samples": 1}), pending)

    threads = [threading.Thread(target=pull, args=(f"edge-{i}", blob)) for i, blob in enumerate(ids)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    registry.close()
    return grid.endpoint.most


def test_two_pulls_of_one_blob_id_run_one_after_the_other_and_of_two_ids_side_by_side(tmp_path):
    same = hashlib.sha256(b"coverage").hexdigest()
    assert _overlap(tmp_path, (same, same)) == 1
    other = next(h for i in range(1000) if (h := hashlib.sha256(str(i).encode()).hexdigest())
                 and hash(h) % 64 != hash(same) % 64)
    assert _overlap(tmp_path, (same, other)) == 2
