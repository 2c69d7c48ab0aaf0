"""The quality guard's rule on metric sequences (the rule is arithmetic on the server's
evaluations, so synthetic sequences are its inputs): noise never fires, a collapse fires after
``patience`` evaluations, a NaN at once; the actions, the best file and the state survive a restart;
an edge's group loop (no test data) has no guard."""

from __future__ import annotations

import json
import math
import random
import time
from types import SimpleNamespace

import numpy as np
import pytest

from fedcore.recipe import Recipe
from server_toolkit.edge.aggregator import EdgeAggregator, EdgeConfig
from server_toolkit.fleet.registry import FleetRegistry
from server_toolkit.methods import method_class
from server_toolkit.methods.base import DeviceInfo
from server_toolkit.models.zoo import model_spec
from server_toolkit.observe import pages
from server_toolkit.observe.fleet_view import FleetView
from server_toolkit.observe.state import Snapshot
from server_toolkit.report.run_status import record_status
from server_toolkit.rounds.inprocess_grid import InProcessGrid
from server_toolkit.rounds.local_device import LocalDevice
from server_toolkit.rounds.loop import LoopConfig, RoundLoop
from server_toolkit.rounds.quality_guard import BEST_FILE, QualityGuard, chance_accuracy, guard_summary

WEIGHTS = {"w": np.zeros(3, dtype=np.float32)}


def feed(guard: QualityGuard, accuracies: list[float], losses: list[float] | None = None) -> list[dict]:
    """Each accuracy (and loss) as one round's evaluation of weights filled with the round number;
    the rows."""
    rows = []
    for rnd, acc in enumerate(accuracies, start=1):
        loss = losses[rnd - 1] if losses else -math.log(max(acc, 1e-3))
        row = {"round": rnd, "accuracy": acc, "loss": loss}
        guard.observe(rnd, dict(row), {"w": np.full(3, rnd, dtype=np.float32)}, row,
                      method_state=lambda rnd=rnd: {"velocity": [rnd]})
        if guard.restore is not None:  # the best round's weights and method state
            assert guard.restore["w"][0] == guard.best_round
            assert guard.restore_state == {"velocity": [guard.best_round]}
        rows.append(row)
        if guard.stop:
            break
    return rows


def fired(rows: list[dict]) -> list[int]:
    return [r["round"] for r in rows if "divergence" in r]


def test_the_noise_of_a_small_non_iid_run_never_fires():
    # digits, 8 devices, dirichlet 0.5, 20 rounds as measured, plus random dips of up to 30 %
    measured = [0.476, 0.836, 0.894, 0.939, 0.928, 0.958, 0.969, 0.969, 0.964, 0.969, 0.975, 0.978,
                0.981, 0.975, 0.981, 0.978, 0.981, 0.978, 0.978, 0.978]
    rng = random.Random(0)
    for _ in range(200):
        noisy = [a * (1 - 0.3 * rng.random()) if rng.random() < 0.3 else a for a in measured]
        guard = QualityGuard()
        rows = feed(guard, noisy)
        assert fired(rows) == [] and guard.verdict() is None
    # an early round far below a later best, once, between good ones: not a streak
    guard = QualityGuard()
    assert fired(feed(guard, [0.5, 0.2, 0.6, 0.25, 0.7, 0.3, 0.8])) == []


def test_a_collapse_fires_on_its_third_evaluation_and_rolls_back_with_half_the_lr():
    guard = QualityGuard("rollback")
    rows = feed(guard, [0.6, 0.9, 0.99, 0.99, 0.10, 0.10, 0.10, 0.95])
    assert fired(rows) == [7]
    event = rows[6]["divergence"]
    assert event["best_round"] == 3 and event["best_accuracy"] == 0.99
    assert event["action"].startswith("rollback 1/3")
    assert "accuracy 0.1000 < 0.5 x best 0.9900" == event["metric"]
    assert guard.lr_scale == 0.5 and guard.rollbacks == 1 and guard.rolled_back_at == 7
    assert guard.verdict() == "finished_after_rollback"


def test_a_nan_loss_fires_at_once_and_the_row_keeps_only_finite_numbers():
    guard = QualityGuard("rollback")
    rows = feed(guard, [0.5, 0.9, 0.1], losses=[1.0, 0.3, np.float32("nan")])  # torch gives numpy floats
    assert fired(rows) == [3] and rows[2]["loss"] is None and rows[2]["divergence"]["metric"] == "loss is nan"
    json.dumps(rows, allow_nan=False)  # a metrics row is strict JSON


def test_a_loss_far_above_its_best_is_bad_even_when_accuracy_holds():
    guard = QualityGuard("stop")
    rows = feed(guard, [0.9] * 6, losses=[0.3, 0.05, 2.0, 2.5, 3.0, 0.1])
    assert fired(rows) == [5] and guard.stop and "loss 3.0000 > 10 x best 0.0500" in guard.stop
    # over-confident but accurate (0.02 -> 0.3) is not bad: the margin of 1.0 is not crossed
    assert fired(feed(QualityGuard(), [0.9] * 6, losses=[0.3, 0.02, 0.3, 0.3, 0.3, 0.3])) == []


def test_the_fourth_divergence_restores_the_best_and_stops():
    guard = QualityGuard("rollback")
    rows = feed(guard, [0.9] + [0.1] * 20)
    assert fired(rows) == [4, 7, 10, 13] and guard.rollbacks == 3 and guard.lr_scale == 0.125
    assert rows[-1]["divergence"]["action"] == "stop after 3 rollbacks: best weights restored"
    assert guard.restore is not None and guard.verdict() == "diverged"


def test_stop_ends_at_once_and_continue_records_one_event_per_bad_streak():
    stop = QualityGuard("stop")
    rows = feed(stop, [0.9, 0.9, 0.1, 0.1, 0.1, 0.1])
    assert fired(rows) == [5] and len(rows) == 5 and stop.restore is None and stop.verdict() == "diverged"
    go_on = QualityGuard("continue")
    rows = feed(go_on, [0.9, 0.1, 0.1, 0.1, 0.1, 0.1, 0.9, 0.1, 0.1, 0.1])
    assert fired(rows) == [4, 10] and go_on.lr_scale == 1.0 and go_on.stop is None
    assert go_on.verdict() == "diverged"  # the final model is far below the best
    recovered = QualityGuard("continue")
    feed(recovered, [0.9, 0.1, 0.1, 0.1, 0.92])
    assert recovered.verdict() is None and recovered.events


def test_a_late_collapse_too_short_to_fire_still_marks_the_run(tmp_path):
    guard = QualityGuard("rollback", tmp_path)
    assert fired(feed(guard, [0.9, 0.95, 0.1])) == []
    assert guard.verdict() == "diverged"
    summary = guard.summary(tmp_path)
    assert summary["best"] == {"round": 2, "accuracy": 0.95, "path": f"checkpoints/{BEST_FILE}"}
    assert summary["last"] == {"round": 3, "accuracy": 0.1, "path": None}  # no checkpoint file here
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    assert record_status(tmp_path, "finished") == "diverged"
    assert record_status(tmp_path, "stopped") == "stopped"  # Ctrl-C says more than the guard


def test_the_best_weights_and_the_streak_survive_a_restart(tmp_path):
    guard = QualityGuard("rollback", tmp_path)
    feed(guard, [0.5, 0.8, 0.7, 0.2, 0.2])
    again = QualityGuard("rollback", tmp_path)
    again.load_state_dict(json.loads(json.dumps(guard.state_dict())))
    assert (again.best_round, again.best_accuracy, again.streak) == (2, 0.8, 2)
    assert again.best_weights is not None and again.best_weights["w"].tolist() == [2, 2, 2]
    row = {"round": 6, "accuracy": 0.2}
    again.observe(6, dict(row), WEIGHTS, row)
    assert row["divergence"]["best_round"] == 2 and again.restore["w"].tolist() == [2, 2, 2]
    assert again.restore_state == {"velocity": [2]}  # from checkpoints/best_state.json


def test_the_dashboard_shows_the_last_divergence_in_red():
    guard = QualityGuard()
    rows = feed(guard, [0.6, 0.99, 0.1, 0.1, 0.1])
    snap = Snapshot({"method": "fedavg"}, rows, FleetView(), None, "finished_after_rollback", time.time(), 5)
    html = pages.fragment(snap)
    assert "status <b>finished_after_rollback</b>" in html
    assert ('<p id="divergence" class="off"><b>model diverged 1 time(s); last at round 5: accuracy '
            "0.1000 &lt; 0.5 x best 0.9900 (best 0.9900 at round 2); rollback 1/3") in html
    assert 'id="divergence"' not in pages.fragment(Snapshot({}, rows[:2], FleetView(), None, "running",
                                                            time.time()))


def test_an_unknown_action_is_a_one_line_error():
    with pytest.raises(ValueError, match="--on-divergence 'pause'.*rollback, stop, continue"):
        QualityGuard("pause")


def test_a_loop_without_test_data_has_no_guard_and_leaves_the_lr_alone(tmp_path):
    spec = model_spec("mlp", (1, 8, 8), 10)
    device = LocalDevice(DeviceInfo("d0", 4, None), np.zeros((4, 1, 8, 8), np.float32), np.arange(4))
    loop = RoundLoop(method_class("fedavg")(spec, Recipe(lr=0.05)), InProcessGrid([device]),
                     LoopConfig(rounds=1), run_dir=tmp_path)
    assert loop.guard is None
    loop.start()
    (task,) = loop.method.configure_train(1, loop.global_weights, [device.info])
    assert loop._finish(1, task).recipe.lr == 0.05
    registry = FleetRegistry(tmp_path / "edge" / "registry.sqlite")
    registry.add_device("d0")
    registry.close()
    edge = EdgeAggregator(EdgeConfig("mqtt://127.0.0.1:1", "f", "edge-1", tmp_path / "edge", method="fedavg"))
    edge.registry.close()
    assert edge.group.guard is None  # an edge's group loop evaluates nothing: the server's guard acts


def test_a_run_whose_best_stays_at_chance_is_finished_without_learning_not_finished(tmp_path, caplog):
    labels = np.repeat(np.arange(10), 5)  # 10 balanced classes: chance 0.1, "never learned": best <= 0.15
    assert chance_accuracy(labels) == 0.1 and chance_accuracy(np.array([0, 0, 0, 1])) == 0.75
    at_chance = QualityGuard()
    feed(at_chance, [0.10, 0.12, 0.09, 0.14, 0.11, 0.10])
    loop = SimpleNamespace(guard=at_chance, run_dir=tmp_path, test_data=(np.zeros((50, 1)), labels))
    with caplog.at_level("WARNING"):
        summary = guard_summary(loop)
    assert summary["guard"]["verdict"] == "finished_without_learning"
    assert [r.message for r in caplog.records if "never learned" in r.message] == [
        "the model never learned: best test accuracy 0.1400 after 6 evaluations, chance 0.1000 "
        "(a constant prediction); check the data, the labels and --lr"]
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    assert record_status(tmp_path, "finished") == "finished_without_learning"
    # a slow learner that leaves chance, and a run too short to judge, are plain finished
    slow, short = QualityGuard(), QualityGuard()
    feed(slow, [0.10, 0.11, 0.12, 0.14, 0.16, 0.30])
    feed(short, [0.10, 0.11, 0.12, 0.10])
    for guard in (slow, short):
        assert guard_summary(SimpleNamespace(guard=guard, run_dir=None, test_data=(labels, labels))
                             )["guard"]["verdict"] is None
