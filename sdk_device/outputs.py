"""Extra outputs a task may ask a device for (``task.config.report``), by name: one registry.

=================  ===========  ==============================================================
name               kind         what the device sends
=================  ===========  ==============================================================
``label_counts``   metric       ``metrics.label_counts``: samples per label, ``[n_0, n_1, …]``
                                (up to the device's largest label); never the data itself.
                                With ``params.epsilon`` > 0 and ``params.classes``: all
                                ``classes`` counts, each with Laplace(1/epsilon) noise
                                (``sdk_device.privacy.noised_label_counts``).
``features``       array record ``arrays.features``: a safetensors record holding ``x`` (n, F)
                                float32, the inputs of the last linear layer of model
                                ``params.model`` (default ``"model"``) after training, for a
                                seeded random subset of n ≤ ``params.samples`` (1..4096) local
                                samples, and ``y`` (n,) int64, their labels (FedConv's smashed
                                data). A device may decline (``fedsdk run --no-smashed``), or
                                be unable to (a runtime without ``predict``): it then sends
                                no such record.
=================  ===========  ==============================================================

Sharing either tells the server more about the local data than weights do; a method asks
for them only when it needs them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .privacy import noised_label_counts
from .protocol.errors import ProtocolError

MAX_FEATURE_SAMPLES = 4096


@dataclass(frozen=True)
class OutputContext:
    """What an output is computed from: the local data, the task's loaded runtimes by model
    name, the seed of the task's last step, and whether this device shares features."""

    x: np.ndarray
    y: np.ndarray
    runtimes: dict
    seed: int
    share_features: bool = True


@dataclass(frozen=True)
class Output:
    """A registered output: ``kind`` "metric" (a JSON value in ``metrics.<name>``) or
    "arrays" (an array record ``arrays.<name>``); ``check`` validates its parameters;
    ``compute`` returns the value, or None when the device declines."""

    name: str
    kind: str
    check: Callable[[dict, set[str]], dict]
    compute: Callable[[OutputContext, dict], object]


def _check_label_counts(params: dict, models: set[str]) -> dict:
    if not params:
        return params
    epsilon, classes = params.get("epsilon"), params.get("classes")
    if set(params) != {"epsilon", "classes"} or not isinstance(epsilon, int | float) \
            or isinstance(epsilon, bool) or not 0 < epsilon < float("inf") or type(classes) is not int \
            or not 1 <= classes <= 100_000:
        raise ProtocolError("invalid_field", "label_counts takes nothing, or epsilon > 0 and classes "
                                             f"1..100000, got {params}")
    return {"epsilon": float(epsilon), "classes": classes}


def _label_counts(ctx: OutputContext, params: dict) -> list[int]:
    if params:
        return noised_label_counts(ctx.y, params["classes"], params["epsilon"])
    return np.bincount(ctx.y).tolist() if len(ctx.y) else []


def _check_features(params: dict, models: set[str]) -> dict:
    unknown = sorted(set(params) - {"model", "samples"})
    model, samples = params.get("model", "model"), params.get("samples")
    if unknown or model not in models or type(samples) is not int or not 1 <= samples <= MAX_FEATURE_SAMPLES:
        raise ProtocolError("invalid_field", "features needs a model of the task and "
                                             f"1..{MAX_FEATURE_SAMPLES} samples, got {params}")
    return {"model": model, "samples": samples}


def _features(ctx: OutputContext, params: dict) -> dict[str, np.ndarray] | None:
    runtime = ctx.runtimes.get(params["model"])
    predict = getattr(runtime, "predict", None)
    if not ctx.share_features or predict is None or not len(ctx.y):
        return None
    pick = np.sort(np.random.default_rng(ctx.seed).permutation(len(ctx.y))[: params["samples"]])
    out = predict(ctx.x[pick])  # (logits, features (n, F))
    if not (isinstance(out, tuple) and len(out) == 2):
        return None
    return {"x": np.asarray(out[1], np.float32).reshape(len(pick), -1), "y": ctx.y[pick].astype(np.int64)}


OUTPUTS: dict[str, Output] = {o.name: o for o in (
    Output("label_counts", "metric", _check_label_counts, _label_counts),
    Output("features", "arrays", _check_features, _features),
)}


def check_reports(reports: dict[str, dict], models: set[str]) -> dict[str, dict]:
    """Each asked output's parameters checked (ProtocolError ``unsupported_task`` for an
    output this device does not know, ``invalid_field`` for bad parameters)."""
    out = {}
    for name, params in reports.items():
        if name not in OUTPUTS:
            raise ProtocolError("unsupported_task", f"this device cannot report {name!r}")
        out[name] = OUTPUTS[name].check(params, models)
    return out
