"""The ExecuTorch device runtime: weights written in place between rounds, short last
batches, errors, runtime selection and the on-device self-test (parity + speed)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from export.parity import reference_gradients
from fedcore import modelspec
from fedcore.recipe import Recipe
from fedcore.torch_model import build_model, state_numpy
from sdk_device.runtimes.executorch_runtime import ExecutorchRuntime
from sdk_device.runtimes.registry import create_runtime, pick_runtime
from sdk_device.runtimes.selftest import fastest_passing, format_table, run_selftest
from sdk_device.runtimes.torch_runtime import TorchRuntime
from server_toolkit.data.datasets import load_dataset

from .pte_cache import cached_programs  # noqa: F401 - provides the program_for fixture

BATCH = 8
CE = {"kind": "ce"}
SPEC = modelspec.make((1, 8, 8), 10, [
    {"op": "conv2d", "in": 1, "out": 4, "k": 3, "pad": 1, "bias": False}, {"op": "batchnorm2d", "c": 4},
    {"op": "relu"}, {"op": "maxpool2d", "k": 2}, {"op": "flatten"}, {"op": "dropout", "p": 0.25},
    {"op": "linear", "in": 64, "out": 10}])


@pytest.fixture(scope="module")
def digits():
    data = load_dataset("digits", seed=0)
    return data.x_train, data.y_train, data.x_test, data.y_test


@pytest.fixture
def runtime(program_for) -> ExecutorchRuntime:
    rt = ExecutorchRuntime()
    rt.load_program(program_for(SPEC, CE, BATCH), "pte/1")
    return rt


def _weights(seed: int) -> dict[str, np.ndarray]:
    return state_numpy(build_model(SPEC, seed=seed))


def test_weights_are_written_into_the_loaded_program_between_rounds(runtime, digits):
    x, y = digits[0][:BATCH], digits[1][:BATCH]
    module = runtime.module
    for seed in (1, 2):  # two "rounds": new weights, same loaded program
        weights = _weights(seed)
        runtime.set_weights(weights)
        got = runtime.get_weights()
        assert list(got) == list(weights)
        assert all(np.array_equal(got[k], v) and got[k].dtype == v.dtype for k, v in weights.items())
        loss, grads, _ = runtime.gradients(x, y)
        ref_loss, ref_grads, _ = reference_gradients(SPEC, weights, x, y, CE)
        assert abs(loss - ref_loss) <= 1e-5
        for name, g in ref_grads.items():
            assert np.abs(grads[name] - g).max() <= 1e-5 * max(1.0, np.abs(g).max()), name
    assert runtime.module is module  # never reloaded


def test_training_changes_the_weights_and_uses_every_sample(runtime, digits):
    x, y = digits[0][:21], digits[1][:21]  # 21 = 2 full batches + 5
    weights = _weights(0)
    runtime.set_weights(weights)
    stats = runtime.train(x, y, Recipe(epochs=2, batch_size=BATCH, lr=0.05))
    assert stats.samples == 21
    assert np.isfinite(stats.loss) and 0.0 <= stats.accuracy <= 1.0
    trained = runtime.get_weights()
    assert not np.allclose(trained["layers.0.weight"], weights["layers.0.weight"])
    assert not np.allclose(trained["layers.1.running_mean"], weights["layers.1.running_mean"])


def test_a_recipe_batch_smaller_than_the_program_batch_is_padded(runtime, digits):
    x, y = digits[0][:12], digits[1][:12]
    runtime.set_weights(_weights(0))
    runtime.dropout_enabled = False
    stats = runtime.train(x, y, Recipe(epochs=1, batch_size=4, lr=0.05))
    assert stats.samples == 12


def test_evaluate_matches_the_torch_runtime(runtime, digits):
    weights = _weights(3)
    runtime.set_weights(weights)
    torch_rt = TorchRuntime(threads=1)
    torch_rt.load_program(modelspec.dumps(SPEC), modelspec.FORMAT)
    torch_rt.set_weights(weights)
    ours, theirs = runtime.evaluate(digits[2], digits[3]), torch_rt.evaluate(digits[2], digits[3])
    assert ours.samples == theirs.samples == len(digits[3])
    assert abs(ours.loss - theirs.loss) <= 1e-5 and ours.accuracy == pytest.approx(theirs.accuracy)


def test_training_on_digits_follows_the_torch_runtime(runtime, digits):
    """Same batch order and optimizer, dropout off on both sides: the same accuracy."""
    recipe = Recipe(epochs=3, batch_size=BATCH, lr=0.05)
    runtime.set_weights(_weights(0))
    runtime.dropout_enabled = False
    before = runtime.evaluate(digits[2], digits[3]).accuracy
    runtime.train(digits[0], digits[1], recipe)
    after = runtime.evaluate(digits[2], digits[3]).accuracy
    torch_rt = TorchRuntime(threads=1)
    torch_rt.load_program(modelspec.dumps(SPEC), modelspec.FORMAT)
    torch_rt.model.layers[5].p = 0.0  # the dropout layer
    torch_rt.set_weights(_weights(0))
    torch_rt.train(digits[0], digits[1], recipe)
    assert after > before + 0.3
    assert abs(after - torch_rt.evaluate(digits[2], digits[3]).accuracy) <= 0.01


def test_bad_inputs_are_refused(runtime, program_for, digits):
    weights = _weights(0)
    with pytest.raises(KeyError):
        runtime.set_weights({k: v for k, v in weights.items() if k != "layers.1.running_var"})
    with pytest.raises(ValueError):
        runtime.set_weights({**weights, "layers.0.weight": np.zeros((4, 1, 5, 5), np.float32)})
    runtime.set_weights(weights)
    with pytest.raises(ValueError, match="exceeds"):
        runtime.train(digits[0][:20], digits[1][:20], Recipe(batch_size=BATCH * 2))
    with pytest.raises(ValueError):
        ExecutorchRuntime().load_program(program_for(SPEC, CE, BATCH), "torchspec/1")
    with pytest.raises(RuntimeError):
        ExecutorchRuntime().get_weights()
    with pytest.raises((RuntimeError, ValueError)):
        ExecutorchRuntime().load_program(b"not a program", "pte/1")
    kd = ExecutorchRuntime()
    kd.load_program(program_for(SPEC, {"kind": "kd", "temperature": 2.0, "alpha": 0.5}, BATCH), "pte/1")
    kd.set_weights(weights)
    with pytest.raises(ValueError, match="teacher_logits"):
        kd.train(digits[0][:8], digits[1][:8], Recipe(batch_size=BATCH))


def test_the_agent_can_pick_executorch():
    assert pick_runtime(["pte/1"]) == ("executorch", "pte/1")
    assert pick_runtime(["torchspec/1", "pte/1"], allowed=["executorch"]) == ("executorch", "pte/1")
    assert create_runtime("executorch").name == "executorch"


def test_selftest_checks_parity_and_times_every_runtime(program_for, digits):
    programs = {"torchspec/1": modelspec.dumps(SPEC), "pte/1": program_for(SPEC, CE, BATCH)}
    recipe = Recipe(batch_size=BATCH, optimizer="adam", lr=1e-3)
    rows = run_selftest(programs, _weights(5), digits[0][:40], digits[1][:40], recipe, steps=3,
                        runtimes=["torch", "executorch"])
    by_name = {r.runtime: r for r in rows}
    assert set(by_name) == {"torch", "executorch"}
    ours = by_name["executorch"]
    assert ours.passed and ours.format == "pte/1"
    assert ours.loss_error <= 1e-5 and ours.grad_error <= 1e-5
    assert all(r.ms_per_step > 0 for r in rows)
    assert fastest_passing(rows) == min(rows, key=lambda r: r.ms_per_step).runtime
    table = format_table(rows)
    assert "executorch" in table and "torch" in table and "pass" in table


def test_selftest_fails_a_runtime_that_disagrees(program_for, digits):
    """A program with the same weights but another layer (average- instead of max-pool)
    is reported as failing parity."""
    other = modelspec.make((1, 8, 8), 10, [
        {"op": "conv2d", "in": 1, "out": 4, "k": 3, "pad": 1, "bias": False},
        {"op": "batchnorm2d", "c": 4, "track": True}, {"op": "relu"}, {"op": "avgpool2d", "k": 2},
        {"op": "flatten"}, {"op": "dropout", "p": 0.25}, {"op": "linear", "in": 64, "out": 10}])
    programs = {"torchspec/1": modelspec.dumps(SPEC), "pte/1": program_for(other, CE, BATCH)}
    rows = run_selftest(programs, _weights(5), digits[0][:16], digits[1][:16], Recipe(batch_size=BATCH),
                        steps=1, runtimes=["executorch"])
    assert len(rows) == 1 and rows[0].passed is False


class _EvalOnly(TorchRuntime):
    """A stand-in for an evaluation-only runtime (LiteRT, plain ONNX Runtime)."""

    name = "eval-only"

    def train(self, x, y, recipe, progress=None):
        raise NotImplementedError("the eval-only runtime only evaluates")


def test_selftest_reports_evaluation_only_runtimes(monkeypatch, digits):
    from sdk_device.runtimes import registry

    entry = registry.RuntimeEntry(("torchspec/1",), "torch", lambda: _EvalOnly(threads=1), trains=False)
    monkeypatch.setitem(registry.runtimes(), "eval-only", entry)
    programs = {"torchspec/1": modelspec.dumps(SPEC)}
    rows = run_selftest(programs, _weights(5), digits[0][:16], digits[1][:16], Recipe(batch_size=BATCH),
                        steps=1, runtimes=["torch", "eval-only"])
    row = next(r for r in rows if r.runtime == "eval-only")
    assert row.passed and row.grad_error is None and row.loss_error <= 1e-6
    assert row.note.startswith("evaluation only")
    assert fastest_passing(rows) == "torch"


def test_the_device_package_stays_torch_free():
    code = ("import sys, sdk_device, sdk_device.runtimes.registry, sdk_device.runtimes.selftest, "
            "sdk_device.runtimes.optimizers, fedcore.recipe, fedcore.modelspec; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
