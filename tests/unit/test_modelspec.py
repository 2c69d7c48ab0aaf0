"""Unit tests of torchspec/1 specs, the torch model builder and the model zoo."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fedcore import modelspec
from fedcore.modelspec import SpecError
from fedcore.torch_model import Exit, Residual, build_model, load_numpy, state_numpy
from server_toolkit.models import zoo

SHAPES = [(1, 8, 8), (1, 28, 28), (3, 32, 32)]
EXPECTED_OUTPUTS = {"small_cnn": 1, "lenet5": 1, "vgg_multi_exit": 3, "resnet_small": 1}


def _spec(layers, input_shape=(1, 4, 4), num_classes=3) -> dict:
    return {"format": modelspec.FORMAT, "input_shape": list(input_shape), "num_classes": num_classes,
            "layers": layers}


def _conv(cin, cout, k=3, **kw):
    return {"op": "conv2d", "in": cin, "out": cout, "k": k, **kw}


TINY = _spec([_conv(1, 2, pad=1), {"op": "batchnorm2d", "c": 2}, {"op": "relu"},
              {"op": "exit", "head": [{"op": "gap"}, {"op": "flatten"}, {"op": "linear", "in": 2, "out": 3}]},
              {"op": "residual", "body": [_conv(2, 2, pad=1)], "shortcut": []},
              {"op": "maxpool2d", "k": 2}, {"op": "flatten"}, {"op": "linear", "in": 8, "out": 3}])


# ---- zoo -----------------------------------------------------------------------------------

def test_zoo_has_the_expected_models():
    assert set(zoo.ZOO) == set(EXPECTED_OUTPUTS)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", sorted(EXPECTED_OUTPUTS))
def test_zoo_model_builds_and_runs(name, shape):
    classes = 7
    spec = zoo.model_spec(name, shape, classes)
    modelspec.validate(spec)
    assert spec["input_shape"] == list(shape) and spec["num_classes"] == classes
    assert modelspec.num_outputs(spec) == EXPECTED_OUTPUTS[name]
    model = build_model(spec, seed=0).eval()
    with torch.no_grad():
        outputs = model(torch.randn(2, *shape))
    assert isinstance(outputs, tuple) and len(outputs) == EXPECTED_OUTPUTS[name]
    for out in outputs:
        assert out.shape == (2, classes)
        assert torch.isfinite(out).all()
    # the spec survives the wire unchanged
    assert modelspec.loads(modelspec.dumps(spec)) == spec


def test_zoo_unknown_model():
    with pytest.raises(ValueError, match="small_cnn"):
        zoo.model_spec("nope", (1, 8, 8), 10)


def test_zoo_kwargs_are_passed():
    spec = zoo.model_spec("small_cnn", (1, 8, 8), 10, width=4)
    assert spec["layers"][0]["out"] == 4
    assert zoo.model_spec("vgg_multi_exit", (1, 8, 8), 10, exits_after=()) and \
        modelspec.num_outputs(zoo.model_spec("vgg_multi_exit", (1, 8, 8), 10, exits_after=())) == 1


# ---- dumps / loads ---------------------------------------------------------------------------

def test_dumps_loads_round_trip():
    assert modelspec.loads(modelspec.dumps(TINY)) == TINY


def test_dumps_is_canonical():
    shuffled = json.loads(json.dumps(TINY))
    shuffled = {k: shuffled[k] for k in reversed(list(shuffled))}
    shuffled["layers"] = [{k: layer[k] for k in reversed(list(layer))} for layer in shuffled["layers"]]
    assert list(shuffled) != list(TINY)
    assert modelspec.dumps(shuffled) == modelspec.dumps(TINY)
    assert b" " not in modelspec.dumps(TINY)


def test_make_copies_and_validates():
    layers = [{"op": "flatten"}, {"op": "linear", "in": 16, "out": 3}]
    spec = modelspec.make((1, 4, 4), 3, layers)
    layers[1]["out"] = 99
    assert spec["layers"][1]["out"] == 3
    with pytest.raises(SpecError):
        modelspec.make((1, 4, 4), 3, layers)


@pytest.mark.parametrize("data", [b"not json", b"\xff", b"[]", b"{}", b'{"format": "torchspec/2"}'])
def test_loads_rejects_garbage(data):
    with pytest.raises(SpecError):
        modelspec.loads(data)


# ---- validation ----------------------------------------------------------------------------------

FLAT = [{"op": "flatten"}, {"op": "linear", "in": 16, "out": 3}]


@pytest.mark.parametrize("spec,match", [
    (_spec([{"op": "softmax"}, *FLAT]), "unknown op"),
    (_spec([{"kind": "relu"}, *FLAT]), "'op'"),
    (_spec(["relu", *FLAT]), "'op'"),
    (_spec([_conv(3, 4, pad=1), {"op": "flatten"}, {"op": "linear", "in": 64, "out": 3}]), "channels"),
    (_spec([_conv(1, 4, pad=1), {"op": "batchnorm2d", "c": 5}, *FLAT]), "batchnorm2d"),
    (_spec([{"op": "flatten"}, {"op": "linear", "in": 15, "out": 3}]), "features"),
    (_spec([{"op": "linear", "in": 16, "out": 3}]), "features"),       # linear on a 3-d input
    (_spec([{"op": "flatten"}, {"op": "linear", "in": 16, "out": 4}]), "final output"),
    (_spec([{"op": "exit", "head": [{"op": "flatten"}, {"op": "linear", "in": 16, "out": 2}]}, *FLAT]),
     "expected"),
    (_spec([{"op": "exit", "head": [{"op": "relu"}]}, *FLAT]), "expected"),  # head leaves (C,H,W)
    (_spec([{"op": "exit"}, *FLAT]), "must be a list"),
    (_spec([{"op": "exit", "head": [{"op": "exit", "head": FLAT}, *FLAT]}, *FLAT]), "cannot contain"),
    (_spec([{"op": "residual", "body": [_conv(1, 2, pad=1)], "shortcut": []}, *FLAT]), "shortcut gives"),
    (_spec([{"op": "residual", "body": [_conv(1, 1)], "shortcut": []}, *FLAT]), "shortcut gives"),
    (_spec([{"op": "residual", "body": [_conv(1, 1, pad=1)], "shortcut": [{"op": "maxpool2d", "k": 2}]},
            *FLAT]), "shortcut gives"),
    (_spec([{"op": "residual", "shortcut": []}, *FLAT]), "must be a list"),
    (_spec([_conv(1, 2, k=5), *FLAT]), "leaves nothing"),
    (_spec([_conv(1, 2, k=3, stride=0), *FLAT]), "stride"),
    (_spec([_conv(1, 2, k=3, pad=-1), *FLAT]), "pad"),
    (_spec([_conv(1, 2, k=0), *FLAT]), "'k'"),
    (_spec([_conv(1, 2, k=True), *FLAT]), "'k'"),
    (_spec([_conv(1, 2, k=1.5), *FLAT]), "'k'"),
    (_spec([{"op": "maxpool2d", "k": 5}, *FLAT]), "maxpool2d"),
    (_spec([{"op": "flatten"}, {"op": "gap"}, {"op": "linear", "in": 16, "out": 3}]), "gap"),
    (_spec([{"op": "dropout", "p": 1.0}, *FLAT]), "dropout"),
    (_spec([{"op": "dropout", "p": -0.1}, *FLAT]), "dropout"),
    (_spec(FLAT, input_shape=(1, 4)), "input_shape"),
    (_spec(FLAT, input_shape=(0, 4, 4)), "input_shape"),
    (_spec(FLAT, num_classes=0), "num_classes"),
    (_spec(FLAT, num_classes=True), "num_classes"),
    (_spec("not a list"), "must be a list"),
    ({**_spec(FLAT), "format": "torchspec/2"}, "torchspec/1"),
])
def test_invalid_specs(spec, match):
    with pytest.raises(SpecError, match=match):
        modelspec.validate(spec)
    with pytest.raises(SpecError):
        modelspec.loads(json.dumps(spec).encode())


def test_valid_residual_with_projection_shortcut():
    layer = {"op": "residual", "body": [_conv(1, 2, pad=1, stride=2)],
             "shortcut": [_conv(1, 2, k=1, stride=2)]}
    spec = _spec([layer, {"op": "flatten"}, {"op": "linear", "in": 8, "out": 3}])
    out, exits = modelspec.infer_shapes(spec["layers"], (1, 4, 4), "layers")
    assert out == (3,) and exits == []
    model = build_model(spec, seed=1)
    assert isinstance(model.layers[0], Residual)
    assert model(torch.randn(5, 1, 4, 4))[0].shape == (5, 3)


def test_infer_shapes_matches_torch():
    out, exits = modelspec.infer_shapes(TINY["layers"], (1, 4, 4), "layers")
    assert out == (3,) and exits == [("layers[3]", (3,))]
    model = build_model(TINY, seed=0)
    assert isinstance(model.layers[3], Exit)
    outputs = model(torch.randn(4, 1, 4, 4))
    assert [tuple(o.shape) for o in outputs] == [(4, 3), (4, 3)]


def test_exit_does_not_change_the_trunk():
    head = [{"op": "flatten"}, {"op": "linear", "in": 16, "out": 3}]
    with_exit = _spec([{"op": "exit", "head": head}, *FLAT])
    without = _spec(FLAT)
    a, b = build_model(with_exit, seed=3), build_model(without, seed=3)
    trunk = {k.replace("layers.1.", "layers.2."): v for k, v in state_numpy(b).items()}
    load_numpy(a, {**trunk, "layers.0.head.1.weight": np.zeros((3, 16), np.float32),
                   "layers.0.head.1.bias": np.zeros(3, np.float32)})
    x = torch.randn(2, 1, 4, 4)
    exit_out, final = a(x)
    assert torch.equal(exit_out, torch.zeros(2, 3))
    assert torch.allclose(final, b(x)[0])


def test_spec_without_layers_is_spec_error():
    with pytest.raises(SpecError):
        modelspec.loads(b'{"format":"torchspec/1","input_shape":[1,8,8],"num_classes":2}')


def test_dropout_p_string_is_spec_error():
    with pytest.raises(SpecError):
        modelspec.validate(_spec([{"op": "dropout", "p": "x"}, *FLAT]))


# ---- weights ---------------------------------------------------------------------------------------

def test_state_numpy_names_and_no_batch_counter():
    model = build_model(TINY, seed=0)
    state = state_numpy(model)
    assert not any(k.endswith("num_batches_tracked") for k in state)
    assert any(k.endswith("num_batches_tracked") for k in model.state_dict())
    assert {"layers.0.weight", "layers.0.bias", "layers.1.running_mean", "layers.1.running_var",
            "layers.3.head.2.weight", "layers.4.body.0.weight", "layers.7.bias"} <= set(state)
    assert all(isinstance(v, np.ndarray) for v in state.values())
    # a copy: changing the numpy array does not touch the model
    state["layers.0.weight"][:] = 123.0
    assert not torch.all(model.layers[0].weight == 123.0)


def test_load_numpy_round_trip():
    a, b = build_model(TINY, seed=1), build_model(TINY, seed=2)
    wa = state_numpy(a)
    assert not np.array_equal(wa["layers.0.weight"], state_numpy(b)["layers.0.weight"])
    load_numpy(b, wa)
    wb = state_numpy(b)
    assert set(wa) == set(wb)
    for k in wa:
        np.testing.assert_array_equal(wa[k], wb[k])
    x = torch.randn(3, 1, 4, 4)
    a.eval()
    b.eval()
    for oa, ob in zip(a(x), b(x), strict=True):
        assert torch.equal(oa, ob)


def test_load_numpy_key_mismatch():
    model = build_model(TINY, seed=0)
    w = state_numpy(model)
    missing = dict(w)
    del missing["layers.0.bias"]
    with pytest.raises(KeyError, match="layers.0.bias"):
        load_numpy(model, missing)
    with pytest.raises(KeyError, match="bogus"):
        load_numpy(model, {**w, "bogus": np.zeros(1, np.float32)})


def test_load_numpy_shape_mismatch_raises():
    model = build_model(TINY, seed=0)
    w = state_numpy(model)
    w["layers.0.weight"] = np.zeros((2, 1, 2, 2), np.float32)
    with pytest.raises((ValueError, RuntimeError)):
        load_numpy(model, w)


def test_build_model_seed_is_reproducible():
    a, b, c = (state_numpy(build_model(TINY, seed=s)) for s in (5, 5, 6))
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    assert not np.array_equal(a["layers.0.weight"], c["layers.0.weight"])


def test_build_model_seed_does_not_disturb_global_rng():
    torch.manual_seed(42)
    expected = torch.rand(3)
    torch.manual_seed(42)
    build_model(TINY, seed=7)
    assert torch.equal(torch.rand(3), expected)


def test_bias_false_has_no_bias():
    spec = _spec([_conv(1, 2, pad=1, bias=False), {"op": "flatten"},
                  {"op": "linear", "in": 32, "out": 3, "bias": False}])
    assert set(state_numpy(build_model(spec))) == {"layers.0.weight", "layers.2.weight"}
