"""Bad input is rejected with a clear error, logged and counted; the round goes on.

Two honest device processes train next to misbehaving devices (real agents on real
sockets, run as threads so the test can make them misbehave): a corrupt chunk, a blob
whose bytes do not match its id, a wrong schema version and malformed JSON, an oversized
blob, a NaN update, a wrongly shaped update, and a device the fleet does not know.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from sdk_device.agent import DeviceAgent
from sdk_device.protocol import messages as msgs
from sdk_device.protocol.blobs import decode_tensors, encode_tensors
from sdk_device.protocol.topics import FleetTopics
from sdk_device.transport.blob_store import BlobStore
from sdk_device.transport.endpoint import SERVER, Endpoint

from .harness import Fleet

pytestmark = pytest.mark.integration


class RecordingAgent(DeviceAgent):
    """An agent that remembers the errors and acks the server sent it."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.errors: list[msgs.Error] = []
        self.acks = 0

    def _handle(self, incoming) -> None:
        if isinstance(incoming.message, msgs.Error):
            self.errors.append(incoming.message)
        if isinstance(incoming.message, msgs.Ack):
            self.acks += 1
        super()._handle(incoming)


class CorruptingEndpoint(Endpoint):
    """Serves the first chunk of its first upload with one byte flipped."""

    corrupted = 0

    def frame_chunk(self, blob, index, size, chunk_bytes, data, sha=None):
        frame = super().frame_chunk(blob, index, size, chunk_bytes, data, sha)
        if self.corrupted == 0:
            self.corrupted += 1
            return frame[:-1] + bytes([frame[-1] ^ 0xFF])
        return frame


class Rogue(RecordingAgent):
    """Answers each task by sending back the received weights, after ``tamper``."""

    def tamper(self, weights: dict) -> dict:
        return weights

    def send_result(self, task: msgs.Task, ref: msgs.BlobRef) -> None:
        self.endpoint.send(SERVER, msgs.Result(task_id=task.task_id, round=task.round, arrays={"model": ref},
                                               metrics={"samples": len(self.y), "loss": 1.0}))

    def _run_task(self, task: msgs.Task, arrived: float) -> None:
        weights = self.tamper(decode_tensors(self.endpoint.fetch(SERVER, task.arrays["model"])))
        ref = self.endpoint.offer(SERVER, encode_tensors(weights), "weights", "safetensors")
        self.send_result(task, ref)


class LyingBlob(Rogue):
    """The bytes it serves are not the blob its result names (whole-blob sha mismatch)."""

    def tamper(self, weights):  # new bytes, so the server cannot already hold this blob
        return {k: v + 1 if v.dtype.kind == "f" else v for k, v in weights.items()}

    def send_result(self, task, ref):
        path = self.endpoint.store.path(ref.id)
        data = bytearray(path.read_bytes())
        data[-1] ^= 0xFF
        path.write_bytes(bytes(data))
        super().send_result(task, ref)


class Oversized(Rogue):
    def send_result(self, task, ref):
        super().send_result(task, msgs.BlobRef(id=ref.id, size=10**10, kind="weights", format="safetensors"))


class NaNUpdate(Rogue):
    def tamper(self, weights):
        name = sorted(weights)[0]
        weights[name] = weights[name].copy()
        weights[name].flat[0] = np.nan
        return weights


class WrongShape(Rogue):
    def tamper(self, weights):
        name = sorted(weights)[0]
        weights[name] = np.zeros((3, 3), np.float32)
        return weights


class ExtraRecord(Rogue):
    """Returns its model and an array record the task never asked for."""

    def send_result(self, task, ref):
        self.endpoint.send(SERVER, msgs.Result(task_id=task.task_id, round=task.round,
                                               arrays={"model": ref, "gradients": ref},
                                               metrics={"samples": len(self.y)}))


class NoModel(Rogue):
    """Returns the wrong record: its model under another name."""

    def send_result(self, task, ref):
        self.endpoint.send(SERVER, msgs.Result(task_id=task.task_id, round=task.round,
                                               arrays={"teacher": ref}, metrics={"samples": len(self.y)}))


class BadMessages(Rogue):
    """Sends malformed JSON and a result with a schema version from the future."""

    def _run_task(self, task, arrived):
        topic = self.endpoint.topics.up(self.config.device_id)
        self.endpoint.link.publish(topic, b"{this is not json")
        future = {"schema": 99, "type": "result", "task_id": task.task_id, "round": task.round}
        self.endpoint.link.publish(topic, json.dumps(future).encode())


def test_bad_input_is_rejected_and_the_round_goes_on(mosquitto, tmp_path):
    fleet = Fleet(mosquitto.address, tmp_path)
    honest = ["good0", "good1"]
    rogue_classes = {"corrupt": RecordingAgent, "liar": LyingBlob, "huge": Oversized, "nan": NaNUpdate,
                     "shape": WrongShape, "badmsg": BadMessages, "extra": ExtraRecord, "nomodel": NoModel}
    paths = fleet.write_data(honest + list(rogue_classes), "iid")
    intruder = None
    try:
        for dev in honest:
            fleet.start_process(dev, paths[dev])
        agents = {}
        for dev, cls in rogue_classes.items():
            config = fleet.agent_config(dev, paths[dev])
            endpoint = None
            if dev == "corrupt":
                endpoint = CorruptingEndpoint(fleet.broker, FleetTopics(fleet.fleet),
                                              BlobStore(config.work_dir / "blobs"), device_id=dev)
            agents[dev] = fleet.start_thread(cls(config, endpoint=endpoint))
        # Checks 1-8 judge only the result message, which a forger could publish: those rejections
        # leave the task open (protocol §10.2), so each round here lasts its deadline. 30 s is
        # ~10x what the honest devices need.
        loop = fleet.server(rounds=2, round_timeout_s=30)
        loop.start()
        assert loop.grid.wait_for_devices(len(paths), timeout_s=120) == len(paths)

        # A device the fleet does not know talks to the server.
        intruder = Endpoint(fleet.broker, FleetTopics(fleet.fleet), BlobStore(tmp_path / "intruder"),
                            device_id="intruder").start()
        intruder.send(SERVER, msgs.Hello(device_id="intruder", runtimes=["torch"], num_samples=5, profile={}))

        rows = loop.run()
    finally:
        fleet.close()
        if intruder:
            intruder.close()

    registry = fleet.registry
    # Every round completed with the honest updates (and the corrupted-once one, re-fetched).
    assert [r["accepted"] for r in rows] == [3, 3]
    assert registry.count_updates() == 6
    assert {u["device_id"] for u in registry.updates(1)} == {"good0", "good1", "corrupt"}
    assert fleet.endpoint.corrupt_chunks >= 1
    assert agents["corrupt"].acks == 2  # every accepted update was acknowledged, none lost
    assert rows[-1]["accuracy"] > 0.5

    codes = {(r["device_id"], r["code"]) for r in registry.rejections()}
    expected = {("liar", "checksum_mismatch"), ("huge", "too_large"), ("nan", "non_finite"),
                ("shape", "shape_mismatch"), ("badmsg", "malformed"), ("badmsg", "unsupported_schema"),
                ("intruder", "unknown_device"), ("extra", "unexpected_record"), ("nomodel", "missing_record")}
    assert expected <= codes, codes
    # the misbehaving devices were told why, in words
    for dev, code in [("liar", "checksum_mismatch"), ("huge", "too_large"), ("nan", "non_finite"),
                      ("shape", "shape_mismatch"), ("badmsg", "unsupported_schema"),
                      ("extra", "unexpected_record"), ("nomodel", "missing_record")]:
        details = " ".join(f"{e.code} {e.detail}" for e in agents[dev].errors)
        assert code in details, (dev, details)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not any(
            i.message and i.message.TYPE == "error" for i in list(intruder.inbox.queue)):
        time.sleep(0.1)
    intruder_errors = [i.message for i in list(intruder.inbox.queue) if i.message is not None]
    assert any(getattr(m, "code", "") == "unknown_device" for m in intruder_errors)
