"""On-device self-test: gradient parity and speed of every installed runtime on the
device's own program, the basis of ``fedsdk bench`` and of the agent's runtime choice.

Given the task's programs by format (including ``torchspec/1``, which defines the model),
weights and a few local samples, each installed runtime that can run one of the
programs is checked against the torch reference through the ``Runtime`` interface only:

* parity: one plain SGD step with lr = 1 on one batch, dropout off. The weight change is
  then exactly minus the gradient (and the BN running stats are updated once), so
  comparing weights after the step compares gradients without engine-specific hooks.
  Passed when |loss difference| <= tol and every tensor's max |difference| <=
  tol * max(1, max |reference change|).
* speed: milliseconds per training step with the task's recipe (batch size, optimizer),
  after one warm-up step, ``steps`` steps timed.
* evaluation-only runtimes (``train`` raises NotImplementedError): the mean loss of one
  batch against torch (tolerance 1e-4) and milliseconds per evaluated batch.

Runtimes expose dropout control as a ``dropout_enabled`` attribute (the torch runtime's
dropout modules are switched off directly); a runtime with neither cannot be checked on a
model with dropout and gets ``passed = None``. Without torch there is no reference.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np

from fedcore.recipe import Recipe

from .registry import available_runtimes, create_runtime, formats_of

REFERENCE_FORMAT = "torchspec/1"


@dataclass(frozen=True)
class SelftestRow:
    runtime: str
    format: str
    passed: bool | None  # None: could not be checked (see note)
    loss_error: float | None
    grad_error: float | None
    ms_per_step: float | None
    note: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def _disable_dropout(runtime) -> bool:
    """Switch dropout off in ``runtime``; False if the runtime offers no way to."""
    if hasattr(runtime, "dropout_enabled"):
        runtime.dropout_enabled = False
        return True
    model = getattr(runtime, "model", None)
    if model is not None and hasattr(model, "modules"):
        for module in model.modules():
            if type(module).__name__ == "Dropout":
                module.p = 0.0
        return True
    return False


def _one_step(runtime, weights: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray, seed: int
              ) -> tuple[float, dict[str, np.ndarray]]:
    runtime.set_weights(weights)
    step = Recipe(epochs=1, batch_size=len(y), optimizer="sgd", lr=1.0, momentum=0.0, seed=seed)
    stats = runtime.train(x, y, step)
    return stats.loss, runtime.get_weights()


def _time_steps(runtime, weights: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray, recipe: Recipe,
                steps: int) -> float:
    """Milliseconds per step of ``recipe`` (one warm-up step first)."""
    need = recipe.batch_size * steps
    reps = -(-need // len(y))
    xs, ys = np.concatenate([x] * reps)[:need], np.concatenate([y] * reps)[:need]
    one_epoch = Recipe(**{**recipe.to_dict(), "epochs": 1})
    runtime.set_weights(weights)
    runtime.train(xs[:recipe.batch_size], ys[:recipe.batch_size], one_epoch)
    started = time.perf_counter()
    runtime.train(xs, ys, one_epoch)
    return (time.perf_counter() - started) * 1000.0 / steps


def run_selftest(programs: dict[str, bytes], weights: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray,
                 recipe: Recipe, steps: int = 5, tolerance: float = 1e-5,
                 runtimes: list[str] | None = None) -> list[SelftestRow]:
    """One row per installed runtime (or those in ``runtimes``) that runs one of ``programs``.

    ``programs`` maps format -> program bytes and should include ``torchspec/1`` (the
    reference). ``x``, ``y``: local samples; parity uses the first ``recipe.batch_size``.
    """
    from fedcore import modelspec

    names = [n for n in available_runtimes() if runtimes is None or n in runtimes]
    batch_x, batch_y = x[:recipe.batch_size], y[:recipe.batch_size]
    has_dropout = False
    reference = None
    if REFERENCE_FORMAT in programs and "torch" in available_runtimes():
        spec = modelspec.loads(programs[REFERENCE_FORMAT])
        has_dropout = any(layer.get("op") == "dropout" for layer in _leaves(spec["layers"]))
        torch_rt = create_runtime("torch")
        torch_rt.load_program(programs[REFERENCE_FORMAT], REFERENCE_FORMAT)
        _disable_dropout(torch_rt)
        torch_rt.set_weights(weights)
        reference_eval = torch_rt.evaluate(batch_x, batch_y).loss
        reference = _one_step(torch_rt, weights, batch_x, batch_y, recipe.seed)
    else:
        reference_eval = None
    rows = []
    for name in names:
        fmt = next((f for f in formats_of(name) if f in programs), None)
        if fmt is None:
            continue
        runtime = create_runtime(name)
        runtime.load_program(programs[fmt], fmt)
        try:
            rows.append(_training_row(name, fmt, runtime, weights, x, y, recipe, steps, tolerance,
                                      reference, has_dropout))
        except NotImplementedError:  # an evaluation-only runtime
            rows.append(_eval_only_row(name, fmt, runtime, weights, batch_x, batch_y, reference_eval, steps))
    return rows


def _training_row(name: str, fmt: str, runtime, weights: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray,
                  recipe: Recipe, steps: int, tolerance: float,
                  reference: tuple[float, dict[str, np.ndarray]] | None, has_dropout: bool) -> SelftestRow:
    passed = loss_error = grad_error = None
    note = ""
    if reference is None:
        note = "no torch reference here"
    elif has_dropout and not _disable_dropout(runtime):
        note = "dropout cannot be switched off in this runtime"
    else:
        batch_x, batch_y = x[:recipe.batch_size], y[:recipe.batch_size]
        loss, after = _one_step(runtime, weights, batch_x, batch_y, recipe.seed)
        ref_loss, ref_after = reference
        loss_error = abs(loss - ref_loss)
        grad_error = max(float(np.abs((after[k] - weights[k]) - (v - weights[k])).max())
                         / max(1.0, float(np.abs(v - weights[k]).max())) for k, v in ref_after.items())
        passed = loss_error <= tolerance and grad_error <= tolerance
        note = "reference" if name == "torch" else ""
    ms = _time_steps(runtime, weights, x, y, recipe, steps)
    return SelftestRow(name, fmt, passed, loss_error, grad_error, ms, note)


def _eval_only_row(name: str, fmt: str, runtime, weights: dict[str, np.ndarray], x: np.ndarray,
                   y: np.ndarray, reference_loss: float | None, steps: int) -> SelftestRow:
    """Eval parity (mean loss of one batch vs torch, tolerance 1e-4) and ms per eval batch."""
    runtime.set_weights(weights)
    loss = runtime.evaluate(x, y).loss
    loss_error = None if reference_loss is None else abs(loss - reference_loss)
    started = time.perf_counter()
    for _ in range(steps):
        runtime.evaluate(x, y)
    ms = (time.perf_counter() - started) * 1000.0 / steps
    passed = None if loss_error is None else loss_error <= 1e-4
    return SelftestRow(name, fmt, passed, loss_error, None, ms, "evaluation only: ms per eval batch")


def fastest_passing(rows: list[SelftestRow]) -> str | None:
    """Name of the fastest training runtime that passed parity (None if none passed)."""
    passing = [r for r in rows if r.passed and r.grad_error is not None and r.ms_per_step is not None]
    return min(passing, key=lambda r: r.ms_per_step).runtime if passing else None


def format_table(rows: list[SelftestRow]) -> str:
    """The rows as a fixed-width text table (ms/step relative to torch when present)."""
    torch_ms = next((r.ms_per_step for r in rows if r.runtime == "torch"), None)
    lines = [f"{'runtime':<12} {'format':<12} {'parity':<7} {'loss err':>9} {'grad err':>9} "
             f"{'ms/step':>8} {'x torch':>8}  note"]
    for r in rows:
        parity = "-" if r.passed is None else ("pass" if r.passed else "FAIL")
        loss_e = "-" if r.loss_error is None else f"{r.loss_error:.1e}"
        grad_e = "-" if r.grad_error is None else f"{r.grad_error:.1e}"
        trains = not r.note.startswith("evaluation only")
        ratio = f"{r.ms_per_step / torch_ms:.2f}" if torch_ms and r.ms_per_step and trains else "-"
        lines.append(f"{r.runtime:<12} {r.format:<12} {parity:<7} {loss_e:>9} {grad_e:>9} "
                     f"{r.ms_per_step:>8.1f} {ratio:>8}  {r.note}")
    return "\n".join(lines)


def _leaves(layers: list[dict]):
    for layer in layers:
        yield layer
        for key in ("body", "shortcut", "head"):
            yield from _leaves(layer.get(key, []))
