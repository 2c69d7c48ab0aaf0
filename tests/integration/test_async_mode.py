"""``--mode async`` over a real mosquitto: a straggler, a device killed mid-run, a restart.

A simulation (the ``simulate`` code path: device processes, the async MQTT grid and loop,
metrics.jsonl) of 4 digits devices, one of them 3x slower, K = 2, S = 1. After version 2 a
device is killed (SIGKILL); the run goes on with the others. Then the run is resumed for two
more versions. Checked: every result a device saw acknowledged is an update the server
persisted; every update the loop took was folded into a version or counted as dropped for
staleness (per row, and over the run against the checkpoint's count); after the restart the
updates accepted but not yet folded before it are folded too; metrics.jsonl has the versions
and staleness of each aggregation.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
from pathlib import Path

import pytest

from fedcore.recipe import Recipe
from server_toolkit.sim.simulate import Simulation, SimulationConfig

pytestmark = pytest.mark.integration

ACK = re.compile(r"server accepted the result of task ([0-9a-f]{8})")


def _config(broker_url: str, rounds: int) -> SimulationConfig:
    return SimulationConfig(method="fedavg", dataset="digits", devices=4, rounds=rounds, partition="iid",
                            recipe=Recipe(epochs=1, batch_size=16, lr=0.05, momentum=0.9).to_dict(),
                            round_timeout_s=20.0, fleet_timeout_s=60.0, broker_url=broker_url,
                            fleet="async-test", mode="async", buffer=2, max_staleness=1,
                            slow_devices=0.25, slowdown=3.0)


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]


def _persisted_tasks(run_dir: Path) -> list[str]:
    with sqlite3.connect(run_dir / "registry.sqlite") as db:
        return [row[0] for row in db.execute("SELECT task_id FROM updates ORDER BY id")]


def _acked_tasks(run_dir: Path) -> list[str]:
    return [m.group(1) for log in sorted(run_dir.glob("devices/*/agent.log"))
            for m in ACK.finditer(log.read_text())]


def test_async_mode_loses_no_accepted_update_with_a_straggler_a_killed_device_and_a_restart(
        mosquitto, tmp_path):
    run_dir = tmp_path / "run"
    sim = Simulation(_config(mosquitto.url, rounds=5), run_dir)
    straggler = next(iter(sim.slow_device_ids()))
    victim = next(d for d in sim.device_ids() if d != straggler)
    killed = []

    def on_event(kind: str, data: dict) -> None:
        if kind == "round" and data["round"] == 2 and not killed:
            proc = sim.device_procs[sim.device_ids().index(victim)]
            os.kill(proc.pid, signal.SIGKILL)
            killed.append(proc.wait(timeout=10))

    sim.on_event = on_event
    sim.run()
    assert killed == [-signal.SIGKILL]
    assert sim.loop.guard is not None and (run_dir / "checkpoints" / "best.safetensors").is_file()  # guarded
    rows = _rows(run_dir)
    assert [r["version"] for r in rows] == [1, 2, 3, 4, 5] == [r["round"] for r in rows]
    for row in rows:  # everything taken since the last version: folded now, or dropped as stale
        assert row["accepted"] == row["folded"] + row["dropped_stale"], row
        assert row["folded"] == 2 and 0 <= row["staleness_mean"] <= row["staleness_max"] <= 1, row
        assert 0.0 <= row["accuracy"] <= 1.0 and row["wall_s"] > 0
    # four devices trained version 0 at once and K = 2: two of those updates cannot be fresh
    assert any(r["staleness_max"] >= 1 for r in rows) or sum(r["dropped_stale"] for r in rows) >= 1
    state = json.loads((run_dir / "state.json").read_text())
    consumed = state["async"]["consumed"]
    assert consumed == sum(r["folded"] + r["dropped_stale"] for r in rows)
    persisted = _persisted_tasks(run_dir)
    acked = _acked_tasks(run_dir)
    assert acked and {t[:8] for t in persisted} >= set(acked)  # acknowledged => persisted
    assert consumed <= len(persisted)

    resumed = Simulation(_config(mosquitto.url, rounds=7), run_dir, resume=True)
    resumed.run()
    rows = _rows(run_dir)
    assert [r["version"] for r in rows] == [1, 2, 3, 4, 5, 6, 7]
    state = json.loads((run_dir / "state.json").read_text())
    assert state["async"]["consumed"] == sum(r["folded"] + r["dropped_stale"] for r in rows)
    assert state["async"]["consumed"] >= len(persisted)  # what run 1 accepted was all folded or dropped
    assert {t[:8] for t in _persisted_tasks(run_dir)} >= set(_acked_tasks(run_dir))
