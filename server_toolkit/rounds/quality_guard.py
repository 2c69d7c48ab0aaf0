"""The model-quality guard: keep the best global model, notice a collapse, and act on it.

The guard watches the server's own evaluation of the global model (``RoundLoop.evaluate_global``
on the test data: ``accuracy`` in 0..1, ``loss`` = mean cross-entropy per sample), one
evaluation per round (per evaluated version in async mode). A loop without test data (an edge
aggregator's group loop) has no guard.

Best: the evaluation with the highest accuracy (the lowest loss when there is no accuracy); its
weights are kept in memory and in ``checkpoints/best.safetensors`` (metadata: round, accuracy),
the method's state then (e.g. FedAvgM's server momentum) in ``checkpoints/best_state.json``;
``--resume`` reads both back. A rollback restores both.

Divergence rule (``DivergenceRule``; decisions):

* a non-finite loss or accuracy (NaN, inf): diverged at once;
* else an evaluation is *bad* when accuracy < ``accuracy_fraction`` (0.5) x the best accuracy,
  or loss > ``loss_factor`` (10) x the best loss *and* > the best loss + ``loss_margin`` (1.0);
* ``patience`` (3) bad evaluations in a row: diverged.

Why these numbers: a collapse to chance (0.99 -> 0.10 on 10 classes, loss 0.03 -> 2.3) is bad
on both counts and fires on its 3rd evaluation; the noise of small non-IID runs (digits, 8
devices, 20 rounds: a dip of a few points, or one round at 60 % of the best after a bad
round) is never 3 evaluations in a row below half the best. The loss rule needs both the
factor and the margin so that a loss going 0.02 -> 0.3 (over-confident but accurate) is not bad.

Actions (``--on-divergence``): ``rollback`` (default) restores the best weights, multiplies
the devices' learning rate by ``lr_factor`` (0.5; ``RoundLoop._finish`` scales each task's
recipe ``lr``) and goes on; the ``max_rollbacks`` + 1-th (4th) divergence restores the best
weights and stops the run. ``stop`` stops the run at once (the weights are left as they are;
the best are in ``best.safetensors``). ``continue`` only records it (once per bad streak).
Every divergence is one WARNING log line and one record in ``events`` (summary.json's
``divergence``) and in the round's metrics row (``divergence``).

``verdict()`` (summary.json's ``status`` when the run got through its rounds): ``diverged``
when the guard stopped the run or the final model is bad (non-finite, or below
``accuracy_fraction`` x the best, even if fewer than ``patience`` evaluations were), else
``finished_without_learning`` when the model never learned, else ``finished_after_rollback``
after a rollback, else None (plain ``finished``).

Never learned (decision): after at least ``learn_within`` (5) evaluations with an accuracy, the
best accuracy is still at most ``chance_factor`` (1.5) x chance, chance = the share of the test
set's most common label (what a constant prediction scores: 0.1 on 10 balanced classes, so
best <= 0.15). A run that dies in its first round and a learning rate too small to move the
model both end there; neither is a success. Shorter runs are not judged (a 2-round smoke run
may not have left chance yet). One WARNING line says so when the summary is written.
"""

from __future__ import annotations

import ast
import json
import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from ..methods.base import Weights

log = logging.getLogger(__name__)

ACTIONS = ("rollback", "stop", "continue")
BEST_FILE = "best.safetensors"  # in the run's checkpoints/ directory
BEST_STATE_FILE = "best_state.json"  # the method's state_dict() of the best round, beside it


@dataclass(frozen=True)
class DivergenceRule:
    """When an evaluation is bad and how many bad ones in a row are a divergence (module docstring)."""

    accuracy_fraction: float = 0.5
    loss_factor: float = 10.0
    loss_margin: float = 1.0
    patience: int = 3
    lr_factor: float = 0.5
    max_rollbacks: int = 3
    chance_factor: float = 1.5
    learn_within: int = 5

    def judge(self, accuracy: float | None, loss: float | None, best_accuracy: float | None,
              best_loss: float | None) -> tuple[str, bool] | None:
        """(what is wrong with one evaluation, in words, and whether that is a divergence at once:
        a non-finite number), or None when it is fine."""
        for name, value in (("loss", loss), ("accuracy", accuracy)):
            if value is not None and not math.isfinite(value):
                return f"{name} is {value}", True
        if accuracy is not None and best_accuracy is not None and \
                accuracy < self.accuracy_fraction * best_accuracy:
            return f"accuracy {accuracy:.4f} < {self.accuracy_fraction:g} x best {best_accuracy:.4f}", False
        if loss is not None and best_loss is not None and loss > self.loss_factor * best_loss \
                and loss > best_loss + self.loss_margin:
            return f"loss {loss:.4f} > {self.loss_factor:g} x best {best_loss:.4f}", False
        return None


class QualityGuard:
    """The guard of one loop: ``observe`` each evaluation; then the loop reads ``restore`` (weights
    to put back, or None, and ``restore_state``, the method state to load with them), ``stop`` (why
    the run must end, or None) and ``lr_scale``."""

    def __init__(self, action: str = "rollback", run_dir: Path | None = None,
                 rule: DivergenceRule | None = None) -> None:
        if action not in ACTIONS:
            raise ValueError(f"unknown --on-divergence {action!r}; choose one of {', '.join(ACTIONS)}")
        self.action, self.rule = action, rule or DivergenceRule()
        self.best_path = Path(run_dir) / "checkpoints" / BEST_FILE if run_dir is not None else None
        self.best_round: int | None = None
        self.best_accuracy: float | None = None
        self.best_loss: float | None = None  # the lowest loss seen (not necessarily the best round's)
        self.best_weights: Weights | None = None
        self.best_method_state: dict = {}
        self.last: dict | None = None  # {"round", "accuracy", "bad"(, "rolled_back_to")}
        self.streak = 0  # bad evaluations in a row
        self.rollbacks = 0
        self.lr_scale = 1.0
        self.events: list[dict] = []
        self.stop: str | None = None
        self._fired = False  # continue: this bad streak was recorded
        self.rolled_back_at = 0  # the round (version) of the last rollback
        self.restore: Weights | None = None
        self.restore_state: dict = {}
        self.evaluated = 0  # evaluations with an accuracy
        self.chance: float | None = None  # a constant prediction's test accuracy (guard_summary sets it)

    # -- per evaluation ----------------------------------------------------------------------
    def observe(self, rnd: int, metrics: dict, weights: Weights, row: dict,
                method_state: Callable[[], dict] = dict) -> None:
        """Judge evaluation ``metrics`` of round ``rnd``'s global ``weights``; act by the rule
        (``method_state()``: the method's JSON-ready state, taken when the round is the best).
        Non-finite numbers in ``metrics`` and ``row`` become None (a metrics row holds finite
        numbers only); a divergence adds ``divergence`` to ``row``."""
        self.restore = None
        accuracy, loss = _number(metrics.get("accuracy")), _number(metrics.get("loss"))
        for where in (metrics, row):
            for key, value in list(where.items()):
                if isinstance(value, float | np.floating) and not math.isfinite(value):
                    where[key] = None
        if accuracy is None and loss is None:
            return
        self.evaluated += accuracy is not None
        found = self.rule.judge(accuracy, loss, self.best_accuracy, self.best_loss)
        self.last = {"round": rnd, "accuracy": accuracy, "bad": found is not None}
        if found is None:
            self.streak, self._fired = 0, False
            self._maybe_best(rnd, accuracy, loss, weights, method_state)
            return
        why, at_once = found
        self.streak += 1
        if (at_once or self.streak >= self.rule.patience) and not self._fired:
            self._diverged(rnd, why, row)

    def _maybe_best(self, rnd: int, accuracy: float | None, loss: float | None, weights: Weights,
                    method_state: Callable[[], dict]) -> None:
        if loss is not None:
            self.best_loss = loss if self.best_loss is None else min(self.best_loss, loss)
        if accuracy is None:
            better = self.best_round is None or (loss is not None and loss <= self.best_loss)
        else:
            better = self.best_accuracy is None or accuracy > self.best_accuracy
        if not better:
            return
        self.best_round, self.best_accuracy = rnd, accuracy
        self.best_weights = {k: np.array(v, copy=True) for k, v in weights.items()}
        state_text = json.dumps(method_state())  # a copy, whatever the method keeps a reference to
        self.best_method_state = json.loads(state_text)
        if self.best_path is not None:
            self.best_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.best_path.with_suffix(".tmp")
            save_file(self.best_weights, str(tmp), metadata={"round": str(rnd), "accuracy": repr(accuracy)})
            os.replace(tmp, self.best_path)
            state_path = self.best_path.with_name(BEST_STATE_FILE)
            tmp = state_path.with_suffix(".tmp")
            tmp.write_text(state_text)
            os.replace(tmp, state_path)

    def _diverged(self, rnd: int, why: str, row: dict) -> None:
        """Record the divergence, log it, and decide the loop's next step."""
        can_restore = self.best_weights is not None
        if self.action == "rollback" and can_restore and self.rollbacks < self.rule.max_rollbacks:
            self.rollbacks += 1
            self.lr_scale *= self.rule.lr_factor
            action = f"rollback {self.rollbacks}/{self.rule.max_rollbacks}: best weights restored, " \
                     f"device lr x {self.lr_scale:g}"
            self._put_back(rnd)
        elif self.action == "continue":
            action = "continue (--on-divergence continue)"
            self._fired = True  # once per bad streak
        elif self.action == "rollback" and can_restore:
            action = f"stop after {self.rollbacks} rollbacks: best weights restored"
            self._put_back(rnd)
        else:
            action = "stop" if self.action == "stop" else "stop: no good model to roll back to"
        if action.startswith("stop"):
            self.stop = f"the model diverged at round {rnd} ({why}); run stopped"
        event = {"round": rnd, "metric": why, "best_round": self.best_round,
                 "best_accuracy": self.best_accuracy, "action": action}
        self.events.append(event)
        row["divergence"] = event
        best = f"{self.best_accuracy:.4f}" if self.best_accuracy is not None else "none"
        log.warning("model diverged at round %d: %s (%d bad evaluation(s) in a row; best accuracy %s at "
                    "round %s); %s", rnd, why, self.streak, best, self.best_round, action)
        if self.action != "continue":
            self.streak = 0

    def _put_back(self, rnd: int) -> None:
        self.rolled_back_at = rnd
        self.restore = {k: np.array(v, copy=True) for k, v in (self.best_weights or {}).items()}
        self.restore_state = json.loads(json.dumps(self.best_method_state))
        self.last = {"round": rnd, "accuracy": self.best_accuracy, "bad": False,
                     "rolled_back_to": self.best_round}

    # -- run summary -------------------------------------------------------------------------
    def verdict(self) -> str | None:
        """``diverged``, ``finished_without_learning``, ``finished_after_rollback`` or None
        (module docstring)."""
        if self.stop or (self.last is not None and self.last["bad"]):
            return "diverged"
        if self.never_learned():
            return "finished_without_learning"
        return "finished_after_rollback" if self.rollbacks else None

    def never_learned(self) -> bool:
        """The best accuracy is still near chance after ``learn_within`` evaluations (module docstring)."""
        return (self.chance is not None and self.best_accuracy is not None
                and self.evaluated >= self.rule.learn_within
                and self.best_accuracy <= self.rule.chance_factor * self.chance)

    def summary(self, run_dir: Path | None) -> dict:
        """summary.json's ``guard``, ``best``, ``last`` and ``divergence`` entries (paths relative
        to the run directory)."""
        out: dict = {"guard": {"on_divergence": self.action, "rollbacks": self.rollbacks,
                               "lr_scale": self.lr_scale, "verdict": self.verdict()}}
        if self.best_round is not None:
            out["best"] = {"round": self.best_round, "accuracy": self.best_accuracy,
                           "path": f"checkpoints/{BEST_FILE}" if self.best_path is not None else None}
        if self.last is not None:
            last = {k: v for k, v in self.last.items() if k != "bad"}
            name = f"checkpoints/global_r{self.last['round']:04d}.safetensors"
            last["path"] = name if run_dir is not None and (Path(run_dir) / name).is_file() else None
            out["last"] = last
        if self.events:
            out["divergence"] = self.events
        return out

    # -- checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"best_round": self.best_round, "best_accuracy": self.best_accuracy,
                "best_loss": self.best_loss, "last": self.last, "streak": self.streak,
                "rollbacks": self.rollbacks, "lr_scale": self.lr_scale, "events": self.events,
                "fired": self._fired, "rolled_back_at": self.rolled_back_at, "evaluated": self.evaluated}

    def load_state_dict(self, state: dict) -> None:
        """Back from a checkpoint's state; the best weights from ``best.safetensors``."""
        for key in ("best_round", "best_accuracy", "best_loss", "last", "streak", "rollbacks",
                    "lr_scale", "events", "rolled_back_at", "evaluated"):
            if key in state:
                setattr(self, key, state[key])
        self._fired = bool(state.get("fired", False))
        if self.best_path is not None and self.best_path.is_file():  # it may be a round newer than state
            self.best_weights = load_file(str(self.best_path))
            with safe_open(str(self.best_path), "np") as f:
                meta = f.metadata() or {}
            if "round" in meta:
                self.best_round = int(meta["round"])
                self.best_accuracy = _number(ast.literal_eval(meta.get("accuracy", "None")))
            state_path = self.best_path.with_name(BEST_STATE_FILE)
            self.best_method_state = json.loads(state_path.read_text()) if state_path.is_file() else {}


def _number(value) -> float | None:
    """A metric as a float (None when it is missing or not a number)."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.floating | np.integer):
        return None
    return float(value)


def chance_accuracy(labels: np.ndarray) -> float | None:
    """The accuracy of always predicting the most common of ``labels`` (N,) (None when empty)."""
    labels = np.asarray(labels).reshape(-1)
    if labels.size == 0:
        return None
    return float(np.unique(labels, return_counts=True)[1].max() / labels.size)


def guard_summary(loop) -> dict:
    """The guard's entries of a run's summary.json from its round loop ({} without a guard);
    a run that never learned gets its one warning line here."""
    guard = getattr(loop, "guard", None)
    if guard is None:
        return {}
    if guard.chance is None and getattr(loop, "test_data", None) is not None:
        guard.chance = chance_accuracy(loop.test_data[1])
    if guard.verdict() == "finished_without_learning":
        log.warning("the model never learned: best test accuracy %.4f after %d evaluations, chance %.4f "
                    "(a constant prediction); check the data, the labels and --lr", guard.best_accuracy,
                    guard.evaluated, guard.chance)
    return guard.summary(loop.run_dir)
