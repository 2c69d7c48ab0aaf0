"""``manifest.json``: what an exported bundle contains, for the server, devices and audits.

Schema ``fedsdk-manifest/1`` (a JSON object)::

    schema             "fedsdk-manifest/1"
    architecture_hash  sha256 of the spec's canonical bytes (modelspec.dumps): equal
                       architectures share programs, so devices re-fetch programs only
                       when this changes
    tier               tier name the bundle was exported for (null if none)
    spec               the torchspec/1 spec itself
    parameters         [{"name", "shape", "kind"}] in the model's state order; kind is
                       "parameter" (trained) or "buffer" (BN running statistics)
    input              {"x": {"shape": [C, H, W], "dtype", "layout"}, "y": {...},
                        "max_batch": B}
    recipe             the training recipe dict (epochs, batch_size, optimizer, lr, ...)
    loss               the loss dict (see fedcore.losses)
    optimizer          {"name", "lr", "momentum", "weight_decay", ("betas", "eps"), ("prox_mu")}: the
                       update rule every runtime applies (fedcore.optimizers)
    files              [{"name", "format", "sha256", "size"}], sorted by name

No torch needed: parameter shapes are derived from the spec.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from fedcore import modelspec
from fedcore.recipe import Recipe
from sdk_device.runtimes.optimizers import ADAM_BETAS, ADAM_EPS

SCHEMA = "fedsdk-manifest/1"
MANIFEST_NAME = "manifest.json"


def architecture_hash(spec: dict) -> str:
    """sha256 (hex) of the spec's canonical bytes."""
    return hashlib.sha256(modelspec.dumps(spec)).hexdigest()


def parameter_list(spec: dict) -> list[dict]:
    """[{"name", "shape", "kind"}] of the model's weights in state order (as
    ``torch_model.state_numpy`` lists them)."""
    out: list[dict] = []
    _collect(spec["layers"], "layers", out)
    return out


def _collect(layers: list[dict], prefix: str, out: list[dict]) -> None:
    for i, layer in enumerate(layers):
        name, op = f"{prefix}.{i}", layer["op"]
        if op == "conv2d":
            k = layer["k"]
            out.append(_entry(f"{name}.weight", [layer["out"], layer["in"] // layer.get("groups", 1), k, k]))
            if layer.get("bias", True):
                out.append(_entry(f"{name}.bias", [layer["out"]]))
        elif op == "linear":
            out.append(_entry(f"{name}.weight", [layer["out"], layer["in"]]))
            if layer.get("bias", True):
                out.append(_entry(f"{name}.bias", [layer["out"]]))
        elif op == "batchnorm2d":
            c = layer["c"]
            out += [_entry(f"{name}.weight", [c]), _entry(f"{name}.bias", [c])]
            if layer.get("track", True):
                out += [_entry(f"{name}.running_mean", [c], "buffer"),
                        _entry(f"{name}.running_var", [c], "buffer")]
        elif op == "residual":
            _collect(layer["body"], f"{name}.body", out)
            _collect(layer.get("shortcut", []), f"{name}.shortcut", out)
        elif op == "exit":
            _collect(layer["head"], f"{name}.head", out)


def _entry(name: str, shape: list[int], kind: str = "parameter") -> dict:
    return {"name": name, "shape": shape, "kind": kind}


def optimizer_entry(recipe: Recipe) -> dict:
    """The update rule; ``prox_mu`` (FedProx) only when it is not 0."""
    prox = {"prox_mu": recipe.prox_mu} if recipe.prox_mu else {}
    if recipe.optimizer == "adam":
        return {"name": "adam", "lr": recipe.lr, "weight_decay": recipe.weight_decay,
                "betas": list(ADAM_BETAS), "eps": ADAM_EPS, **prox}
    return {"name": "sgd", "lr": recipe.lr, "momentum": recipe.momentum, "weight_decay": recipe.weight_decay,
            **prox}


def file_entry(name: str, data: bytes, fmt: str) -> dict:
    return {"name": name, "format": fmt, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


def build_manifest(spec: dict, recipe: Recipe, loss: dict, files: dict[str, tuple[str, bytes]],
                   tier: str | None = None, max_batch: int | None = None) -> dict:
    """The manifest of a bundle. ``files``: file name -> (format, bytes)."""
    modelspec.validate(spec)
    return {
        "schema": SCHEMA,
        "architecture_hash": architecture_hash(spec),
        "tier": tier,
        "spec": spec,
        "parameters": parameter_list(spec),
        "input": {"x": {"shape": list(spec["input_shape"]), "dtype": "float32", "layout": "NCHW"},
                  "y": {"shape": [], "dtype": "int64", "num_classes": spec["num_classes"]},
                  "max_batch": max_batch or recipe.batch_size},
        "recipe": recipe.to_dict(),
        "loss": loss,
        "optimizer": optimizer_entry(recipe),
        "files": [file_entry(name, data, fmt) for name, (fmt, data) in sorted(files.items())],
    }


def write_bundle(out_dir: Path, manifest: dict, files: dict[str, tuple[str, bytes]]) -> Path:
    """Write every file and ``manifest.json`` into ``out_dir``; returns the manifest path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, (_, data) in files.items():
        (out_dir / name).write_bytes(data)
    path = out_dir / MANIFEST_NAME
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return path


def verify_bundle(out_dir: Path) -> list[str]:
    """Problems found checking a written bundle against its manifest ([] = all good)."""
    out_dir = Path(out_dir)
    manifest = json.loads((out_dir / MANIFEST_NAME).read_text())
    problems = []
    if manifest.get("schema") != SCHEMA:
        problems.append(f"schema {manifest.get('schema')!r} is not {SCHEMA}")
    if manifest.get("architecture_hash") != architecture_hash(manifest["spec"]):
        problems.append("architecture_hash does not match the spec")
    for entry in manifest["files"]:
        path = out_dir / entry["name"]
        if not path.is_file():
            problems.append(f"{entry['name']}: missing")
            continue
        data = path.read_bytes()
        if len(data) != entry["size"] or hashlib.sha256(data).hexdigest() != entry["sha256"]:
            problems.append(f"{entry['name']}: size or sha256 differs from the manifest")
    return problems
