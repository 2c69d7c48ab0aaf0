"""Torch model -> inference-only ``.tflite`` (the ``tflite/1`` program) through litert-torch.

The converted graph takes the weights as inputs (``torch.func.functional_call`` over the
model's state), so a device loads the program once per architecture and feeds new
weights each round, like the ONNX eval graph. Eval mode; outputs = every exit's logits
then the final logits. See ``sdk_device.runtimes.litert_runtime`` for the program layout.

litert-torch is heavy (~2.1 GB with jax and transformers; 116 s to install here), so it
is an optional extra living in its own environment (``scripts/setup-litert-env.sh`` ->
``.venv-litert``). When ``litert_torch`` is importable the conversion runs in this
process; otherwise :func:`export_tflite` runs ``python -m export.tflite JOB_DIR`` in that
environment, passing the spec as JSON (so only spec models convert out of process).

Decisions: a fixed batch (default 32; litert-torch 0.10 cannot lower a dynamic batch
through ``flatten``); BatchNorm must keep running statistics, because a padded last
batch is only exact when rows do not interact; the program's batch is what the device
evaluates at a time.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn

from fedcore import modelspec
from fedcore.torch_model import build_model
from sdk_device.runtimes import litert_runtime

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_LITERT_PYTHON = REPO_ROOT / ".venv-litert" / "bin" / "python"
DEFAULT_BATCH = 32


class WeightsAsInputs(nn.Module):
    """forward(x, *weights) -> the model's outputs computed with those weights."""

    def __init__(self, model: nn.Module, names: list[str]) -> None:
        super().__init__()
        self.model = model.eval()
        self.names = names

    def forward(self, x: torch.Tensor, *weights: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.func.functional_call(self.model, dict(zip(self.names, weights, strict=True)), (x,))


def weight_names(model: nn.Module) -> list[str]:
    """The state names a runtime exchanges (num_batches_tracked is not one)."""
    return [n for n in model.state_dict() if not n.endswith("num_batches_tracked")]


def convert(model: nn.Module, input_shape: tuple[int, ...], batch: int = DEFAULT_BATCH) -> bytes:
    """The ``tflite/1`` blob of a torch model (needs litert_torch in this process)."""
    import litert_torch

    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d) and not module.track_running_stats:
            raise ValueError("tflite export needs BatchNorm with running statistics (a padded batch "
                             "would change batch statistics)")
    names = weight_names(model)
    state = model.state_dict()
    example = (torch.zeros(batch, *input_shape), *(state[n].detach().clone() for n in names))
    wrapper = WeightsAsInputs(model, names)
    with torch.no_grad():
        num_outputs = len(wrapper(*example))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.tflite"
        litert_torch.convert(wrapper, example).export(str(path))
        tflite_bytes = path.read_bytes()
    index = {"batch": batch, "input_shape": list(input_shape), "num_outputs": num_outputs,
             "weight_names": names}
    return litert_runtime.pack(index, tflite_bytes)


def litert_python_path(litert_python: str | None = None) -> str:
    """Interpreter of the litert-torch environment: argument, $FEDSDK_LITERT_PYTHON or .venv-litert."""
    return litert_python or os.environ.get("FEDSDK_LITERT_PYTHON") or str(DEFAULT_LITERT_PYTHON)


def export_tflite(spec: dict, batch: int = DEFAULT_BATCH, litert_python: str | None = None) -> bytes:
    """The ``tflite/1`` blob of a torchspec/1 model (weights are inputs, so any init will do)."""
    modelspec.validate(spec)
    if litert_python is None and importlib.util.find_spec("litert_torch") is not None:
        return convert(build_model(spec, seed=0), tuple(spec["input_shape"]), batch)
    python = litert_python_path(litert_python)
    if not Path(python).exists():
        raise RuntimeError(f"litert-torch is not installed here and {python} does not exist: run "
                           "scripts/setup-litert-env.sh (or set FEDSDK_LITERT_PYTHON)")
    with tempfile.TemporaryDirectory(prefix="fedsdk-tflite-") as tmp:
        job = Path(tmp)
        (job / "spec.json").write_bytes(modelspec.dumps(spec))
        (job / "batch.json").write_text(json.dumps(batch))
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        done = subprocess.run([python, "-m", "export.tflite", str(job)], env=env, capture_output=True,
                              text=True, timeout=900)
        if done.returncode != 0:
            raise RuntimeError(f"tflite conversion failed:\n{done.stderr[-3000:]}")
        return (job / "program.tflite1").read_bytes()


def main(argv: list[str]) -> int:
    """``python -m export.tflite JOB_DIR``: spec.json + batch.json -> program.tflite1."""
    job = Path(argv[0])
    spec = modelspec.loads((job / "spec.json").read_bytes())
    batch = json.loads((job / "batch.json").read_text())
    blob = convert(build_model(spec, seed=0), tuple(spec["input_shape"]), batch)
    (job / "program.tflite1").write_bytes(blob)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
