"""RecipFL's operator graphs and graph hypernetwork (synthetic tensors; no data)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedcore import modelspec
from fedcore.torch_model import build_model, load_numpy, state_numpy
from server_toolkit.methods.recipfl.graph_hypernet import GraphHypernet, fit_to_shape
from server_toolkit.methods.recipfl.op_graph import OP_TYPES, extract_graph, pooled_weights
from server_toolkit.models.zoo import lenet5, resnet_small, small_cnn, vgg_multi_exit

pytestmark = pytest.mark.usefixtures("one_torch_thread")
SHAPE, K = (1, 8, 8), 10


def _ops(graph, indices):
    return [graph.nodes[i].op for i in indices]


def test_plain_cnn_is_a_chain_of_its_layers():
    spec = small_cnn(SHAPE, K)
    graph = extract_graph(spec)
    ops = ["input", "conv", "relu", "maxpool", "conv", "relu", "maxpool", "flatten", "linear", "relu",
           "linear", "output"]
    assert [n.op for n in graph.nodes] == ops
    assert len(graph) == len(spec["layers"]) + 2  # one node per operator, plus input and output
    assert graph.edges == tuple((i, i + 1) for i in range(len(ops) - 1))
    assert graph.nodes[1].params == (("layers.0.weight", (16, 1, 3, 3)), ("layers.0.bias", (16,)))
    assert graph.feeds_relu(1) and not graph.feeds_relu(10)


def test_residual_block_add_has_two_inputs():
    spec = modelspec.make(SHAPE, K, [
        {"op": "conv2d", "in": 1, "out": 4, "k": 3, "pad": 1}, {"op": "relu"},
        {"op": "residual",
         "body": [{"op": "conv2d", "in": 4, "out": 8, "k": 3, "pad": 1, "stride": 2},
                  {"op": "batchnorm2d", "c": 8}],
         "shortcut": [{"op": "conv2d", "in": 4, "out": 8, "k": 1, "stride": 2}]},
        {"op": "residual", "body": [{"op": "conv2d", "in": 8, "out": 8, "k": 3, "pad": 1}], "shortcut": []},
        {"op": "gap"}, {"op": "flatten"}, {"op": "linear", "in": 8, "out": K}])
    graph = extract_graph(spec)
    by_name = {n.name: i for i, n in enumerate(graph.nodes)}
    # conv, relu, [conv, bn, conv, add], [conv, add], gap, flatten, linear + input + output
    assert [n.op for n in graph.nodes].count("add") == 2 and len(graph) == 13
    names = ("layers.1", "layers.2.body.0", "layers.2.body.1", "layers.2.shortcut.0")
    relu, body_conv, body_bn, short_conv = (by_name[n] for n in names)
    adds = [i for i, n in enumerate(graph.nodes) if n.op == "add"]
    assert len(adds) == 2
    assert graph.nodes[body_conv].inputs == (relu,) and graph.nodes[short_conv].inputs == (relu,)
    assert set(graph.nodes[adds[0]].inputs) == {body_bn, short_conv}
    # identity shortcut: the add reads the block's conv and the block's own input (the first add)
    assert set(graph.nodes[adds[1]].inputs) == {by_name["layers.3.body.0"], adds[0]}
    assert set(graph.successors[relu]) == {body_conv, short_conv}
    # traversal groups respect the edges both ways
    forward = {v: k for k, group in enumerate(graph.forward_levels) for v in group}
    backward = {v: k for k, group in enumerate(graph.backward_levels) for v in group}
    assert all(forward[u] < forward[v] and backward[v] < backward[u] for u, v in graph.edges)


def test_exit_heads_feed_the_output_node():
    graph = extract_graph(vgg_multi_exit(SHAPE, K, channels=(4, 8, 8, 8)))
    output = graph.nodes[-1]
    assert output.op == "output" and len(output.inputs) == 3  # two exits and the final head
    assert all(graph.nodes[i].op == "linear" for i in output.inputs)


def test_every_op_type_is_known_and_unknown_modules_are_refused():
    graph = extract_graph(resnet_small(SHAPE, K))
    assert {n.op for n in graph.nodes} <= set(OP_TYPES)
    with pytest.raises(ValueError, match="unknown op|no graph node"):
        extract_graph({**small_cnn(SHAPE, K), "layers": [{"op": "softmax"}]})


def test_pooled_weights_are_capped_means():
    graph = extract_graph(lenet5(SHAPE, K))
    weights = state_numpy(build_model(lenet5(SHAPE, K), seed=1))
    pooled = pooled_weights(graph, weights)
    conv2 = next(i for i, n in enumerate(graph.nodes) if n.name == "layers.3")
    flat = np.concatenate([weights["layers.3.weight"].ravel(), weights["layers.3.bias"].ravel()])
    assert len(pooled[conv2]) == 128
    assert np.isclose(pooled[conv2].mean(), flat.mean(), atol=1e-4)  # near-equal chunks
    assert np.isclose(pooled[conv2][0], np.array_split(flat, 128)[0].mean(), atol=1e-6)
    assert all(len(p) == 0 for p, n in zip(pooled, graph.nodes, strict=True) if not n.params)
    small = pooled_weights(graph, weights, size=100000)
    assert len(small[conv2]) == flat.size


@pytest.mark.parametrize("model", [small_cnn, lenet5, resnet_small])
def test_generated_tensors_have_the_models_shapes_and_load(model):
    spec = model(SHAPE, K)
    graph = extract_graph(spec)
    torch.manual_seed(0)
    hn = GraphHypernet([graph], K, hidden=32, decoder_hidden=32)
    net = build_model(spec, seed=0)
    state = state_numpy(net)
    generated = hn.generate(graph, pooled_weights(graph, state), np.full(K, 1 / K))
    params = dict(net.named_parameters())
    assert set(generated) == set(params)
    assert all(tuple(generated[k].shape) == tuple(p.shape) for k, p in params.items())
    load_numpy(net, {**state, **{k: v.detach().numpy() for k, v in generated.items()}})
    (logits,) = net(torch.randn(3, *SHAPE))
    assert logits.shape == (3, K) and torch.isfinite(logits).all()


def test_one_hypernetwork_serves_architectures_larger_than_its_blocks():
    small, large = small_cnn(SHAPE, K, width=4), small_cnn(SHAPE, K, width=16)
    hn = GraphHypernet([extract_graph(small)], K, hidden=16, decoder_hidden=16)
    graph = extract_graph(large)
    generated = hn.generate(graph, pooled_weights(graph, state_numpy(build_model(large))), np.full(K, 0.1))
    assert {k: tuple(v.shape) for k, v in generated.items()} == graph.param_shapes()


def test_fit_to_shape_slices_centres_and_tiles():
    block = torch.arange(2 * 3 * 3 * 3, dtype=torch.float32).reshape(2, 3, 3, 3)
    assert torch.equal(fit_to_shape(block, (1, 2, 1, 1)), block[:1, :2, 1:2, 1:2])
    tiled = fit_to_shape(block, (5, 3, 3, 3))
    assert torch.equal(tiled[:2], block) and torch.equal(tiled[2:4], block)
    assert torch.equal(tiled[4], block[0])


def test_descriptor_and_weights_change_the_output():
    spec = small_cnn(SHAPE, K, width=4)
    graph = extract_graph(spec)
    torch.manual_seed(0)
    hn = GraphHypernet([graph], K, hidden=16, decoder_hidden=16)
    pooled = pooled_weights(graph, state_numpy(build_model(spec, seed=0)))
    uniform = hn.generate(graph, pooled, np.full(K, 0.1))
    skewed = hn.generate(graph, pooled, np.eye(K)[3])
    other = hn.generate(graph, pooled_weights(graph, state_numpy(build_model(spec, seed=5))), np.full(K, 0.1))
    name = "layers.0.weight"
    assert not torch.allclose(uniform[name], skewed[name])
    assert not torch.allclose(uniform[name], other[name])
    with pytest.raises(ValueError, match="descriptor"):
        hn.generate(graph, pooled, np.full(K + 1, 0.1))


def test_every_decoder_and_the_encoders_get_gradients():
    spec = resnet_small(SHAPE, K, widths=(4, 8))
    graph = extract_graph(spec)
    torch.manual_seed(0)
    hn = GraphHypernet([graph], K, hidden=16, decoder_hidden=16)
    pooled = pooled_weights(graph, state_numpy(build_model(spec, seed=0)))
    generated = hn.generate(graph, pooled, np.full(K, 0.1))
    loss = sum((t ** 2).sum() for t in generated.values())
    loss.backward()
    for name, p in hn.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
