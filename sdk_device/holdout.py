"""A device's held-back split: local samples it never trains on, to score the model it can deploy.

A task may carry ``holdout`` (protocol §5.4 ``task``): the fraction f of this device's samples
to keep back, 0 < f ≤ 0.5. Then, before training, the device evaluates the model it deploys
(``task.holdout_model``, else the one the task's last step trains), as received (completed
by the tensors the device keeps: its width window, exit prefix or personal model, i.e. what
it could deploy this round), on the held-back samples; reports ``holdout_accuracy`` (0..1,
final output), ``holdout_loss`` (mean cross-entropy per sample, null when not finite) and
``holdout_samples`` (int) among its result metrics; and trains (and computes its outputs,
e.g. ``label_counts``) on the rest only, so ``samples`` counts the training part.

With ``task.holdout_ensemble`` true (the server sets it for a method whose tiers deploy the
ensemble of their exits, e.g. DepthFL) the scored model's prediction is instead the mean of
the softmax of all its outputs (exits in order, then the final one; ``Runtime.outputs``), as
the server's ``ensemble_model_accuracy`` scores it: ``holdout_accuracy`` is the top-1 accuracy
of that mean and ``holdout_loss`` its mean negative log-likelihood per sample. A model with
one output scores the same either way.

With ``task.holdout_members`` (other models of the task, at most ``MAX_MEMBERS``, distinct; the
server lists them for a width method's ``deploy="nested"``: the narrower windows a tier predicts
with beside its own) the prediction is the mean softmax over the scored model and every member,
each contributing what it contributes alone: its final output, or with ``holdout_ensemble``
every one of its outputs. The mean is flat over all these softmax terms (a member with two
outputs weighs twice a member with one), exactly as the server's ``members_accuracy`` averages
(``server_toolkit/methods/tier_accuracy.py``); ``holdout_loss`` is that mean's NLL per sample.
The members are scored as received, before training, like the scored model.

Decisions: the split is stratified by label (each label holds back its share of the
``round(f·N)`` samples, largest remainders first, ties to the smaller label) and deterministic:
it depends only on the labels and f (a fixed seed, not the task's), so the same samples are
held back every round and never trained on while f stays the same. At least one sample is
left to train on; a device with fewer than 2 samples holds back nothing (and reports no
holdout keys). Devices that do not know the field (older agents, the C++ client) ignore it,
train on everything and report none of these keys; the server tolerates their absence.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

MAX_FRACTION = 0.5  # at most half the local data is held back
MAX_MEMBERS = 8  # task.holdout_members lists at most this many models (protocol/bounds.py)
SPLIT_SEED = 0  # the same split every round (never the task's seed)


def check_fraction(fraction: float) -> float:
    """``fraction`` as a float in [0, MAX_FRACTION] (0: no held-back split); ValueError otherwise."""
    if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not math.isfinite(fraction) \
            or not 0.0 <= fraction <= MAX_FRACTION:
        raise ValueError(f"holdout must be a fraction in 0..{MAX_FRACTION}, got {fraction!r}")
    return float(fraction)


def split_holdout(y: np.ndarray, fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """(training indices, held-back indices) into labels ``y`` (N,), both sorted; the held-back
    part has ``min(round(fraction·N), N − 1)`` samples, stratified by label (module docstring)."""
    fraction = check_fraction(fraction)
    y = np.asarray(y).astype(np.int64, copy=False).reshape(-1)
    n = len(y)
    want = min(int(math.floor(fraction * n + 0.5)), n - 1) if n >= 2 else 0
    if want <= 0:
        return np.arange(n), np.zeros(0, np.int64)
    labels, counts = np.unique(y, return_counts=True)
    quota = counts * (want / n)
    take = np.floor(quota).astype(np.int64)
    order = sorted(range(len(labels)), key=lambda i: (-(quota[i] - take[i]), labels[i]))
    for i in order[: want - int(take.sum())]:
        take[i] += 1
    rng = np.random.default_rng(SPLIT_SEED)
    held = [rng.permutation(np.flatnonzero(y == label))[:k] for label, k in zip(labels, take, strict=True)]
    held_idx = np.sort(np.concatenate(held)) if held else np.zeros(0, np.int64)
    mask = np.ones(n, bool)
    mask[held_idx] = False
    return np.flatnonzero(mask), held_idx


def check_members(members: list[str] | None, models: set[str], scored: str) -> tuple[str, ...]:
    """``task.holdout_members`` as a tuple (null: ()); ValueError unless they are distinct
    models of the task (``models``), none of them the ``scored`` one (at most ``MAX_MEMBERS``)."""
    names = tuple(members or ())
    if len(names) > MAX_MEMBERS or len(set(names)) != len(names) or not set(names) <= models - {scored}:
        raise ValueError(f"task.holdout_members must list at most {MAX_MEMBERS} distinct models of the task "
                         f"other than the scored {scored!r}, got {list(names)!r:.80}")
    return names


def ensemble_scores(outputs: list[np.ndarray], y: np.ndarray) -> tuple[float, float]:
    """(top-1 accuracy 0..1, mean negative log-likelihood per sample) on labels ``y`` (N,) of
    the mean of the softmax of ``outputs`` (logits (N, K) each); (0, 0) for no samples."""
    labels = np.asarray(y).astype(np.int64).reshape(-1)
    if len(labels) == 0:
        return 0.0, 0.0
    probs = np.zeros(np.shape(outputs[0]), np.float64)
    for logits in outputs:
        z = np.asarray(logits, np.float64)
        z = np.exp(z - z.max(axis=1, keepdims=True))
        probs += z / z.sum(axis=1, keepdims=True)
    probs /= len(outputs)
    with np.errstate(divide="ignore"):
        loss = -float(np.log(probs[np.arange(len(labels)), labels]).mean())
    return float((probs.argmax(axis=1) == labels).mean()), loss


def holdout_metrics(runtime, x: np.ndarray, y: np.ndarray, ensemble: bool = False,
                    members: Sequence = ()) -> dict:
    """``runtime``'s model (weights set, before training) scored on the held-back (x, y):
    ``holdout_accuracy``, ``holdout_loss`` (None when not finite), ``holdout_samples``. The
    final output's, or with ``ensemble`` the mean softmax of every output's; with ``members``
    (more runtimes, weights set) the flat mean softmax over all of them (module docstring)."""
    if members or ensemble:
        outputs = []
        for each in (runtime, *members):
            outs = list(each.outputs(x))
            outputs += outs if ensemble else outs[-1:]
        accuracy, loss = ensemble_scores(outputs, y)
    else:
        stats = runtime.evaluate(x, y)
        accuracy, loss = float(stats.accuracy), float(stats.loss)
    return {"holdout_accuracy": accuracy, "holdout_loss": loss if math.isfinite(loss) else None,
            "holdout_samples": int(len(y))}
