"""Export time of a pte/1 training program, fused kernel set vs portable (no program cache).

Batch 32, cross-entropy, the programs the server builds (``export.executorch.export_with_stats``);
prints one line per (model, kernel set) with the load average when it finished.

    PYTHONPATH=. .venv/bin/python bench/export_times.py
"""

from __future__ import annotations

import os

from export.executorch import export_with_stats
from server_toolkit.models.zoo import model_spec

MODELS = [("small_cnn", (1, 8, 8), 10), ("vgg_multi_exit", (3, 32, 32), 10)]


def main() -> None:
    for model, shape, classes in MODELS:
        spec = model_spec(model, shape, classes)
        for kernels in ("fused", "portable"):
            _, stats = export_with_stats(spec, {"kind": "ce"}, 32, kernels=kernels)
            print(f"{model} {shape} {kernels}: {stats['export_s']:.1f} s (load {os.getloadavg()[0]:.1f})",
                  flush=True)


if __name__ == "__main__":
    main()
