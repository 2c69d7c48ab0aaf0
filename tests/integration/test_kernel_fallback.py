"""A device whose runtime lacks the fused kernels gets the portable program (protocol §23.8).

Two real ``fedsdk run`` device processes on ``executorch-native`` over a real mosquitto; the
server offers ``pte/1`` programs of the fused kernel set (``pte_kernels="fused"``). One device
is an "old runtime": its kernels library path leads nowhere (``FEDSDK_KERNELS_LIB``), so it
cannot load ``libfedsdk_kernels``. It refuses its first task with ``unsupported_kernels``; the
server sends it the same work with the portable program in the same round, and only portable
programs after that. Both rounds complete with both updates.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from export.programs import ProgramCache
from fedcore.recipe import Recipe
from server_toolkit.methods.fedavg import FedAvg
from server_toolkit.models.zoo import model_spec

from ..unit.pte_cache import cached_programs  # noqa: F401 - provides the program_for fixture
from .harness import RECIPE, Fleet

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
OLD, NEW = "dev-old", "dev-new"


def _device(fleet: Fleet, dev: str, data_path: Path, tmp_path: Path, env: dict) -> subprocess.Popen:
    command = [sys.executable, "-m", "sdk_device.cli", "run", "--broker", fleet.broker.url,
               "--fleet", fleet.fleet, "--device-id", dev, "--data", str(data_path),
               "--work-dir", str(tmp_path / dev), "--runtime", "executorch-native", "--max-tasks", "2"]
    with open(tmp_path / f"{dev}.log", "wb") as log:
        return subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)


def test_an_old_runtime_refuses_the_fused_program_then_trains_the_portable_one(mosquitto, tmp_path,
                                                                                program_for):
    fleet = Fleet(mosquitto.address, tmp_path)
    spec = model_spec("small_cnn", fleet.data.input_shape, fleet.data.num_classes)
    recipe = Recipe(epochs=1, batch_size=RECIPE.batch_size, lr=RECIPE.lr)  # the programs of RECIPE's batch
    paths = fleet.write_data([OLD, NEW])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    devices = []
    old_runtime = {"FEDSDK_KERNELS_LIB": str(tmp_path / "no-such-libfedsdk_kernels.so")}
    for dev, extra in ((OLD, old_runtime), (NEW, {})):
        fleet.registry.add_device(dev)
        devices.append(_device(fleet, dev, paths[dev], tmp_path, {**env, **extra}))
    loop = fleet.server(rounds=2, method=FedAvg(spec, recipe), round_timeout_s=90)
    loop.grid.programs = ProgramCache(["pte/1"], kernels="fused")
    for kernels in ("fused", "portable"):  # exported once per session (program store), before the deadline
        loop.grid.programs.put(spec, recipe, "pte/1", program_for(spec, recipe.loss_dict(), recipe.batch_size,
                                                                  kernels=kernels), kernels=kernels)
    loop.start()
    try:
        assert loop.grid.wait_for_devices(2, timeout_s=60) == 2
        rows = [loop.run_round(1), loop.run_round(2)]
        for device in devices:
            assert device.wait(timeout=60) == 0
    finally:
        for device in devices:
            if device.poll() is None:
                device.kill()
        loop.grid.close()
        fleet.close()
    logs = {dev: (tmp_path / f"{dev}.log").read_text()[-2000:] for dev in (OLD, NEW)}
    assert all(r["accepted"] == 2 and not r["rejected"] for r in rows), (rows, logs)
    refusals = [(r["round"], r["device_id"], r["code"]) for r in fleet.registry.rejections()]
    assert refusals == [(1, OLD, "device:unsupported_kernels")], refusals  # once: round 2 was portable
    with sqlite3.connect(tmp_path / "server" / "registry.sqlite") as db:
        tasks = db.execute("SELECT round, device_id, task_id FROM tasks ORDER BY rowid").fetchall()
    old_tasks = [(rnd, task) for rnd, dev, task in tasks if dev == OLD]
    assert [rnd for rnd, _ in old_tasks] == [1, 1, 2]  # refused, sent again portable, portable
    for rnd in (1, 2):
        updates = {u["device_id"]: u for u in fleet.registry.updates(rnd)}
        assert updates[OLD]["task_id"] == old_tasks[rnd][1]  # the portable task's update
        assert {u["metrics"]["runtime"] for u in updates.values()} == {"executorch-native"}
        assert all(np.isfinite(u["metrics"]["loss"]) for u in updates.values())
    assert rows[-1]["accuracy"] >= 0.5, rows
