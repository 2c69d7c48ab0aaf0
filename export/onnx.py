"""Torch model -> ONNX: the inference model and the ONNX Runtime training program.

Two graphs come out of one torch model (a zoo spec or any ``nn.Module`` whose forward
returns a tuple of logits):

* the **inference / eval graph** (:func:`export_inference`): eval mode, every weight a
  graph *input* rather than a baked-in constant, outputs = all logits (exits, final).
  A device loads it once and feeds the current weights each round: no re-export.
* the **training forward graph** (:func:`export_training_forward`): train mode, the loss
  inside, weights as initializers (ONNX Runtime turns them into trainable
  parameters), outputs = ``loss``, the final ``logits`` and the new BatchNorm running
  statistics.

:func:`export_ort_training_program` then lets ONNX Runtime's ``generate_artifacts`` add
the backward graph and packs everything as an ``ort-training/1`` blob.

Decisions (ONNX Runtime's documentation is silent on parity with torch; each one was
needed for the parity tests in tests/integration/test_ort_parity.py):

* BatchNorm in train mode is written out as mean/variance arithmetic
  (:class:`ExportBatchNorm2d`) instead of ONNX's ``BatchNormalization(training_mode=1)``:
  ONNX updates the running variance with the *biased* batch variance while torch uses
  the unbiased one, and ORT never writes running statistics back. The graph returns the
  new running statistics as outputs; the runtime stores them after each step. The sample
  count of the unbiased correction is computed in the graph as a float (ORT's gradient
  builder crashes on integer shape arithmetic), so the batch axis stays dynamic.
* Average pooling (not global) becomes a depthwise convolution with constant weights
  (:class:`ExportAvgPool2d`): ORT 1.19's AveragePool gradient kernel dies with SIGFPE.
* SoftmaxCrossEntropyLoss, MaxPool and Dropout nodes get their optional second output
  (log-probabilities, indices, mask): ORT's gradient builder reads it.
* The legacy TorchScript exporter (``dynamo=False``) at opset 17 (the dynamo exporter
  needs onnxscript, not installed). It merges initializers with equal contents (fresh
  BatchNorm weights are all ones), losing their names, so it traces a copy with distinct
  random values and writes the true values back by name. Every graph's weight names are
  the torch state names, so weights travel between runtimes by name.
* The loss is ``fedcore.losses.Loss`` (shared with the ExecuTorch programs) with a sample
  mask of ones: the dynamic batch axis means every row is a real sample.
* Where ``onnxruntime.training`` is not importable (it lives in its own environment, see
  ``scripts/setup-ort-env.sh``), artifact generation runs in that environment's python as
  a subprocess (``export/ort_artifacts.py``, one for all programs of a call); the torch
  export itself always runs in the caller's environment.
"""

from __future__ import annotations

import copy
import importlib.util
import io
import json
import os
import subprocess
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import onnx
import torch
from torch import nn

from fedcore import modelspec
from fedcore.losses import Loss
from fedcore.torch_model import build_model
from sdk_device.runtimes import ort_program

from .onnx_modules import (
    TrainingForward,
    with_export_batchnorm,
)

OPSET = 17
REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_ORT_PYTHON = REPO_ROOT / ".venv-ort" / "bin" / "python"


@dataclass(frozen=True)
class TrainingGraph:
    """An exported training forward graph and what a runtime needs to drive it."""

    onnx_bytes: bytes
    inputs: list[dict]  # {"name", "shape" (None = batch), "dtype"}
    outputs: list[str]
    parameters: list[dict]  # trainable: {"name", "shape"}, in model order
    buffers: list[dict]  # BatchNorm running statistics: {"name", "shape"}


def state_names(model: nn.Module) -> list[str]:
    """Weight names a runtime exchanges: parameters and buffers, without num_batches_tracked."""
    return [n for n in model.state_dict() if not n.endswith("num_batches_tracked")]


def model_from(spec_or_model: dict | nn.Module, seed: int = 0) -> nn.Module:
    """A torch model from a torchspec/1 spec (seeded init) or the module itself."""
    if isinstance(spec_or_model, nn.Module):
        return spec_or_model
    modelspec.validate(spec_or_model)
    return build_model(spec_or_model, seed=seed)


def export_training_forward(model: nn.Module, loss: dict, input_shape: tuple[int, ...],
                            num_classes: int, example_batch: int = 4) -> TrainingGraph:
    """Trace ``model`` + ``loss`` in train mode; ``input_shape`` is per sample (C, H, W)."""
    graph = TrainingForward(model, Loss.from_dict(loss), num_classes)
    extras = graph.extras
    generator = torch.Generator().manual_seed(0)
    example = (torch.randn(example_batch, *input_shape, generator=generator),
               torch.randint(0, num_classes, (example_batch,), generator=generator),
               *(torch.rand(example_batch, *shape, generator=generator) for _, shape in extras))
    input_names = ["input", "labels", *(name for name, _ in extras)]
    running = graph.running_stat_names()
    output_names = ["loss", "logits", *(f"new:{name}" for name in running)]
    dynamic = {name: {0: "batch"} for name in input_names} | {"logits": {0: "batch"}}
    onnx_bytes = _export(graph, example, input_names, output_names, dynamic, torch.onnx.TrainingMode.TRAINING)
    onnx_bytes = _with_backward_outputs(_strip_prefix(onnx_bytes, "model."))
    params = [{"name": n, "shape": list(p.shape)} for n, p in model.named_parameters()]
    buffers = dict(model.named_buffers())
    inputs = [{"name": "input", "shape": [None, *input_shape], "dtype": "float32"},
              {"name": "labels", "shape": [None], "dtype": "int64"},
              *({"name": n, "shape": [None, *s], "dtype": "float32"} for n, s in extras)]
    return TrainingGraph(onnx_bytes, inputs, output_names, params,
                         [{"name": n, "shape": list(buffers[n].shape)} for n in running])


def export_inference(spec_or_model: dict | nn.Module, input_shape: tuple[int, ...] | None = None,
                     example_batch: int = 2) -> bytes:
    """The eval-mode graph with weights as inputs: ``(input, *weights) -> output_0..``.
    Weight input names are the torch state names (:func:`state_names`)."""
    model = model_from(spec_or_model)
    if input_shape is None:
        input_shape = tuple(spec_or_model["input_shape"])
    model = with_export_batchnorm(model)[0].eval()  # static BN (no running stats) exports too
    example = torch.randn(example_batch, *input_shape)
    with torch.no_grad():
        count = len(model(example))
    output_names = [f"output_{i}" for i in range(count)]
    dynamic = {"input": {0: "batch"}} | {name: {0: "batch"} for name in output_names}
    onnx_bytes = _export(model, (example,), ["input"], output_names, dynamic, torch.onnx.TrainingMode.EVAL)
    return _initializers_to_inputs(onnx_bytes, state_names(model))


@dataclass(frozen=True)
class PendingProgram:
    """A program exported from torch, waiting for ORT's artifact generation."""

    training: TrainingGraph
    eval_bytes: bytes
    index: dict


# Decision: ONNX has no stop-gradient operator (torch's detach exports as nothing), so ORT's
# gradient builder would also differentiate through DepthFL's detached teacher outputs.
ORT_REFUSED_LOSSES = {
    "depthfl_sd": "ort-training/1 cannot export loss 'depthfl_sd' (ONNX has no stop-gradient for its "
                  "detached exit teachers); use the executorch or torch runtime"}


def prepare_ort_program(spec_or_model: dict | nn.Module, loss: dict | None = None,
                        input_shape: tuple[int, ...] | None = None,
                        num_classes: int | None = None) -> PendingProgram:
    """The torch half of an ort-training/1 export: training forward graph, eval graph and
    index. ``input_shape`` (C, H, W) and ``num_classes`` are needed for a torch model."""
    model = model_from(spec_or_model)
    if isinstance(spec_or_model, dict):
        input_shape = tuple(spec_or_model["input_shape"])
        num_classes = spec_or_model["num_classes"]
    if input_shape is None or num_classes is None:
        raise ValueError("a torch model needs input_shape and num_classes")
    loss = Loss.from_dict(loss or {"kind": "ce"}).to_dict()
    if loss["kind"] in ORT_REFUSED_LOSSES:
        raise ValueError(ORT_REFUSED_LOSSES[loss["kind"]])
    training = export_training_forward(model, loss, tuple(input_shape), num_classes)
    eval_bytes = export_inference(model, tuple(input_shape))
    with torch.no_grad():
        num_outputs = len(copy.deepcopy(model).eval()(torch.zeros(1, *input_shape)))
    index = {"loss": loss, "num_outputs": num_outputs, "inputs": training.inputs,
             "outputs": training.outputs, "parameters": training.parameters, "buffers": training.buffers,
             "eval_inputs": ["input", *state_names(model)]}
    return PendingProgram(training, eval_bytes, index)


def build_ort_programs(pending: list[PendingProgram], ort_python: str | None = None) -> list[bytes]:
    """Finish prepared programs (one artifact-generation run for all) into blobs."""
    artifacts = generate_ort_artifacts(
        [(p.training.onnx_bytes, [q["name"] for q in p.training.parameters],
          [b["name"] for b in p.training.buffers]) for p in pending], ort_python)
    return [ort_program.pack(p.index, {**files, "eval_model": p.eval_bytes})
            for p, files in zip(pending, artifacts, strict=True)]


def export_ort_training_program(spec_or_model: dict | nn.Module, loss: dict | None = None,
                                input_shape: tuple[int, ...] | None = None,
                                num_classes: int | None = None, ort_python: str | None = None) -> bytes:
    """The ``ort-training/1`` blob for a spec (or a torch model with ``input_shape`` and
    ``num_classes``): training, eval and optimizer models plus the initial checkpoint."""
    return build_ort_programs([prepare_ort_program(spec_or_model, loss, input_shape, num_classes)],
                              ort_python)[0]


def ort_python_path(ort_python: str | None = None) -> str:
    """The interpreter of the ORT environment: argument, $FEDSDK_ORT_PYTHON or .venv-ort."""
    return ort_python or os.environ.get("FEDSDK_ORT_PYTHON") or str(DEFAULT_ORT_PYTHON)


def generate_ort_artifacts(graphs: list[tuple[bytes, list[str], list[str]]],
                           ort_python: str | None = None) -> list[dict[str, bytes]]:
    """Run ONNX Runtime's ``generate_artifacts`` on training forward graphs, given as
    ``(onnx bytes, trainable names, frozen names)``; returns per graph
    ``{"training_model", "optimizer_model", "checkpoint": bytes}``. Runs in this process
    when ``onnxruntime.training`` is importable, else in the ORT environment's python
    (one subprocess for all graphs: its start-up imports torch and takes seconds)."""
    with tempfile.TemporaryDirectory(prefix="fedsdk-ort-") as tmp:
        jobs = [Path(tmp) / f"job{i}" for i in range(len(graphs))]
        for job, (forward, trainable, frozen) in zip(jobs, graphs, strict=True):
            job.mkdir()
            (job / "forward.onnx").write_bytes(forward)
            (job / "params.json").write_text(json.dumps({"trainable": trainable, "frozen": frozen}))
        if ort_python is None and importlib.util.find_spec("onnxruntime.training") is not None:
            from .ort_artifacts import build_job

            for job in jobs:
                build_job(job)
        else:
            python = ort_python_path(ort_python)
            if not Path(python).exists():
                raise RuntimeError(f"ONNX Runtime training is not installed here and {python} does not "
                                   "exist: run scripts/setup-ort-env.sh (or set FEDSDK_ORT_PYTHON)")
            env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
            done = subprocess.run([python, "-m", "export.ort_artifacts", *map(str, jobs)], env=env,
                                  capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                raise RuntimeError(f"ORT artifact generation failed:\n{done.stderr[-3000:]}")
        return [{"training_model": (job / "out" / "training_model.onnx").read_bytes(),
                 "optimizer_model": (job / "out" / "optimizer_model.onnx").read_bytes(),
                 "checkpoint": (job / "out" / "checkpoint").read_bytes()} for job in jobs]


def _export(module: nn.Module, example: tuple, input_names: list[str], output_names: list[str],
            dynamic_axes: dict, mode: torch.onnx.TrainingMode) -> bytes:
    """Legacy-export ``module``; every state tensor keeps its own named initializer.

    The exporter merges initializers with equal contents (fresh BatchNorm weights are all
    ones, running means all zeros), which would lose their names; so the module is traced
    with distinct random values in every tensor and the true values are written back
    into the initializers afterwards, by name."""
    real = {name: t.detach().clone() for name, t in module.state_dict().items()}
    unique = copy.deepcopy(module)
    generator = torch.Generator().manual_seed(1234)
    with torch.no_grad():
        for t in unique.state_dict().values():
            if t.is_floating_point():
                t.copy_(torch.rand(t.shape, generator=generator) + 0.5)  # > 0: valid variances too
    buffer = io.BytesIO()
    with warnings.catch_warnings():  # the legacy exporter's deprecation notes; fixed C, H, W are intended
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        torch.onnx.export(unique, example, buffer, dynamo=False, opset_version=OPSET, input_names=input_names,
                          output_names=output_names, dynamic_axes=dynamic_axes, training=mode,
                          do_constant_folding=False, export_params=True)
    model = onnx.load_from_string(buffer.getvalue())
    for init in model.graph.initializer:
        if init.name in real and real[init.name].is_floating_point():
            init.CopyFrom(onnx.numpy_helper.from_array(real[init.name].numpy(), init.name))
    return model.SerializeToString()


def _initializers_to_inputs(onnx_bytes: bytes, names: list[str]) -> bytes:
    """Turn the initializers ``names`` into graph inputs, in that order, after "input"."""
    model = onnx.load_from_string(onnx_bytes)
    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}
    missing = [n for n in names if n not in initializers]
    if missing:
        raise RuntimeError(f"the exported graph lost weights {missing[:5]} (renamed or folded)")
    for name in names:
        init = initializers[name]
        graph.input.append(onnx.helper.make_tensor_value_info(name, init.data_type, list(init.dims)))
    kept = [init for init in graph.initializer if init.name not in set(names)]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return model.SerializeToString()


def _with_backward_outputs(onnx_bytes: bytes) -> bytes:
    """Give nodes whose ORT gradient needs an optional second output that output.

    ORT's gradient builder reads SoftmaxCrossEntropyLoss's log-probabilities, MaxPool's
    indices and Dropout's mask; the exporter leaves them out when nothing else uses them."""
    model = onnx.load_from_string(onnx_bytes)
    for i, node in enumerate(model.graph.node):
        if node.op_type in ("SoftmaxCrossEntropyLoss", "MaxPool", "Dropout") and len(node.output) == 1:
            node.output.append(f"{node.op_type.lower()}_{i}_aux")
    return model.SerializeToString()


def _strip_prefix(onnx_bytes: bytes, prefix: str) -> bytes:
    """Rename initializers ``<prefix>name`` to ``name`` (and every use of them)."""
    model = onnx.load_from_string(onnx_bytes)
    renames = {init.name: init.name[len(prefix):] for init in model.graph.initializer
               if init.name.startswith(prefix)}
    for init in model.graph.initializer:
        init.name = renames.get(init.name, init.name)
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            if name in renames:
                node.input[i] = renames[name]
    return model.SerializeToString()
