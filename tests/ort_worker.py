"""Runs ONNX Runtime training jobs for the tests, inside the ORT environment (.venv-ort).

``.venv-ort/bin/python tests/ort_worker.py JOB_DIR`` reads ``JOB_DIR/job.json``::

    {"cases": [{"name": ..., "program": "<file>", "data": "<file>.npz",
                "recipes": [<Recipe dict>, ...]}]}

The data npz holds ``w:<name>`` start weights, ``x``/``y`` (+ ``e:<name>`` extra loss
inputs) for the gradient check, and ``tx``/``ty`` (+ ``te:<name>``) for training runs.
For each case it writes ``JOB_DIR/<name>.out.npz`` with ``loss``, ``logits``,
``g:<param>`` (gradients of one step on x/y), ``s:<name>`` (weights after that step:
running statistics change), ``eval:<i>`` (eval outputs on x at the start weights) and per
recipe ``r<i>:w:<name>`` (weights after ``train``) and ``r<i>:loss``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from fedcore.recipe import Recipe
from sdk_device.runtimes.onnxruntime_runtime import OrtTrainingRuntime


def run_case(job_dir: Path, case: dict) -> None:
    data = np.load(job_dir / case["data"])
    weights = {k[2:]: data[k] for k in data.files if k.startswith("w:")}
    runtime = OrtTrainingRuntime(threads=1)
    runtime.load_program((job_dir / case["program"]).read_bytes(), "ort-training/1")
    out: dict[str, np.ndarray] = {}
    runtime.set_weights(weights)
    for i, logits in enumerate(runtime.predict(data["x"])):
        out[f"eval:{i}"] = logits
    extras = {k[2:]: data[k] for k in data.files if k.startswith("e:")}
    loss, logits = runtime.forward_backward(data["x"], data["y"], extras)
    out["loss"], out["logits"] = np.float64(loss), logits
    out |= {f"g:{name}": grad.copy() for name, grad in runtime.grad_views.items()}
    out |= {f"s:{name}": value for name, value in runtime.get_weights().items()}
    train_extras = {k[3:]: data[k] for k in data.files if k.startswith("te:")}
    for i, recipe in enumerate(case.get("recipes", [])):
        runtime.set_weights(weights)
        stats = runtime.train(data["tx"], data["ty"], Recipe.from_dict(recipe), extras=train_extras)
        out[f"r{i}:loss"] = np.float64(stats.loss)
        out |= {f"r{i}:w:{name}": value for name, value in runtime.get_weights().items()}
    np.savez(job_dir / f"{case['name']}.out.npz", **out)


def main(argv: list[str]) -> int:
    job_dir = Path(argv[0])
    for case in json.loads((job_dir / "job.json").read_text())["cases"]:
        run_case(job_dir, case)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
