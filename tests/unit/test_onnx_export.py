"""Unit tests of the ONNX export (main venv): graphs, program blobs, the eval runtime.

Training parity through ONNX Runtime's training build is in
tests/integration/test_ort_parity.py (it needs the ORT environment); here the exported
graphs run in the plain ``onnxruntime`` of the main venv.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

from export.onnx import (
    export_inference,
    export_training_forward,
    generate_ort_artifacts,
    model_from,
    state_names,
)
from export.onnx_modules import ExportAvgPool2d, ExportBatchNorm2d
from export.tflite import export_tflite
from fedcore import modelspec
from fedcore.torch_model import build_model, load_numpy, state_numpy
from sdk_device.runtimes import ort_program, program_archive
from sdk_device.runtimes.onnxruntime_runtime import OnnxEvalRuntime, cross_entropy_sum
from sdk_device.runtimes.registry import _installed, formats_of, pick_runtime, runtimes
from sdk_device.runtimes.torch_runtime import TorchRuntime
from server_toolkit.data.datasets import load_dataset
from server_toolkit.models.zoo import model_spec

SHAPE = (1, 8, 8)


@pytest.fixture(scope="module")
def digits():
    data = load_dataset("digits", seed=0)
    return data.x_test[:40], data.y_test[:40].astype(np.int64)


def _vgg(dropout: float = 0.5) -> dict:
    return model_spec("vgg_multi_exit", SHAPE, 10, channels=(4, 8, 8, 16), dropout=dropout)


def _random_state(model: nn.Module, seed: int) -> dict[str, np.ndarray]:
    """Weights and running statistics far from their init (variances positive)."""
    rng = np.random.default_rng(seed)
    return {k: (np.abs(v) + 0.5 if k.endswith("running_var") else rng.standard_normal(v.shape) * 0.3)
            .astype(np.float32) for k, v in state_numpy(model).items()}


# ---- torch-level replacements -----------------------------------------------------------------

def test_export_batchnorm_matches_torch_in_train_and_eval_mode():
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(3)
    bn.running_mean.uniform_(-1, 1)
    bn.running_var.uniform_(0.5, 2)
    twin = ExportBatchNorm2d.replacing(bn)
    x = torch.randn(5, 3, 4, 4) * 2 + 1
    out = twin(x)  # both in train mode; torch's updates its buffers in place
    expected = bn(x)
    assert torch.allclose(out, expected, atol=1e-5)
    new_mean, new_var = twin.new_running_stats
    assert torch.allclose(new_mean, bn.running_mean, atol=1e-6)
    assert torch.allclose(new_var, bn.running_var, atol=1e-6)  # unbiased batch variance, like torch
    assert not torch.allclose(twin.running_mean, bn.running_mean)  # its own buffers are left alone
    bn.eval()
    twin.load_state_dict(bn.state_dict())
    twin.eval()
    assert torch.allclose(twin(x), bn(x), atol=1e-6)


@pytest.mark.parametrize("pool", [nn.AvgPool2d(2), nn.AvgPool2d(3, stride=2, padding=1),
                                  nn.AdaptiveAvgPool2d(2), nn.AdaptiveAvgPool2d(1)])
def test_export_avgpool_computes_the_same_averages(pool):
    x = torch.randn(3, 4, 8, 8)
    assert torch.allclose(ExportAvgPool2d(pool)(x), pool(x), atol=1e-6)


# ---- ONNX graphs in plain onnxruntime ---------------------------------------------------------

def test_inference_graph_takes_weights_as_inputs_and_matches_torch(digits):
    x, _ = digits
    spec = _vgg()
    model = build_model(spec, seed=1)
    graph = export_inference(spec)
    session = ort.InferenceSession(graph, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    assert names == ["input", *state_names(model)]
    assert not {init.name for init in onnx.load_from_string(graph).graph.initializer} & set(names)
    assert export_inference(spec) == graph  # same architecture, same bytes: the same blob id
    for seed, batch in ((2, 40), (3, 7)):  # new weights each "round", any batch size, one graph
        weights = _random_state(model, seed)
        load_numpy(model, weights)
        outputs = session.run(None, {"input": x[:batch], **weights})
        with torch.no_grad():
            expected = model.eval()(torch.from_numpy(x[:batch]))
        assert len(outputs) == len(expected) == 3
        for got, want in zip(outputs, expected, strict=True):
            assert np.abs(got - want.numpy()).max() <= 1e-4


def test_training_forward_graph_computes_torch_loss_and_running_stats(digits):
    x, y = digits
    spec = _vgg(dropout=0.0)  # train-mode dropout would draw its own masks
    model = build_model(spec, seed=4)
    load_numpy(model, _random_state(model, 5))
    graph = export_training_forward(model, {"kind": "ce"}, SHAPE, 10)
    initializers = {i.name for i in onnx.load_from_string(graph.onnx_bytes).graph.initializer}
    assert {p["name"] for p in graph.parameters} | {b["name"] for b in graph.buffers} <= initializers
    assert [b["name"] for b in graph.buffers] == [n for n in state_names(model) if "running" in n]
    session = ort.InferenceSession(graph.onnx_bytes, providers=["CPUExecutionProvider"])
    batch = 13  # not the example batch the graph was traced with
    loss, logits, *stats = session.run(None, {"input": x[:batch], "labels": y[:batch]})
    model.train()
    outputs = model(torch.from_numpy(x[:batch]))
    expected_loss = sum(nn.functional.cross_entropy(o, torch.from_numpy(y[:batch])) for o in outputs)
    assert abs(float(loss) - float(expected_loss.detach())) <= 1e-5
    assert np.abs(logits - outputs[-1].detach().numpy()).max() <= 1e-5
    after = state_numpy(model)  # torch's train-mode forward moved the running statistics
    for buffer, value in zip(graph.buffers, stats, strict=True):
        assert np.abs(value - after[buffer["name"]]).max() <= 1e-5, buffer["name"]


def test_static_batchnorm_exports_with_batch_statistics(digits):
    x, _ = digits
    spec = modelspec.make(SHAPE, 10, [
        {"op": "conv2d", "in": 1, "out": 4, "k": 3, "pad": 1}, {"op": "batchnorm2d", "c": 4, "track": False},
        {"op": "relu"}, {"op": "gap"}, {"op": "flatten"}, {"op": "linear", "in": 4, "out": 10}])
    model = model_from(spec)
    session = ort.InferenceSession(export_inference(spec), providers=["CPUExecutionProvider"])
    weights = state_numpy(model)
    (out,) = session.run(None, {"input": x, **weights})
    with torch.no_grad():
        (expected,) = model.eval()(torch.from_numpy(x))
    assert np.abs(out - expected.numpy()).max() <= 1e-4


# ---- the eval-only runtime ---------------------------------------------------------------------

def test_onnx_eval_runtime_agrees_with_the_torch_runtime(digits):
    x, y = digits
    spec = model_spec("small_cnn", SHAPE, 10, width=4)
    weights = state_numpy(build_model(spec, seed=7))
    onnx_rt = OnnxEvalRuntime()
    onnx_rt.load_program(export_inference(spec), "onnx/1")
    onnx_rt.set_weights(weights)
    torch_rt = TorchRuntime()
    torch_rt.load_program(modelspec.dumps(spec), modelspec.FORMAT)
    torch_rt.set_weights(weights)
    got, want = onnx_rt.evaluate(x, y, batch_size=16), torch_rt.evaluate(x, y, batch_size=16)
    assert got.samples == want.samples == len(y)
    assert abs(got.loss - want.loss) <= 1e-4 and got.accuracy == want.accuracy
    assert set(onnx_rt.get_weights()) == set(weights)
    with pytest.raises(NotImplementedError):
        onnx_rt.train(x, y, None)
    with pytest.raises(KeyError):
        onnx_rt.set_weights({k: v for k, v in weights.items() if k != "layers.0.bias"})


def test_cross_entropy_sum_matches_torch():
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((6, 5)) * 30).astype(np.float32)  # large: needs the max shift
    labels = rng.integers(0, 5, 6)
    expected = nn.functional.cross_entropy(torch.from_numpy(logits), torch.from_numpy(labels),
                                           reduction="sum")
    assert abs(cross_entropy_sum(logits, labels) - float(expected)) <= 1e-3


# ---- program blobs -----------------------------------------------------------------------------

def test_program_archive_round_trip_and_tamper_detection():
    files = {"a.onnx": b"first", "checkpoint": bytes(range(256))}
    blob = program_archive.pack("demo/1", {"note": 1}, files)
    assert blob == program_archive.pack("demo/1", {"note": 1}, dict(reversed(files.items())))  # stable bytes
    index, read = program_archive.read(blob, "demo/1")
    assert read == files and index["note"] == 1
    assert index["files"]["checkpoint"]["size"] == 256
    with pytest.raises(program_archive.ProgramError):
        program_archive.read(blob, "other/1")
    tampered = blob.replace(b"first", b"fir5t")
    with pytest.raises(program_archive.ProgramError):
        program_archive.read(tampered, "demo/1")
    with pytest.raises(program_archive.ProgramError):
        program_archive.read(b"not a zip", "demo/1")


def test_ort_program_needs_every_file_and_unpacks_under_fixed_names(tmp_path):
    roles = {role: role.encode() for role in ort_program.FILES}
    with pytest.raises(ort_program.ProgramError):
        ort_program.pack({}, {k: v for k, v in roles.items() if k != "checkpoint"})
    index, paths = ort_program.unpack(ort_program.pack({"loss": {"kind": "ce"}}, roles), tmp_path / "p")
    assert index["format"] == "ort-training/1" and index["loss"] == {"kind": "ce"}
    assert {role: p.read_bytes() for role, p in paths.items()} == roles
    assert all(p.parent == tmp_path / "p" for p in paths.values())


# ---- registry ----------------------------------------------------------------------------------

def test_registry_knows_the_onnx_runtimes():
    assert formats_of("onnxruntime") == ("ort-training/1",)
    assert runtimes()["onnxruntime"].requires == "onnxruntime.training"
    assert formats_of("onnx") == ("onnx/1",) and formats_of("litert") == ("tflite/1",)
    assert not runtimes()["onnx"].trains and runtimes()["onnxruntime"].trains
    assert not _installed("no_such_package.training")  # a missing parent package is "not installed"
    # the main venv has plain onnxruntime, not the training build: torch takes the task
    assert pick_runtime(["ort-training/1", "torchspec/1"]) == ("torch", "torchspec/1")
    with pytest.raises(ValueError):
        pick_runtime(["ort-training/1"], allowed=["onnxruntime"])


def test_missing_export_environments_fail_with_the_fix(tmp_path):
    missing = str(tmp_path / "no-such-venv" / "bin" / "python")
    with pytest.raises(RuntimeError, match="setup-ort-env.sh"):
        generate_ort_artifacts([(b"", [], [])], ort_python=missing)
    with pytest.raises(RuntimeError, match="setup-litert-env.sh"):
        export_tflite(model_spec("small_cnn", SHAPE, 10, width=4), litert_python=missing)
