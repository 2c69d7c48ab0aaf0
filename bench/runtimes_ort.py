"""ONNX Runtime training speed against torch eager, for bench/runtimes.py (and alone).

For one model: export the ``ort-training/1`` program (seconds, bytes), then time training
steps of the torch runtime (``TorchRuntime.train``, this process) and of the onnxruntime
runtime (``OrtTrainingRuntime.train``, in the ORT environment via
``bench/ort_step_worker.py``): same model, same batch, same thread count, SGD with
momentum, random inputs of the model's shape. Each timing is the median over repeats of
a full pass of ``steps`` steps after a warm-up; ms/step ÷ torch eager is the headline.

Run from the repository root (needs ``.venv-ort``: ``sh scripts/setup-ort-env.sh``)::

    .venv/bin/python bench/runtimes_ort.py [--models small_cnn,vgg_multi_exit,resnet18]
                                           [--batch 32] [--steps 10] [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from export.onnx import export_ort_training_program, ort_python_path  # noqa: E402
from fedcore import modelspec  # noqa: E402
from fedcore.recipe import Recipe  # noqa: E402
from sdk_device.runtimes.torch_runtime import TorchRuntime  # noqa: E402
from server_toolkit.models.zoo import model_spec  # noqa: E402

CIFAR_SHAPE, CIFAR_CLASSES = (3, 32, 32), 10


def bench_spec(model_name: str) -> dict:
    """The benchmark models on CIFAR-sized inputs: the zoo's small CNN, HypeMeFed's
    multi-exit VGG, and a ResNet-18-style tier model (4 stages x 2 basic blocks)."""
    if model_name == "resnet18":
        return model_spec("resnet_small", CIFAR_SHAPE, CIFAR_CLASSES, widths=(64, 128, 256, 512),
                          blocks_per_stage=2)
    return model_spec(model_name, CIFAR_SHAPE, CIFAR_CLASSES)


def torch_ms_per_step(spec: dict, batch: int, steps: int, repeats: int, threads: int) -> float:
    """Median ms per training step of the torch runtime (SGD momentum, ``threads`` threads)."""
    previous = torch.get_num_threads()
    runtime = TorchRuntime(threads=threads)
    try:
        runtime.load_program(modelspec.dumps(spec), modelspec.FORMAT)
        rng = np.random.default_rng(0)
        x = rng.standard_normal((batch * steps, *spec["input_shape"])).astype(np.float32)
        y = rng.integers(0, spec["num_classes"], batch * steps)
        recipe = Recipe(epochs=1, batch_size=batch, optimizer="sgd", lr=0.01, momentum=0.9)
        runtime.train(x[:batch], y[:batch], recipe)
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            runtime.train(x, y, recipe)
            times.append((time.perf_counter() - started) * 1000 / steps)
        return statistics.median(times)
    finally:
        torch.set_num_threads(previous)


def ort_ms_per_step(program: bytes, batch: int, steps: int, repeats: int, threads: int) -> dict:
    """``{"ms_per_step", "load_s"}`` of the onnxruntime runtime, measured in the ORT env."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "program.ort"
        path.write_bytes(program)
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": str(threads)}
        done = subprocess.run([ort_python_path(), str(REPO / "bench" / "ort_step_worker.py"), str(path),
                               str(batch), str(steps), str(repeats), str(threads)],
                              env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"ORT step worker failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench_rows(model_name: str, spec: dict | None = None, batch: int = 32, steps: int = 10,
               repeats: int = 3, threads: int = 1) -> list[dict]:
    """Rows for bench/runtimes.py: the onnxruntime runtime on ``model_name`` (``spec``
    overrides the model); keys model, runtime, ms_per_step, torch_ms_per_step, vs_torch,
    program_bytes, export_s, load_s."""
    spec = spec or bench_spec(model_name)
    started = time.perf_counter()
    program = export_ort_training_program(spec)
    export_s = time.perf_counter() - started
    torch_ms = torch_ms_per_step(spec, batch, steps, repeats, threads)
    ort = ort_ms_per_step(program, batch, steps, repeats, threads)
    return [{"model": model_name, "runtime": "onnxruntime", "ms_per_step": ort["ms_per_step"],
             "torch_ms_per_step": torch_ms, "vs_torch": ort["ms_per_step"] / torch_ms,
             "program_bytes": len(program), "export_s": export_s, "load_s": ort["load_s"]}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="small_cnn,vgg_multi_exit,resnet18")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    print(f"batch {args.batch}, {args.steps} steps x {args.repeats} repeats, {args.threads} thread(s), "
          f"input {CIFAR_SHAPE}, SGD momentum; median ms per training step")
    print(f"{'model':<16} {'runtime':<12} {'ms/step':>9} {'torch ms':>9} {'÷ torch':>8} "
          f"{'program':>10} {'export s':>9} {'load s':>7}")
    for name in args.models.split(","):
        for row in bench_rows(name, batch=args.batch, steps=args.steps, repeats=args.repeats,
                              threads=args.threads):
            print(f"{row['model']:<16} {row['runtime']:<12} {row['ms_per_step']:>9.1f} "
                  f"{row['torch_ms_per_step']:>9.1f} {row['vs_torch']:>7.2f}x "
                  f"{row['program_bytes'] / 1e6:>8.2f}MB {row['export_s']:>9.1f} {row['load_s']:>7.2f}")


if __name__ == "__main__":
    main()
