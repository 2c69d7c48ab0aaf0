"""Train once on the executorch-native runtime (meant to run under ``tests.torchless.run``).

Usage: ``python -m tests.torchless.train_once PROGRAM.pte IN.npz OUT.npz``. IN holds ``x``,
``y``, the recipe as JSON in ``recipe`` and the weights as ``w:<name>``; OUT gets the trained
weights (``w:<name>``) and the stats (``loss``, ``accuracy``, ``samples``).
"""

from __future__ import annotations

import json
import sys

import numpy as np

from fedcore.recipe import Recipe
from sdk_device.runtimes.registry import create_runtime


def main() -> None:
    program_path, in_path, out_path = sys.argv[1:4]
    data = np.load(in_path)
    runtime = create_runtime("executorch-native")
    with open(program_path, "rb") as f:
        runtime.load_program(f.read(), "pte/1")
    runtime.set_weights({k[2:]: data[k] for k in data.files if k.startswith("w:")})
    runtime.dropout_enabled = bool(data["dropout"])
    stats = runtime.train(data["x"], data["y"], Recipe.from_dict(json.loads(str(data["recipe"]))))
    trained = {f"w:{k}": v for k, v in runtime.get_weights().items()}
    np.savez(out_path, loss=stats.loss, accuracy=stats.accuracy, samples=stats.samples, **trained)


if __name__ == "__main__":
    main()
