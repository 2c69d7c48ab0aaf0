"""The inference-only path: spec -> .tflite (litert-torch, in .venv-litert) -> LiteRT interpreter.

The program is converted once; the ``litert`` runtime (ai-edge-litert in the main venv)
then evaluates two "rounds" of different weights fed as inputs, with a short last batch.
Every output (exits and final) must be within 1e-4 of torch eval mode and of the ONNX
eval graph run by the ``onnx`` runtime.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from export.onnx import export_inference
from export.tflite import export_tflite, litert_python_path
from fedcore import modelspec
from fedcore.torch_model import build_model, load_numpy, state_numpy
from sdk_device.runtimes.litert_runtime import LiteRTRuntime
from sdk_device.runtimes.onnxruntime_runtime import OnnxEvalRuntime
from sdk_device.runtimes.torch_runtime import TorchRuntime
from server_toolkit.data.datasets import load_dataset
from server_toolkit.models.zoo import model_spec

pytestmark = pytest.mark.integration

SHAPE, BATCH = (1, 8, 8), 16
MODELS = {
    "vgg_multi_exit": lambda: model_spec("vgg_multi_exit", SHAPE, 10, channels=(4, 8, 8, 16)),
    "resnet_small": lambda: model_spec("resnet_small", SHAPE, 10, widths=(4, 8)),
}


def _round_weights(spec: dict, seed: int) -> dict[str, np.ndarray]:
    """Trained-looking weights: a seeded init with running statistics moved off 0 / 1."""
    weights = state_numpy(build_model(spec, seed=seed))
    rng = np.random.default_rng(seed)
    for name, value in weights.items():
        if name.endswith("running_mean"):
            weights[name] = (rng.standard_normal(value.shape) * 0.2).astype(np.float32)
        elif name.endswith("running_var"):
            weights[name] = rng.uniform(0.5, 2.0, value.shape).astype(np.float32)
    return weights


@pytest.mark.parametrize("name", list(MODELS))
def test_tflite_program_evaluates_like_torch_and_onnx(name):
    if not Path(litert_python_path()).exists():
        pytest.fail(f"the litert-torch environment is missing ({litert_python_path()}): run "
                    "`sh scripts/setup-litert-env.sh` (make test does) or set FEDSDK_LITERT_PYTHON")
    spec = MODELS[name]()
    data = load_dataset("digits", seed=0)
    x, y = data.x_test[:40], data.y_test[:40].astype(np.int64)  # 16 + 16 + 8: the last batch is padded
    litert = LiteRTRuntime()
    litert.load_program(export_tflite(spec, batch=BATCH), "tflite/1")
    onnx_rt = OnnxEvalRuntime()
    onnx_rt.load_program(export_inference(spec), "onnx/1")
    reference = build_model(spec).eval()
    torch_rt = TorchRuntime()
    torch_rt.load_program(modelspec.dumps(spec), modelspec.FORMAT)
    for seed in (1, 2):  # two rounds: new weights into the same loaded programs
        weights = _round_weights(spec, seed)
        litert.set_weights(weights)
        onnx_rt.set_weights(weights)
        load_numpy(reference, weights)
        with torch.no_grad():
            expected = [t.numpy() for t in reference(torch.from_numpy(x))]
        got_tflite, got_onnx = litert.predict(x), onnx_rt.predict(x)
        assert len(got_tflite) == len(got_onnx) == len(expected) == modelspec.num_outputs(spec)
        for tfl, onx, want in zip(got_tflite, got_onnx, expected, strict=True):
            assert tfl.shape == want.shape == (len(y), 10)
            assert np.abs(tfl - want).max() <= 1e-4
            assert np.abs(onx - want).max() <= 1e-4
            assert np.abs(tfl - onx).max() <= 1e-4
        torch_rt.set_weights(weights)
        stats, want_stats = litert.evaluate(x, y), torch_rt.evaluate(x, y)
        assert stats.samples == len(y)
        assert abs(stats.loss - want_stats.loss) <= 1e-4 and stats.accuracy == want_stats.accuracy
    with pytest.raises(NotImplementedError):
        litert.train(x, y, None)
