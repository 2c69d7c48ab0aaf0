"""Width slicing (server_toolkit/submodels/width.py): channel spaces, sub-model specs,
index maps and extraction, on every model of the zoo."""

import numpy as np
import pytest
import torch

from fedcore.torch_model import build_model, load_numpy, state_numpy
from server_toolkit.models.zoo import ZOO, model_spec
from server_toolkit.submodels.width import extract, static_bn, width_layout, window

RATIOS = (1.0, 0.75, 0.5, 0.25)


def _spec(name: str) -> dict:
    return static_bn(model_spec(name, (1, 8, 8), 10))


def _offsets(layout, seed: int) -> dict[int, int]:
    rng = np.random.default_rng(seed)
    return {s: int(rng.integers(layout.sizes[s])) for s in layout.hidden_spaces}


def test_window_wraps_and_is_sorted():
    np.testing.assert_array_equal(window(8, 3, 6), [0, 6, 7])
    np.testing.assert_array_equal(window(8, 8, 5), np.arange(8))
    np.testing.assert_array_equal(window(8, 2, 0), [0, 1])


def test_static_bn_turns_off_running_statistics():
    spec = _spec("resnet_small")
    names = state_numpy(build_model(spec, seed=0))
    assert not any("running" in n for n in names)
    assert "running_mean" in "".join(state_numpy(build_model(model_spec("resnet_small", (1, 8, 8), 10))))


@pytest.mark.parametrize("name", sorted(ZOO))
@pytest.mark.parametrize("ratio", RATIOS)
def test_sub_model_shapes_match_the_index_map(name, ratio):
    spec = _spec(name)
    layout = width_layout(spec)
    global_weights = state_numpy(build_model(spec, seed=0))
    assert set(layout.tensors) == set(global_weights)
    plan = layout.plan(ratio, _offsets(layout, 1))
    sub = extract(global_weights, plan.index_map)
    built = state_numpy(build_model(plan.spec, seed=0))
    assert {k: v.shape for k, v in sub.items()} == {k: v.shape for k, v in built.items()}
    # input channels and class logits are never cut; hidden spaces keep ceil(r * C)
    for space, size in layout.sizes.items():
        kept = len(plan.channels[space])
        assert kept == (size if space in layout.fixed else int(np.ceil(ratio * size)))
    first = layout.units[0]
    assert sub[f"{first}.weight"].shape[1] == spec["input_shape"][0]
    assert sub[f"{layout.units[-1]}.weight"].shape[0] == 10


@pytest.mark.parametrize("name", sorted(ZOO))
def test_full_ratio_is_the_global_model(name):
    spec = _spec(name)
    layout = width_layout(spec)
    plan = layout.plan(1.0, _offsets(layout, 2))
    assert plan.spec == spec
    weights = state_numpy(build_model(spec, seed=3))
    sub = extract(weights, plan.index_map)
    assert all(np.array_equal(sub[k], weights[k]) for k in weights)


def test_consecutive_layers_share_windows_and_residuals_merge():
    layout = width_layout(_spec("resnet_small"))
    axes = layout.tensors
    # conv l+1 reads the space conv l writes
    assert axes["layers.3.body.3.weight"][1].space == axes["layers.3.body.0.weight"][0].space
    # identity shortcut: the block's output is its input space (the stem's)
    assert axes["layers.3.body.3.weight"][0].space == axes["layers.0.weight"][0].space
    # projection shortcut: body and shortcut write one merged space
    assert axes["layers.5.body.3.weight"][0].space == axes["layers.5.shortcut.0.weight"][0].space
    assert axes["layers.5.shortcut.1.weight"][0].space == axes["layers.5.body.3.weight"][0].space


def test_flattened_exit_head_keeps_every_position_of_kept_channels():
    layout = width_layout(_spec("vgg_multi_exit"))
    head = "layers.14.head.2.weight"  # exit after block 2: flatten of (64, 2, 2)
    axis = layout.tensors[head][1]
    assert axis.repeat == 4 and layout.sizes[axis.space] == 64
    plan = layout.plan(0.25, {axis.space: 62})
    kept = plan.channels[axis.space]
    np.testing.assert_array_equal(kept, [*range(14), 62, 63])  # 16 of 64 channels, wrapped
    np.testing.assert_array_equal(plan.index_map[head][1], (kept[:, None] * 4 + np.arange(4)).ravel())


@pytest.mark.parametrize("name", sorted(ZOO))
def test_sub_model_computes_the_global_model_restricted_to_its_windows(name):
    """Zero every global weight that reads a channel outside the windows: the global model
    then computes exactly what the extracted sub-model computes."""
    spec = _spec(name)
    layout = width_layout(spec)
    plan = layout.plan(0.5, _offsets(layout, 4))
    weights = state_numpy(build_model(spec, seed=5))
    for tensor, axes in layout.tensors.items():
        if len(axes) == 2:  # conv/linear weight: (out, in, ...); cut the input columns outside
            outside = np.setdiff1d(np.arange(weights[tensor].shape[1]), plan.index_map[tensor][1])
            weights[tensor][:, outside] = 0.0
    x = torch.from_numpy(np.random.default_rng(6).random((16, 1, 8, 8), dtype=np.float32))
    full, sub = build_model(spec), build_model(plan.spec)
    load_numpy(full, weights)
    load_numpy(sub, extract(weights, plan.index_map))
    full.eval()
    sub.eval()
    with torch.no_grad():
        for a, b in zip(full(x), sub(x), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
