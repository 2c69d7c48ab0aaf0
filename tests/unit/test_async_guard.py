"""The quality guard in async mode: devices that really train (torch, digits, an MLP) answer a
scripted async grid; the devices' lr goes far too high (5.0) after version 3, the model collapses, the guard
rolls the global model back to the best version, halves the lr every later task carries, and
drops the updates still trained from versions before the rollback."""

from __future__ import annotations

import dataclasses

import numpy as np
from safetensors.numpy import load_file

from fedcore.recipe import Recipe
from server_toolkit.data.datasets import load_dataset
from server_toolkit.methods import method_class
from server_toolkit.methods.base import DeviceInfo, TrainInstruction
from server_toolkit.models.zoo import model_spec
from server_toolkit.rounds.async_grid import Arrival, AsyncGrid
from server_toolkit.rounds.async_loop import AsyncConfig, AsyncLoop
from server_toolkit.rounds.local_device import LocalDevice, TorchRuntimePool, train_on_device
from server_toolkit.rounds.loop import LoopConfig
from server_toolkit.sim.partition import partition
from server_toolkit.torch_utils import one_torch_thread

BAD_LR = 5.0


class TrainingGrid(AsyncGrid):
    """Device d trains its task on its own data and answers ``pace[d]`` calls of ``arrivals``
    after it got it; every task's recipe lr is recorded with its base version."""

    def __init__(self, devices: list[LocalDevice], pace: dict[str, int]) -> None:
        self.devices = {d.info.device_id: d for d in devices}
        self.pace, self.calls, self.runtimes = pace, 0, TorchRuntimePool()
        self.tasks: dict[str, tuple[int, TrainInstruction, int]] = {}
        self.lrs: list[tuple[int, float]] = []  # (base version, recipe lr) per task

    def online(self) -> list[DeviceInfo]:
        return [d.info for _, d in sorted(self.devices.items())]

    def idle(self) -> list[DeviceInfo]:
        return [d for d in self.online() if d.device_id not in self.tasks]

    def open_version(self, version: int) -> None:
        pass

    def submit(self, version: int, instructions: list[TrainInstruction], timeout_s: float) -> None:
        for ins in instructions:
            self.tasks[ins.device_id] = (version, ins, self.calls + self.pace[ins.device_id])
            self.lrs.append((version, ins.recipe.lr))

    def arrivals(self, timeout_s: float) -> list[Arrival]:
        self.calls += 1
        due = [(dev, base, ins) for dev, (base, ins, at) in sorted(self.tasks.items()) if at <= self.calls]
        for dev, _, _ in due:
            del self.tasks[dev]
        return [Arrival(train_on_device(self.devices[dev], ins, self.runtimes), base)
                for dev, base, ins in due]

    def recovered(self, consumed: int) -> list[Arrival]:
        return []

    def in_flight(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for base, _, _ in self.tasks.values():
            out[base] = out.get(base, 0) + 1
        return out


def test_async_mode_rolls_a_collapse_back_and_drops_updates_trained_before_it(tmp_path):
    data = load_dataset("digits", seed=0)
    parts = [p[:150] for p in partition(data.y_train, 4, "iid", seed=0)]  # small: a fast test
    devices = [LocalDevice(DeviceInfo(f"d{i}", len(p), None), data.x_train[p], data.y_train[p])
               for i, p in enumerate(parts)]
    grid = TrainingGrid(devices, {"d0": 1, "d1": 1, "d2": 1, "d3": 3})
    spec = model_spec("mlp", data.input_shape, data.num_classes)
    method = method_class("fedavg")(spec, Recipe(epochs=1, batch_size=16, lr=0.05, momentum=0.9))

    def on_round(row: dict) -> None:
        if row["version"] == 3:
            method.recipe = dataclasses.replace(method.recipe, lr=BAD_LR)

    loop = AsyncLoop(method, grid, LoopConfig(rounds=10, norm_bound=None, keep_checkpoints=20),
                     AsyncConfig(buffer=2, max_staleness=10), run_dir=tmp_path,
                     test_data=(data.x_test, data.y_test), on_round=on_round)
    loop.start()
    with one_torch_thread():
        rows = loop.run()
    events = [r for r in rows if "divergence" in r]
    assert events, [r["accuracy"] for r in rows]
    first = events[0]
    version, best = first["version"], first["divergence"]["best_round"]
    assert best <= 4 < version and first["divergence"]["action"].startswith("rollback 1/3")
    assert all(r["accuracy"] < 0.5 * first["divergence"]["best_accuracy"] for r in rows[version - 3:version])
    # the checkpoint of the rollback's version holds the best weights, as best.safetensors does
    kept = load_file(str(tmp_path / "checkpoints" / "best.safetensors"))
    if loop.guard.best_round == best:
        after = load_file(str(tmp_path / "checkpoints" / f"global_r{version:04d}.safetensors"))
        assert all(np.array_equal(kept[k], after[k]) for k in kept)
    later = {lr for base, lr in grid.lrs if base >= version}
    assert later and later <= {BAD_LR * s for s in (0.5, 0.25, 0.125)}
    assert {lr for base, lr in grid.lrs if base < 3} == {0.05}
    dropped = sum(r["dropped_stale"] for r in rows if r["version"] > version)
    assert dropped >= 1  # the slow device's task from before the rollback
    assert loop.guard.summary(tmp_path)["guard"]["rollbacks"] == len(events)
