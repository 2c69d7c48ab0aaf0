"""Times ONNX Runtime training steps; run inside the ORT environment by bench/runtimes_ort.py.

``.venv-ort/bin/python bench/ort_step_worker.py PROGRAM BATCH STEPS REPEATS THREADS`` loads
an ``ort-training/1`` program, trains ``STEPS`` steps of ``BATCH`` random samples with SGD
(momentum) through ``OrtTrainingRuntime.train`` (the device's real loop: batching,
forward + backward, running statistics, optimizer) ``REPEATS`` times after one warm-up
and prints JSON: ``{"ms_per_step": median ms, "load_s": program load seconds}``.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from fedcore.recipe import Recipe
from sdk_device.runtimes.onnxruntime_runtime import OrtTrainingRuntime


def main(argv: list[str]) -> int:
    program, batch, steps, repeats, threads = Path(argv[0]), *map(int, argv[1:5])
    runtime = OrtTrainingRuntime(threads=threads)
    started = time.perf_counter()
    runtime.load_program(program.read_bytes(), "ort-training/1")
    load_s = time.perf_counter() - started
    shape = runtime.index["inputs"][0]["shape"][1:]
    classes = runtime.index["inputs"][2]["shape"][1] if runtime.index["inputs"][2:] else None
    num_classes = classes or int(runtime.predict(np.zeros((1, *shape), np.float32))[-1].shape[1])
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch * steps, *shape)).astype(np.float32)
    y = rng.integers(0, num_classes, batch * steps)
    recipe = Recipe(epochs=1, batch_size=batch, optimizer="sgd", lr=0.01, momentum=0.9)
    runtime.train(x[:batch], y[:batch], recipe)  # warm-up: first-step allocations
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        runtime.train(x, y, recipe)
        times.append((time.perf_counter() - started) * 1000 / steps)
    print(json.dumps({"ms_per_step": statistics.median(times), "load_s": load_s}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
