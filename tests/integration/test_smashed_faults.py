"""Smashed data over a real mosquitto: a group round of an edge's round loop asks every
device for the inputs of its last linear layer. An honest device process sends them;
rogue devices (threads) send smashed data of the wrong width, with NaN, with labels out of
range, or too large, and one tries to point the server at another blob through its
metrics. Each bad one is rejected with its code; the round goes on."""

from __future__ import annotations

import numpy as np
import pytest

from fedcore import modelspec
from fedcore.torch_model import build_model, state_numpy
from sdk_device.protocol import messages as msgs
from sdk_device.protocol.blobs import decode_tensors, encode_tensors
from sdk_device.transport.endpoint import SERVER
from server_toolkit.methods.base import TrainInstruction
from server_toolkit.methods.fedconv.relay import EdgeOptions, EdgeRelay, ForwardedTask
from server_toolkit.models.zoo import model_spec
from server_toolkit.rounds.loop import LoopConfig, RoundLoop
from server_toolkit.rounds.mqtt_grid import MqttGrid

from .harness import RECIPE, Fleet
from .test_faults import RecordingAgent

pytestmark = pytest.mark.integration
SAMPLES = 16


class SmashedRogue(RecordingAgent):
    """Returns the weights it got, plus the smashed data ``smashed(task)`` makes."""

    def smashed(self, task: msgs.Task) -> tuple[np.ndarray, np.ndarray]:
        return np.zeros((4, 64), np.float32), np.zeros(4, np.int64)

    def metrics(self) -> dict:
        return {"samples": len(self.y)}

    def _run_task(self, task: msgs.Task, arrived: float) -> None:
        weights = decode_tensors(self.endpoint.fetch(SERVER, task.arrays["model"]))
        ref = self.endpoint.offer(SERVER, encode_tensors(weights), "weights", "safetensors")
        x, y = self.smashed(task)
        smashed = self.endpoint.offer(SERVER, encode_tensors({"x": x, "y": y}), "weights", "safetensors")
        arrays = {"model": ref, "features": smashed}
        self.endpoint.send(SERVER, msgs.Result(task_id=task.task_id, round=task.round, arrays=arrays,
                                               metrics=self.metrics()))


class Narrow(SmashedRogue):
    def smashed(self, task):
        return np.zeros((4, 63), np.float32), np.zeros(4, np.int64)


class NaNs(SmashedRogue):
    def smashed(self, task):
        return np.full((4, 64), np.nan, np.float32), np.zeros(4, np.int64)


class BadLabels(SmashedRogue):
    def smashed(self, task):
        return np.zeros((4, 64), np.float32), np.array([0, 1, 2, 10])


class TooMany(SmashedRogue):
    def smashed(self, task):
        asked = task.config["report"]["features"]["samples"]
        return np.zeros((asked + 1, 64), np.float32), np.zeros(asked + 1, np.int64)


class Pointer(SmashedRogue):
    """Valid smashed data, and a metrics key that would name other blobs the server holds."""

    def metrics(self):
        return {"samples": len(self.y), "arrays": {"features": "0" * 64}}


def test_bad_smashed_data_is_rejected_and_the_round_goes_on(mosquitto, tmp_path, one_torch_thread):
    fleet = Fleet(mosquitto.address, tmp_path)
    rogues = {"narrow": Narrow, "nans": NaNs, "labels": BadLabels, "toomany": TooMany, "pointer": Pointer}
    paths = fleet.write_data(["good", *rogues], "iid")
    spec = model_spec("small_cnn", fleet.data.input_shape, fleet.data.num_classes)
    relay = EdgeRelay(EdgeOptions(smashed_samples=SAMPLES))
    weights = state_numpy(build_model(spec, seed=0))
    relay.forward(ForwardedTask(TrainInstruction("", spec, weights, RECIPE,
                                                 programs=((modelspec.FORMAT, modelspec.dumps(spec)),))))
    grid = MqttGrid(fleet.endpoint, fleet.registry)
    loop = RoundLoop(relay, grid, LoopConfig(rounds=1, round_timeout_s=90), run_dir=tmp_path / "edge")
    try:
        fleet.start_process("good", paths["good"])
        agents = {dev: fleet.start_thread(cls(fleet.agent_config(dev, paths[dev])))
                  for dev, cls in rogues.items()}
        loop.start()
        assert grid.wait_for_devices(len(paths), timeout_s=120) == len(paths)
        loop.global_weights = weights
        row = loop.run_round(1)
    finally:
        grid.close()
        fleet.close()

    assert row["accepted"] == 2  # the honest device and the pointer (its key is dropped)
    updates = {u["device_id"]: u for u in fleet.registry.updates(1)}
    assert set(updates) == {"good", "pointer"}
    pointer = updates["pointer"]["metrics"]["arrays"]["features"]
    assert pointer != "0" * 64 and decode_tensors(fleet.endpoint.store.get(pointer))["x"].shape == (4, 64)
    good = decode_tensors(fleet.endpoint.store.get(updates["good"]["metrics"]["arrays"]["features"]))
    assert good["x"].shape == (SAMPLES, 64) and good["x"].dtype == np.float32
    assert (good["x"] >= 0).all()  # small_cnn's last linear layer follows a ReLU
    assert set(good["y"].tolist()) <= set(range(10))
    codes = {(r["device_id"], r["code"]) for r in fleet.registry.rejections(1)}
    assert codes == {("narrow", "shape_mismatch"), ("nans", "non_finite"), ("labels", "invalid_field"),
                     ("toomany", "shape_mismatch")}, codes
    for dev, code in codes:  # each was told why
        assert code in {e.code for e in agents[dev].errors}, dev
