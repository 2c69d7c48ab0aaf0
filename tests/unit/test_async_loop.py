"""The async loop's bookkeeping on a scripted grid (no MQTT; the maths is in test_async_buffer):
devices train at their own pace, every K updates make a version, stale ones are dropped and
counted, and a resumed loop folds the updates accepted after its last checkpoint."""

from __future__ import annotations

import numpy as np

from fedcore.recipe import Recipe
from server_toolkit.methods import method_class
from server_toolkit.methods.base import ClientUpdate, DeviceInfo, TrainInstruction
from server_toolkit.models.zoo import model_spec
from server_toolkit.rounds.async_grid import Arrival, AsyncGrid
from server_toolkit.rounds.async_loop import AsyncConfig, AsyncLoop
from server_toolkit.rounds.loop import LoopConfig

SPEC = model_spec("mlp", (1, 4, 4), 3)


class ScriptedGrid(AsyncGrid):
    """Device i answers its task ``pace[i]`` calls of ``arrivals`` after it got it, with the
    weights it was sent plus 1.0 (a delta of exactly 1 everywhere)."""

    def __init__(self, pace: dict[str, int]) -> None:
        self.pace = pace
        self.tasks: dict[str, tuple[int, TrainInstruction, int]] = {}  # device -> (base, instruction, due)
        self.calls = 0
        self.accepted: list[Arrival] = []  # every arrival handed out, in order
        self.versions: list[int] = []

    def online(self) -> list[DeviceInfo]:
        return [DeviceInfo(d, 10) for d in sorted(self.pace)]

    def idle(self) -> list[DeviceInfo]:
        return [d for d in self.online() if d.device_id not in self.tasks]

    def open_version(self, version: int) -> None:
        self.versions.append(version)

    def submit(self, version: int, instructions: list[TrainInstruction], timeout_s: float) -> None:
        for ins in instructions:
            self.tasks[ins.device_id] = (version, ins, self.calls + self.pace[ins.device_id])

    def arrivals(self, timeout_s: float) -> list[Arrival]:
        self.calls += 1
        out = []
        for dev, (base, ins, due) in sorted(self.tasks.items()):
            if due <= self.calls:
                trained = {k: v + 1.0 for k, v in ins.weights.items()}
                out.append(Arrival(ClientUpdate(dev, 10, trained, {}, ins), base))
                del self.tasks[dev]
        self.accepted += out
        return out

    def recovered(self, consumed: int) -> list[Arrival]:
        return self.accepted[consumed:]

    def in_flight(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for base, _, _ in self.tasks.values():
            out[base] = out.get(base, 0) + 1
        return out


def _loop(grid: ScriptedGrid, rounds: int, run_dir, buffer: int = 2, max_staleness: int = 1) -> AsyncLoop:
    method = method_class("fedavg")(SPEC, Recipe())
    return AsyncLoop(method, grid, LoopConfig(rounds=rounds, norm_bound=None),
                     AsyncConfig(buffer, max_staleness), run_dir=run_dir)


def test_versions_fold_every_k_updates_and_stale_updates_are_dropped_and_counted(tmp_path):
    grid = ScriptedGrid({"fast1": 1, "fast2": 1, "slow": 7})
    loop = _loop(grid, rounds=9, run_dir=tmp_path)
    loop.start()
    start = loop.global_weights
    rows = loop.run()
    assert [r["version"] for r in rows] == list(range(1, 10)) and grid.versions == list(range(10))
    assert all(r["accepted"] == r["folded"] + r["dropped_stale"] and r["folded"] == 2 for r in rows)
    assert sum(r["dropped_stale"] for r in rows) >= 1  # the slow device's update is 3+ versions old
    assert all(r["staleness_max"] <= 1 for r in rows)
    taken = sum(r["accepted"] for r in rows)
    assert loop.consumed == taken == sum(r["folded"] + r["dropped_stale"] for r in rows)
    # every folded delta is exactly 1, weighted 1 (fresh) or 1/sqrt(2) (staleness 1)
    moved = float(np.mean(loop.global_weights[next(iter(start))] - start[next(iter(start))]))
    expected = sum(1.0 - r["staleness_mean"] * (1 - 2 ** -0.5) for r in rows)  # K = 2, staleness 0 or 1
    assert abs(moved - expected) < 1e-5


def test_a_resumed_loop_folds_the_updates_accepted_after_its_last_checkpoint(tmp_path):
    grid = ScriptedGrid({"a": 1, "b": 1, "c": 1})
    loop = _loop(grid, rounds=2, run_dir=tmp_path, buffer=2, max_staleness=5)
    loop.start()
    rows = loop.run()
    left = len(grid.accepted) - loop.consumed
    assert left >= 1 and rows[-1]["buffered"] == left  # three answered at once, K = 2
    grid.tasks.clear()  # a restart: the old instance's tasks are refused (round_closed)
    resumed = _loop(grid, rounds=3, run_dir=tmp_path, buffer=2, max_staleness=5)
    resumed.start(resume=True)
    assert resumed.completed_round == 2 and resumed.consumed == loop.consumed
    more = resumed.run()
    assert more[0]["version"] == 3 and resumed.consumed >= loop.consumed + left


def test_eval_every_evaluates_every_nth_version_and_the_last(tmp_path):
    grid = ScriptedGrid({"a": 1, "b": 1})
    method = method_class("fedavg")(SPEC, Recipe())
    seen: list[int] = []

    def evaluate(version: int, weights: dict) -> dict:
        seen.append(version)
        return {"ev": 1}

    loop = AsyncLoop(method, grid, LoopConfig(rounds=7, norm_bound=None), AsyncConfig(2, 1, eval_every=3),
                     run_dir=tmp_path, evaluators=(evaluate,))
    loop.start()
    rows = loop.run()
    assert seen == [3, 6, 7] and [r["version"] for r in rows if "ev" in r] == [3, 6, 7]
