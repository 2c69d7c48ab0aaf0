"""Training step time of a model on every runtime this device has (pairing, ``fedsdk bench``).

The model comes as programs by format (``torchspec/1`` among them) plus weights; each
installed runtime that can *train* one of the programs is timed over a few steps of the
recipe (batch size, optimizer) after one warm-up step (``runtimes.selftest``'s timer).
Inputs are the device's own samples when their shape fits the model, else random ones
(a step's time does not depend on the values). A runtime that fails gets its error in its
row instead of a time, and the others still run.

``REFERENCE_SPEC`` (a small CNN for 28x28 grey images, 10 classes, ~0.4 MFLOPs per
sample) is what ``fedsdk bench`` times when this device has seen no task of its fleet yet.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass

import numpy as np

from fedcore import modelspec
from fedcore.recipe import Recipe

from .profile import current_rss_mb, peak_rss_mb
from .runtimes.registry import available_runtimes, create_runtime, evaluation_only, formats_of

REFERENCE_SPEC = {
    "format": "torchspec/1",
    "input_shape": [1, 28, 28],
    "num_classes": 10,
    "layers": [
        {"op": "conv2d", "in": 1, "out": 16, "k": 3, "stride": 1, "pad": 1, "bias": True},
        {"op": "relu"},
        {"op": "maxpool2d", "k": 2},
        {"op": "conv2d", "in": 16, "out": 32, "k": 3, "stride": 1, "pad": 1, "bias": True},
        {"op": "relu"},
        {"op": "maxpool2d", "k": 2},
        {"op": "flatten"},
        {"op": "linear", "in": 1568, "out": 64},
        {"op": "relu"},
        {"op": "linear", "in": 64, "out": 10},
    ],
}


@dataclass(frozen=True)
class BenchRow:
    """One runtime's result: milliseconds per training step, or the error it raised."""

    runtime: str
    format: str
    ms_per_step: float | None
    error: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def trainable(programs: Collection[str], allowed: list[str] | None = None) -> dict[str, str]:
    """runtime -> program format, for the installed training runtimes that can run one of the
    program formats ``programs`` (any collection of format names, e.g. a dict keyed by them)."""
    out = {}
    for name in available_runtimes():
        if name in evaluation_only() or (allowed is not None and name not in allowed):
            continue
        fmt = next((f for f in formats_of(name) if f in programs), None)
        if fmt is not None:
            out[name] = fmt
    return out


def bench_inputs(
    spec: dict, count: int, x: np.ndarray | None = None, y: np.ndarray | None = None, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """``count`` samples for ``spec``: the device's own when they fit its input, else random."""
    shape = tuple(spec["input_shape"])
    k = spec["num_classes"]
    if x is not None and y is not None and len(y) and tuple(x.shape[1:]) == shape and int(y.max()) < k:
        reps = -(-count // len(y))
        return np.concatenate([x] * reps)[:count], np.concatenate([y] * reps)[:count]
    rng = np.random.default_rng(seed)
    return rng.standard_normal((count, *shape)).astype(np.float32), (np.arange(count) % k).astype(np.int64)


def initial_weights(spec: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded initial weights of ``spec`` (needs torch)."""
    from fedcore.torch_model import build_model, state_numpy

    return state_numpy(build_model(spec, seed=seed))


def bench_programs(
    programs: dict[str, bytes],
    weights: dict[str, np.ndarray],
    recipe: Recipe,
    x: np.ndarray | None = None,
    y: np.ndarray | None = None,
    steps: int = 5,
    allowed: list[str] | None = None,
    on_runtime: Callable[[str, BenchRow | None], None] | None = None,
) -> dict:
    """Time every trainable runtime on ``programs``; returns the profile's ``bench`` entry::

        {"runtimes": [BenchRow dicts], "batch_size": B, "steps": steps,
         "base_rss_mb": resident MiB with the runtimes loaded, before training,
         "peak_rss_mb": peak resident MiB of this process after all of them}

    ``on_runtime(name, None)`` is called before a runtime starts and ``(name, row)`` after.
    """
    from .runtimes.selftest import _time_steps

    spec = modelspec.loads(programs[modelspec.FORMAT])
    xs, ys = bench_inputs(spec, recipe.batch_size * steps, x, y, recipe.seed)
    base_rss = current_rss_mb() or 0.0
    rows = []
    for name, fmt in trainable(programs, allowed).items():
        if on_runtime:
            on_runtime(name, None)
        try:
            runtime = create_runtime(name)
            runtime.load_program(programs[fmt], fmt)
            base_rss = max(base_rss, current_rss_mb() or 0.0)  # the engine is loaded, not yet training
            row = BenchRow(name, fmt, _time_steps(runtime, weights, xs, ys, recipe, steps))
        except Exception as exc:  # one broken runtime must not hide the others
            row = BenchRow(name, fmt, None, f"{type(exc).__name__}: {exc}"[:300])
        rows.append(row)
        if on_runtime:
            on_runtime(name, row)
    return {
        "runtimes": [r.to_dict() for r in rows],
        "batch_size": recipe.batch_size,
        "steps": steps,
        "base_rss_mb": base_rss,
        "peak_rss_mb": peak_rss_mb(),
        "measured_at": time.time(),
    }


def fastest(bench: dict) -> dict | None:
    """The bench row with the lowest step time (None if no runtime produced one)."""
    timed = [r for r in bench.get("runtimes", []) if r.get("ms_per_step") is not None]
    return min(timed, key=lambda r: r["ms_per_step"]) if timed else None
