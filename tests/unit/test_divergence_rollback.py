"""A forced collapse in a real in-process simulation (digits, torch training): the devices' lr goes
from 0.05 to 0.3 after round 3, the model collapses to chance, the guard rolls back to the best
weights and halves the lr every task then carries; summary.json, ``runs list`` and a ``--resume``
keep the best, the last and the rollback."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
from click.testing import CliRunner
from safetensors.numpy import load_file

from fedcore.recipe import Recipe
from server_toolkit.cli.observe_options import observed
from server_toolkit.cli.runs import runs
from server_toolkit.observe.observers import RunObservers
from server_toolkit.rounds.inprocess_grid import InProcessGrid
from server_toolkit.sim.simulate import Simulation, SimulationConfig

BAD_LR = 0.3


def _config(rounds: int) -> SimulationConfig:
    return SimulationConfig(devices=4, rounds=rounds, partition="iid", grid="inprocess", seed=0,
                            recipe=Recipe(epochs=1, batch_size=16, lr=0.05, momentum=0.9).to_dict())


def test_a_collapse_is_rolled_back_with_half_the_lr_and_reported(tmp_path, monkeypatch, caplog):
    task_lrs: dict[int, set[float]] = {}
    exchange = InProcessGrid.exchange

    def recording(grid, rnd, instructions, deadline, quorum):
        task_lrs[rnd] = {ins.recipe.lr for ins in instructions}
        return exchange(grid, rnd, instructions, deadline, quorum)

    monkeypatch.setattr(InProcessGrid, "exchange", recording)
    run_dir = tmp_path / "runs" / "collapse"
    simulation: Simulation

    def on_event(kind: str, row: dict) -> None:
        if kind == "round" and row["round"] == 3:  # the fleet's lr becomes far too high
            method = simulation.loop.method
            method.recipe = dataclasses.replace(method.recipe, lr=BAD_LR)

    simulation = Simulation(_config(8), run_dir, on_event=on_event)
    with observed(RunObservers(), run_dir):
        simulation.run()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    best_before = max(r["accuracy"] for r in rows[:3])
    assert all(r["accuracy"] < 0.5 * best_before for r in rows[3:6])  # collapsed
    assert [r["round"] for r in rows if "divergence" in r] == [6]
    event = rows[5]["divergence"]
    assert event["action"].startswith("rollback 1/3") and event["best_round"] == 3
    assert "model diverged at round 6" in caplog.text and "WARNING" in [r.levelname for r in caplog.records
                                                                        if "diverged" in r.message]
    assert task_lrs[6] == {BAD_LR} and task_lrs[7] == task_lrs[8] == {BAD_LR * 0.5}
    assert [r.get("lr_scale") for r in rows[5:]] == [None, 0.5, 0.5]
    assert rows[-1]["accuracy"] > best_before  # the halved lr trains again

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "finished_after_rollback"
    assert summary["guard"] == {"on_divergence": "rollback", "rollbacks": 1, "lr_scale": 0.5,
                                "verdict": "finished_after_rollback"}
    assert summary["divergence"] == [rows[5]["divergence"]]
    best, last = summary["best"], summary["last"]
    assert (best["round"], best["accuracy"]) == (summary["best_round"], summary["best_accuracy"])
    assert last == {"round": 8, "accuracy": rows[-1]["accuracy"],
                    "path": "checkpoints/global_r0008.safetensors"}
    kept = load_file(str(run_dir / best["path"]))
    assert set(kept) == set(load_file(str(run_dir / last["path"])))
    if best["round"] == 8:
        assert all(np.array_equal(kept[k], v) for k, v in load_file(str(run_dir / last["path"])).items())

    listed = CliRunner().invoke(runs, ["list", str(tmp_path / "runs")])
    assert listed.exit_code == 0, listed.output
    line = listed.output.splitlines()[1].split()
    assert line[0] == "collapse" and line[-1] == "finished_after_rollback"
    assert line[-2] == f"{best['accuracy']:.4f}@{best['round']}"

    resumed = Simulation(_config(9), run_dir, resume=True)  # the guard's state comes back
    with observed(RunObservers(), run_dir):
        resumed.run()
    assert resumed.loop.guard.rollbacks == 1 and resumed.loop.guard.lr_scale == 0.5
    assert task_lrs[9] == {0.05 * 0.5}  # the stored recipe's lr, still halved
    again = json.loads((run_dir / "summary.json").read_text())
    assert again["best"]["round"] >= best["round"] and again["status"] == "finished_after_rollback"
    assert again["divergence"] == summary["divergence"] and (run_dir / best["path"]).is_file()
