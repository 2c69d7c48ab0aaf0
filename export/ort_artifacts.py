"""ONNX Runtime's artifact generation, run where ``onnxruntime-training`` is installed.

``python -m export.ort_artifacts JOB_DIR...`` reads, per job directory,
``forward.onnx`` (a training forward graph whose first output is the loss, from
``export.onnx``) and ``params.json`` (``{"trainable": [...], "frozen": [...]}``) and
writes ``out/{training_model.onnx, eval_model.onnx, optimizer_model.onnx, checkpoint}``.

This module imports only onnx and onnxruntime.training (no torch), so it also runs from
the ORT environment, whose onnx is older than the main one.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

MAX_OPTIMIZER_IR_VERSION = 10  # onnxruntime-training 1.19 refuses newer optimizer models


def build_artifacts(forward_path: Path, trainable: list[str], frozen: list[str], out_dir: Path) -> None:
    """Add the backward graph and an AdamW optimizer graph; no loss block is added because
    the forward graph already ends in the loss (its first output)."""
    import onnx
    from onnxruntime.training import artifacts

    out_dir.mkdir(parents=True, exist_ok=True)
    model = onnx.load(str(forward_path))
    artifacts.generate_artifacts(model, requires_grad=trainable, frozen_params=frozen or None, loss=None,
                                 optimizer=artifacts.OptimType.AdamW, artifact_directory=out_dir)
    optimizer_path = out_dir / "optimizer_model.onnx"
    optimizer = onnx.load(str(optimizer_path))
    if optimizer.ir_version > MAX_OPTIMIZER_IR_VERSION:
        optimizer.ir_version = MAX_OPTIMIZER_IR_VERSION
        onnx.save(optimizer, str(optimizer_path))


def build_job(job_dir: Path) -> None:
    """Build the artifacts of one job directory (see the module docstring)."""
    params = json.loads((job_dir / "params.json").read_text())
    build_artifacts(job_dir / "forward.onnx", params["trainable"], params["frozen"], job_dir / "out")


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m export.ort_artifacts JOB_DIR...", file=sys.stderr)
        return 2
    for job in argv:
        build_job(Path(job))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
