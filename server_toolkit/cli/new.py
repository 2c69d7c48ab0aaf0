"""``fedsdk-server new DIR``: a small project to start from — your model, your data loader, a
``fedsdk.toml`` that ``simulate`` reads, and a README saying what to change."""

from __future__ import annotations

from pathlib import Path

import click

from .options import console

MODEL = '''"""The model every device trains: any torch.nn.Module built from the layers fedsdk can send
to devices (see docs/byo.md). fedsdk traces it into a JSON spec; width methods such as
HeteroFL give smaller devices a slice of it."""

from torch import nn


def build(input_shape, num_classes):
    """input_shape is (channels, height, width) of one sample; num_classes the label count."""
    channels, height, width = input_shape
    return nn.Sequential(
        nn.Conv2d(channels, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * (height // 4) * (width // 4), num_classes),
    )
'''

DATA = '''"""The data: load() returns (x_train, y_train, x_test, y_test) as numpy arrays; x of shape
(N, C, H, W), (N, H, W) or (N, D), y integer labels 0..K-1. simulate splits the training
part among its devices; the test part measures the global model. Replace it with yours."""

import numpy as np
from sklearn.datasets import load_digits


def load():
    digits = load_digits()  # 1,797 8x8 handwritten digits, bundled with scikit-learn
    x = (digits.images / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(y))
    x, y = x[order], y[order]
    cut = int(0.8 * len(y))
    return x[:cut], y[:cut], x[cut:], y[cut:]
'''

CONFIG = '''# Options of `fedsdk-server simulate` (and of `run`, in a [run] table); flags override them.
[simulate]
model = "model.py:build"
dataset = "data.py:load"
method = "heterofl"          # fedsdk-server methods list
tiers = ["1.0", "0.5"]       # HeteroFL: half the devices train a half-width model
devices = 4
rounds = 3
local-epochs = 1
partition = "iid"
grid = "inprocess"           # "mqtt": one process per device over a broker, as on real devices
runs-dir = "runs"
'''

README = '''# {name}

A federated-learning project made by `fedsdk-server new`.

| file          | what it is                                                          |
|---------------|---------------------------------------------------------------------|
| `model.py`    | `build(input_shape, num_classes)` returns the `torch.nn.Module`     |
| `data.py`     | `load()` returns `(x_train, y_train, x_test, y_test)`               |
| `fedsdk.toml` | the options `fedsdk-server simulate` reads here (flags override)    |

Run it:

    fedsdk-server simulate

Each run is a directory under `runs/` with `config.json` (the resolved options),
`metrics.jsonl`, `accuracy.png` and `summary.json`. Try `--rounds 10`, `--grid mqtt`
(real device processes over a local broker) or another `--method`
(`fedsdk-server methods list`). To serve real devices, see `fedsdk-server run --help`.
'''

FILES = {"model.py": MODEL, "data.py": DATA, "fedsdk.toml": CONFIG, "README.md": README}


@click.command("new")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
def new(directory: Path) -> None:
    """Make a small project in DIRECTORY (model.py, data.py, fedsdk.toml, README.md) that
    `fedsdk-server simulate` runs as it is."""
    clashes = [name for name in FILES if (directory / name).exists()]
    if clashes:
        raise click.ClickException(f"{directory / clashes[0]} exists; choose a new directory")
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in FILES.items():
        (directory / name).write_text(text.replace("{name}", directory.resolve().name))
    console.print(f"made {directory}: {', '.join(FILES)}; next: cd {directory} && fedsdk-server simulate")
