"""An ``ort-training/1`` client written from docs/protocol.md §24 alone (for
``test_pte_from_doc.py``); runs in the ONNX Runtime training environment (.venv-ort).

``python ort_doc_client.py PROGRAM DATA.npz RECIPE.json OUT.npz``: DATA holds ``w:<name>``
(the task's weights), ``x`` (N, C, H, W) and ``y`` (N,); RECIPE the step's recipe; OUT gets
``w:<name>`` after training. Nothing of fedsdk is imported: numpy and ONNX Runtime only.
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np


def unpack(blob: bytes, directory: Path) -> dict:
    """§24.1: the entries, checked against index.files; returns the index."""
    with zipfile.ZipFile(io.BytesIO(blob)) as archive:
        index = json.loads(archive.read("index.json"))
        if index.get("format") != "ort-training/1":
            raise ValueError(f"not an ort-training/1 program: {index.get('format')!r}")
        for name, expected in index["files"].items():
            data = archive.read(name)
            if len(data) != expected["size"] or hashlib.sha256(data).hexdigest() != expected["sha256"]:
                raise ValueError(f"{name} does not match index.files")
            (directory / Path(name).name).write_bytes(data)
    return index


def train(program: bytes, weights: dict, x: np.ndarray, y: np.ndarray, recipe: dict) -> dict:
    """§24.3 with §23.6's SGD (momentum, weight decay), float32."""
    from onnxruntime.training import api

    with tempfile.TemporaryDirectory() as tmp:
        index = unpack(program, Path(tmp))
        state = api.CheckpointState.load_checkpoint(str(Path(tmp) / "checkpoint"))
        module = api.Module(str(Path(tmp) / "training_model.onnx"), state)
    params = [p["name"] for p in index["parameters"]]
    buffers = [b["name"] for b in index["buffers"]]
    for name in params + buffers:  # weights in
        state.parameters[name].data[...] = weights[name]
    outputs = index["outputs"]
    assert [i["name"] for i in index["inputs"]][:2] == ["input", "labels"]
    assert outputs[:2] == ["loss", "logits"]
    rng = np.random.default_rng(recipe["seed"])
    lr, mu, wd = (np.float32(recipe[k]) for k in ("lr", "momentum", "weight_decay"))
    momentum: dict[str, np.ndarray] = {}
    batch = recipe["batch_size"]
    for _ in range(recipe["epochs"]):
        order = rng.permutation(len(y))
        for start in range(0, len(y), batch):
            idx = order[start:start + batch]
            module.lazy_reset_grad()
            result = module(np.ascontiguousarray(x[idx], np.float32), np.ascontiguousarray(y[idx], np.int64))
            for name, value in zip(outputs[2:], result[2:], strict=True):
                state.parameters[name.removeprefix("new:")].data[...] = value
            for name in params:
                param, grad = state.parameters[name].data, state.parameters[name].grad
                g = grad + wd * param
                momentum[name] = g.copy() if name not in momentum else mu * momentum[name] + g
                param -= lr * momentum[name]
    return {name: np.array(state.parameters[name].data) for name in params + buffers}  # update out


def main(argv: list[str]) -> int:
    program, data, recipe, out = argv
    arrays = np.load(data)
    weights = {k[2:]: arrays[k] for k in arrays.files if k.startswith("w:")}
    trained = train(Path(program).read_bytes(), weights, arrays["x"], arrays["y"],
                    json.loads(Path(recipe).read_text()))
    np.savez(out, **{f"w:{k}": v for k, v in trained.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
