"""The torch-free ExecuTorch runtime (``executorch-native``): gradient parity with torch
autograd on every case of the export parity matrix, optimizer steps and eval outputs, torch's
data order reproduced without torch, training in a process where torch cannot be imported,
the build's errors and the registry."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from export.parity import eval_parity, gradient_parity, reference_training, training_parity
from fedcore.recipe import Recipe
from sdk_device.runtimes import native_build
from sdk_device.runtimes.executorch_native_runtime import NativeExecutorchRuntime
from sdk_device.runtimes.executorch_runtime import ExecutorchRuntime
from sdk_device.runtimes.registry import available_runtimes, create_runtime, pick_runtime
from sdk_device.runtimes.torch_rng import TorchCpuGenerator
from server_toolkit.data.datasets import load_dataset

from .pte_cache import cached_programs  # noqa: F401 - provides the program_for fixture
from .test_executorch_runtime import SPEC as DIGITS_SPEC
from .test_export_parity import (
    BATCH,
    CASES,
    CE,
    EVAL_TOL,
    GRAD_TOL,
    LOSS_TOL,
    MODELS,
    SPECS,
    STEP_TOL,
    _case_id,
    _data,
    _extras,
    _weights,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_loss_and_gradients_match_torch_autograd(case, program_for):
    name, loss = case
    spec = SPECS[name]
    x, y = _data(spec, BATCH, seed=1)
    result = gradient_parity(program_for(spec, loss, BATCH), spec, _weights(spec, 2), x, y, loss,
                             _extras(loss, BATCH, spec, 1), runtime_class=NativeExecutorchRuntime)
    assert result.loss_error <= LOSS_TOL, result
    assert result.grad_error <= GRAD_TOL, result
    assert result.running_error <= 1e-5, result


@pytest.mark.parametrize("name", ["residual", "vgg_multi_exit"])
def test_five_sgd_and_adam_steps_match_torch_optim(name, program_for):
    spec = MODELS[name]
    n = 4 * BATCH + BATCH // 2  # the last step on half a batch (padded + masked)
    x, y = _data(spec, n, seed=3)
    for recipe in (Recipe(epochs=1, batch_size=BATCH, optimizer="sgd", lr=0.05, momentum=0.9,
                          weight_decay=1e-3),
                   Recipe(epochs=1, batch_size=BATCH, optimizer="adam", lr=0.01, weight_decay=1e-3)):
        diff = training_parity(program_for(spec, CE, BATCH), spec, _weights(spec, 4), x, y, recipe, CE,
                               runtime_class=NativeExecutorchRuntime)
        assert diff <= STEP_TOL, recipe.optimizer


@pytest.mark.parametrize("name", list(MODELS))
def test_eval_outputs_match_torch(name, program_for):
    spec = MODELS[name]
    x, _ = _data(spec, BATCH - 3, seed=5)
    assert eval_parity(program_for(spec, CE, BATCH), spec, _weights(spec, 6), x,
                       runtime_class=NativeExecutorchRuntime) <= EVAL_TOL


def test_it_computes_exactly_what_the_python_bindings_compute(program_for):
    """Same program, same kernels: the native shim and the bindings agree bit for bit."""
    spec = MODELS["vgg_multi_exit"]
    x, y = _data(spec, BATCH, seed=2)
    results = []
    for runtime_class in (NativeExecutorchRuntime, ExecutorchRuntime):
        runtime = runtime_class()
        runtime.load_program(program_for(spec, CE, BATCH), "pte/1")
        runtime.set_weights(_weights(spec, 1))
        results.append(runtime.gradients(x, y))
    (loss_a, grads_a, _), (loss_b, grads_b, _) = results
    assert loss_a == loss_b
    assert all(np.array_equal(grads_a[k], grads_b[k]) for k in grads_b)


@pytest.mark.parametrize("seed", [0, 17, 2**33 + 5])
def test_the_batch_order_and_dropout_draws_are_torchs(seed):
    ours, theirs = TorchCpuGenerator(seed), torch.Generator().manual_seed(seed)
    for n, shape in [(1, (3,)), (37, (8, 64)), (1438, (16, 4, 9, 9))]:
        assert np.array_equal(ours.randperm(n), torch.randperm(n, generator=theirs).numpy())
        assert np.array_equal(ours.rand(shape), torch.rand(shape, generator=theirs).numpy())
    assert not np.array_equal(TorchCpuGenerator(seed + 1).randperm(50), TorchCpuGenerator(seed).randperm(50))


def _without_torch(tmp_path: Path, module: str, *args: str) -> tuple[dict, str]:
    """Run ``python -m module args`` with torch unimportable; (the load report, stdout)."""
    report = tmp_path / f"report-{module}.json"
    done = subprocess.run([sys.executable, "-m", "tests.torchless.run", str(report), module, *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(report.read_text()), done.stdout


def test_training_in_a_process_without_torch_matches_torch(program_for, tmp_path):
    """Digits, a CNN with BatchNorm, 2 epochs with a short last batch, in a process where
    importing torch fails: no torch module and no libtorch library loaded, and the trained
    weights equal torch.optim's on the same batch order (dropout off on both sides)."""
    spec = DIGITS_SPEC
    data = load_dataset("digits", seed=0)
    x, y = data.x_train[:44], data.y_train[:44]
    recipe = Recipe(epochs=2, batch_size=BATCH, optimizer="sgd", lr=0.05, momentum=0.9, seed=3)
    weights = _weights(spec, 4)
    program = tmp_path / "model.pte"
    program.write_bytes(program_for(spec, CE, BATCH))
    np.savez(tmp_path / "in.npz", x=x, y=y, recipe=json.dumps(recipe.to_dict()), dropout=False,
             **{f"w:{k}": v for k, v in weights.items()})
    report, _ = _without_torch(tmp_path, "tests.torchless.train_once", str(program), str(tmp_path / "in.npz"),
                               str(tmp_path / "out.npz"))
    assert report["torch_modules"] == [] and report["libtorch"] == [], report
    assert "libexecutorch.so" in report["executorch_libraries"], report
    out = np.load(tmp_path / "out.npz")
    assert int(out["samples"]) == 44 and np.isfinite(float(out["loss"]))
    reference = reference_training(spec, weights, x, y, recipe, CE)
    assert max(float(np.abs(out[f"w:{k}"] - v).max()) for k, v in reference.items()) <= STEP_TOL


def test_a_device_without_torch_lists_only_the_native_executorch_runtime(tmp_path):
    report, stdout = _without_torch(tmp_path, "sdk_device.cli", "info")
    runtimes = json.loads(stdout)["runtimes"]
    assert "executorch-native" in runtimes
    assert "torch" not in runtimes and "executorch" not in runtimes  # both need torch
    assert report["torch_modules"] == []


def test_the_registry_offers_it_for_pte_programs():
    assert "executorch-native" in available_runtimes()
    offered = ["torchspec/1", "pte/1"]
    assert pick_runtime(offered, allowed=["executorch-native"]) == ("executorch-native", "pte/1")
    assert create_runtime("executorch-native").name == "executorch-native"


def test_bad_programs_and_calls_are_refused(program_for):
    runtime = NativeExecutorchRuntime()
    with pytest.raises(RuntimeError, match="load_program"):
        runtime.get_weights()
    with pytest.raises(ValueError, match="not an ExecuTorch program"):
        runtime.load_program(b"not a program", "pte/1")
    with pytest.raises(ValueError, match="cannot run"):
        runtime.load_program(program_for(MODELS["mlp"], CE, BATCH), "torchspec/1")


def test_the_build_says_what_is_missing_in_one_line(tmp_path):
    with pytest.raises(native_build.NativeBuildError, match="no C\\+\\+ compiler") as missing_cxx:
        native_build.build(cxx="no-such-g++", out=tmp_path / "x.so")
    with pytest.raises(native_build.NativeBuildError, match="not an executorch package") as bad_dir:
        native_build.build(et_dir=tmp_path, out=tmp_path / "x.so")
    assert "\n" not in str(missing_cxx.value) and "\n" not in str(bad_dir.value)
    assert not (tmp_path / "x.so").exists()


def test_the_build_command_compiles_a_loadable_library(tmp_path):
    out = tmp_path / "libfedsdk_executorch.so"
    done = subprocess.run([sys.executable, "-m", "sdk_device.runtimes.native_build", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out) and out.stat().st_size > 10_000
    needed = subprocess.run(["readelf", "-d", str(out)], capture_output=True, text=True).stdout
    for lib in native_build.LIBRARIES:
        assert f"[lib{lib}.so]" in needed
    assert "libtorch" not in needed and "libc10" not in needed
