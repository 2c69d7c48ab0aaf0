"""Gradient parity: one optimizer step of the C++ client equals the Python ExecuTorch runtime's.

The same ``pte/1`` program, weights and batch of 16 digits go through ``fedsdk-device
train-once`` (C++: ExecuTorch Module API + its own SGD/Adam) and through
``ExecutorchRuntime.gradients`` + ``optimizers.make_optimizer`` (Python). The trained weights
must agree within float tolerance for SGD (momentum, weight decay) and Adam, and differ from
the starting weights (the step did something).
"""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from fedcore.recipe import Recipe
from sdk_device.runtimes.executorch_runtime import ExecutorchRuntime
from sdk_device.runtimes.native_build import find_or_build_kernels
from sdk_device.runtimes.optimizers import make_optimizer
from server_toolkit.data.datasets import load_dataset
from server_toolkit.models.zoo import model_spec

from ..unit.pte_cache import cached_programs  # noqa: F401 - provides the program_for fixture
from .cpp_client import write_data

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", params=["portable", "fused"])
def program(request, tmp_path_factory, program_for):
    """small_cnn for digits as a pte/1 program with a batch of 16 (exported once per kernel set)."""
    data = load_dataset("digits", seed=0)
    spec = model_spec("small_cnn", data.input_shape, data.num_classes)
    path = tmp_path_factory.mktemp("pte") / f"model-{request.param}.pte"
    path.write_bytes(program_for(spec, {"kind": "ce"}, 16, kernels=request.param))
    return path


def _kernels_env(program) -> dict:
    """The C++ client's environment: a fused program needs ``FEDSDK_KERNELS_LIB`` (docs/device_cpp.md)."""
    if "fused" not in program.name:
        return None
    return {**os.environ, "FEDSDK_KERNELS_LIB": str(find_or_build_kernels())}


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_one_cpp_train_step_gives_the_python_runtimes_weights(cpp_device, program, tmp_path, optimizer):
    """Both kernel sets: the fused one with libfedsdk_kernels loaded by the client."""
    data = load_dataset("digits", seed=0)
    runtime = ExecutorchRuntime()
    runtime.load_program(program.read_bytes(), "pte/1")
    start = runtime.get_weights()
    save_file(start, str(tmp_path / "start.safetensors"))
    x, y = data.x_train[:16], data.y_train[:16]
    write_data(tmp_path / "data", x, y)
    recipe = Recipe(batch_size=16, optimizer=optimizer, lr=0.05, momentum=0.9, weight_decay=0.01)
    (tmp_path / "recipe.json").write_text(json.dumps(recipe.to_dict()))

    loss, grads, _ = runtime.gradients(x, y)
    make_optimizer(recipe).step(runtime._params, grads)
    expected = runtime.get_weights()

    done = subprocess.run(
        [
            str(cpp_device),
            "train-once",
            str(program),
            str(tmp_path / "start.safetensors"),
            str(tmp_path / "data"),
            str(tmp_path / "recipe.json"),
            str(tmp_path / "out.safetensors"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=_kernels_env(program),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    got = load_file(str(tmp_path / "out.safetensors"))
    assert json.loads(done.stdout.strip().splitlines()[-1])["loss"] == pytest.approx(loss, rel=1e-5)
    assert sorted(got) == sorted(expected)
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-5, atol=1e-6, err_msg=name)
    assert max(float(np.abs(expected[k] - start[k]).max()) for k in start) > 1e-3


def test_the_cpp_client_without_the_kernels_library_refuses_a_fused_program(cpp_device, program, tmp_path):
    if "fused" not in program.name:
        return  # a portable program needs no library: the test above trains it
    env = {k: v for k, v in os.environ.items() if k != "FEDSDK_KERNELS_LIB"}
    unused = [str(tmp_path / name) for name in ("w.safetensors", "data", "recipe.json", "out.safetensors")]
    done = subprocess.run([str(cpp_device), "train-once", str(program), *unused],  # the program loads first
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 1 and "'fused' kernels are not loaded" in done.stderr, done.stderr[-2000:]
