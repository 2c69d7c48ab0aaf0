"""manifest.json: parameter order from the spec alone, file hashes, tamper detection."""

from __future__ import annotations

import json

import pytest

from export.manifest import (
    MANIFEST_NAME,
    SCHEMA,
    architecture_hash,
    build_manifest,
    parameter_list,
    verify_bundle,
    write_bundle,
)
from fedcore import modelspec
from fedcore.recipe import Recipe
from fedcore.torch_model import build_model, state_numpy
from server_toolkit.models.zoo import ZOO, model_spec

GROUPED = modelspec.make((3, 8, 8), 4, [
    {"op": "conv2d", "in": 3, "out": 6, "k": 3, "pad": 1, "groups": 3},
    {"op": "batchnorm2d", "c": 6, "track": False}, {"op": "relu"}, {"op": "avgpool2d", "k": 2},
    {"op": "flatten"}, {"op": "linear", "in": 96, "out": 4, "bias": False}])


@pytest.mark.parametrize("spec", [model_spec(name, (3, 32, 32), 10) for name in ZOO] + [GROUPED],
                         ids=[*ZOO, "grouped"])
def test_parameters_are_listed_in_torch_state_order(spec):
    state = state_numpy(build_model(spec, seed=0))
    listed = parameter_list(spec)
    assert [(p["name"], tuple(p["shape"])) for p in listed] == [(k, v.shape) for k, v in state.items()]
    assert {p["name"] for p in listed if p["kind"] == "buffer"} == {k for k in state if "running_" in k}


def test_bundle_round_trip_and_tamper_detection(tmp_path):
    spec = model_spec("small_cnn", (1, 8, 8), 10)
    recipe = Recipe(batch_size=16, optimizer="adam", lr=1e-3)
    files = {"model.pte": ("pte/1", b"\x00program bytes"),
             "model.json": ("torchspec/1", modelspec.dumps(spec))}
    manifest = build_manifest(spec, recipe, {"kind": "ce"}, files, tier="small")
    assert manifest["schema"] == SCHEMA and manifest["tier"] == "small"
    assert manifest["architecture_hash"] == architecture_hash(spec)
    assert manifest["optimizer"]["name"] == "adam" and manifest["input"]["max_batch"] == 16
    assert [f["name"] for f in manifest["files"]] == ["model.json", "model.pte"]
    assert manifest["files"][1]["size"] == len(files["model.pte"][1])
    write_bundle(tmp_path, manifest, files)
    assert json.loads((tmp_path / MANIFEST_NAME).read_text()) == manifest
    assert verify_bundle(tmp_path) == []
    (tmp_path / "model.pte").write_bytes(b"\x01program bytes")  # same size, other content
    assert any("model.pte" in p for p in verify_bundle(tmp_path))
    (tmp_path / "model.json").unlink()
    assert any("missing" in p for p in verify_bundle(tmp_path))


def test_the_architecture_hash_changes_with_the_architecture_only():
    a = model_spec("small_cnn", (1, 8, 8), 10)
    assert architecture_hash(a) == architecture_hash(json.loads(json.dumps(a)))
    assert architecture_hash(a) != architecture_hash(model_spec("small_cnn", (1, 8, 8), 10, width=8))
