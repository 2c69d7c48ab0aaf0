"""A ``pte/1`` program trained by following docs/protocol.md §23 alone gives the torch
runtime's update.

The program is exported by fedsdk (allowed: the server does that); everything after is the
doc's client: the method names, metadata keys and input/output names come from the doc's
machine-readable block (§23.9), the program runs in ExecuTorch's own Python bindings
(``portable_lib``, not fedsdk's runtime), the data order is the doc's generator, and the
optimizer is the doc's SGD rule written here in numpy. The result must equal
``fedcore.torch_train.train_model`` on the same weights, data and recipe within 1e-5.

The same for ``ort-training/1`` (§24): ``ort_doc_client.py`` trains the program in the ONNX
Runtime training environment with numpy and ONNX Runtime only.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from fedcore import modelspec
from fedcore.recipe import Recipe
from fedcore.torch_model import build_model, load_numpy, state_numpy
from fedcore.torch_train import predict_model, train_model
from server_toolkit.data.datasets import load_dataset
from tests.unit.pte_cache import cached_programs  # noqa: F401 - provides the program_for fixture

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
BATCH = 8
SAMPLES = 20  # batches of 8, 8 and 4: the last one is padded and masked
SPEC = modelspec.make((1, 8, 8), 10, [
    {"op": "conv2d", "in": 1, "out": 4, "k": 3, "pad": 1}, {"op": "batchnorm2d", "c": 4},
    {"op": "relu"}, {"op": "maxpool2d", "k": 2}, {"op": "flatten"},
    {"op": "linear", "in": 64, "out": 10}])
RECIPE = Recipe(epochs=2, batch_size=BATCH, lr=0.05, momentum=0.9, weight_decay=1e-3, seed=4711)
TOL = 1e-5


def doc_interface(fmt: str) -> dict:
    """The machine-readable interface block of program format ``fmt`` in docs/protocol.md."""
    text = DOC.read_text(encoding="utf-8")
    for body in re.findall(r"^```json\n(.*?)^```", text, re.S | re.M):
        block = json.loads(body)
        if isinstance(block, dict) and block.get("program_interface") == fmt:
            return block
    raise AssertionError(f"docs/protocol.md has no program_interface block for {fmt}")


class DocGenerator:
    """§23.5: torch's CPU generator: MT19937 seeded with init_genrand(seed) (numpy's legacy
    ``RandomState(seed)`` draws the same 32-bit outputs); one per step, shared by its epochs."""

    def __init__(self, seed: int) -> None:
        self.state = np.random.RandomState(seed & 0xFFFFFFFF)

    def randperm(self, n: int) -> np.ndarray:
        """Swap element i with i + (u32 % (n − i)) for i = 0 … n − 2."""
        draws = self.state.randint(0, 2**32, size=max(n - 1, 0), dtype=np.uint32)
        order = list(range(n))
        for i, u in enumerate(draws.tolist()):
            j = i + u % (n - i)
            order[i], order[j] = order[j], order[i]
        return np.array(order, dtype=np.int64)


class DocClient:
    """The client of §23, on ExecuTorch's Python bindings."""

    def __init__(self, program: bytes, iface: dict) -> None:
        from executorch.extension.pybindings import portable_lib

        self.iface = iface
        self.program = program  # kept alive: the parameters live in the loaded program (§23.3)
        self.module = portable_lib._load_for_executorch_from_buffer(program)
        self.methods = iface["methods"]
        assert set(self.methods.values()) <= set(self.module.method_names())
        self.meta = json.loads(self.module.run_method(self.methods["metadata"], [])[0])
        assert {k: self.meta[k] for k in iface["metadata_identity"]} == iface["metadata_identity"]
        assert set(self.meta) == set(iface["metadata_keys"])
        fixed_train, fixed_eval = iface["train_inputs"][:3], iface["eval_inputs"][:2]
        assert [name for name, _, _ in self.meta["train_inputs"]][:3] == fixed_train
        assert [name for name, _, _ in self.meta["eval_inputs"]][:2] == fixed_eval
        self.x_name, self.y_name, self.mask_name = fixed_train
        self.p, self.n_user = len(self.meta["params"]), len(self.meta["train_outputs"])
        assert self.meta["train_outputs"][:2] == iface["train_outputs"][:2]
        self.running = {name: (np.zeros if name.endswith("running_mean") else np.ones)(shape, np.float32)
                        for name, shape in self.meta["running"]}
        # §23.3: a train call on any valid batch (here: zeros, every row real) hands out the
        # parameter tensors, which are the program's own memory
        b = self.meta["max_batch"]
        zeros = np.zeros((b, *self.meta["input_shape"]), np.float32)
        outputs = self._train_call(zeros, np.zeros(b, np.int64))
        self.params = dict(zip(self.meta["parameter_output_order"],
                               [t.numpy() for t in outputs[self.n_user + self.p:]], strict=True))

    def _batch(self, x_nchw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(x NHWC zero-padded to max_batch, sample_mask)."""
        b, (c, h, w), real = self.meta["max_batch"], self.meta["input_shape"], len(x_nchw)
        x = np.zeros((b, h, w, c), np.float32)
        x[:real] = x_nchw.transpose(0, 2, 3, 1)
        mask = np.zeros(b, np.float32)
        mask[:real] = 1.0
        return x, mask

    def _train_call(self, x_nchw: np.ndarray, y: np.ndarray) -> list:
        import torch

        x, mask = self._batch(x_nchw)
        labels = np.zeros(self.meta["max_batch"], np.int64)
        labels[:len(y)] = y
        given = {self.x_name: x, self.y_name: labels, self.mask_name: mask, **self.running}
        inputs = [torch.from_numpy(given[name]) for name, _, _ in self.meta["train_inputs"]]
        return self.module.run_method(self.methods["train"], inputs, clone_outputs=False)

    def set_weights(self, weights: dict[str, np.ndarray]) -> None:
        for name, value in weights.items():
            if name in self.params:
                self.params[name][...] = value  # written into the program's own parameters
            else:
                self.running[name] = np.array(value, np.float32)

    def train(self, x: np.ndarray, y: np.ndarray, recipe: Recipe) -> None:
        """§23.5 batches and order, §23.6 SGD (momentum, weight decay) in float32."""
        generator = DocGenerator(recipe.seed)
        momentum: dict[str, np.ndarray] = {}
        lr, mu, wd = np.float32(recipe.lr), np.float32(recipe.momentum), np.float32(recipe.weight_decay)
        for _ in range(recipe.epochs):
            order = generator.randperm(len(y))
            for start in range(0, len(y), recipe.batch_size):
                idx = order[start:start + recipe.batch_size]
                outputs = self._train_call(x[idx], y[idx])
                for (name, _), value in zip(self.meta["running"], outputs[2:self.n_user], strict=True):
                    self.running[name] = value.numpy().copy()
                grads = dict(zip(self.meta["gradient_order"],
                                 [t.numpy() for t in outputs[self.n_user:self.n_user + self.p]], strict=True))
                for name, param in self.params.items():
                    g = grads[name] + wd * param
                    momentum[name] = g.copy() if name not in momentum else mu * momentum[name] + g
                    param -= lr * momentum[name]

    def weights(self) -> dict[str, np.ndarray]:
        return {name: value.copy() for name, value in (*self.params.items(), *self.running.items())}

    def predict(self, x_nchw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Eval method: (final logits, features) of up to max_batch samples."""
        import torch

        x, mask = self._batch(x_nchw)
        given = {self.x_name: x, self.mask_name: mask, **self.params, **self.running}
        inputs = [torch.from_numpy(np.ascontiguousarray(given[n])) for n, _, _ in self.meta["eval_inputs"]]
        out = self.module.run_method(self.methods["eval"], inputs)
        k = self.meta["num_outputs"]
        assert self.meta["eval_outputs"][k] == self.iface["eval_outputs"][-1]
        return out[k - 1].numpy()[:len(x_nchw)], out[k].numpy()[:len(x_nchw)]


@pytest.fixture(scope="module")
def digits():
    data = load_dataset("digits", seed=0)
    return data.x_train[:SAMPLES], data.y_train[:SAMPLES], data.x_test[:BATCH]


def _close(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert list(sorted(got)) == list(sorted(want))
    for name, value in want.items():
        error = float(np.abs(got[name] - value).max())
        assert error <= TOL * max(1.0, float(np.abs(value).max())), (name, error)


def test_a_pte_trained_by_the_doc_alone_gives_the_torch_runtime_update(program_for, digits):
    x, y, x_test = digits
    sent = state_numpy(build_model(SPEC, seed=3))
    client = DocClient(program_for(SPEC, {"kind": "ce"}, BATCH), doc_interface("pte/1"))
    client.set_weights(sent)
    assert _max_delta(client.weights(), sent) == 0.0  # the weights went into the program
    client.train(x, y, RECIPE)

    reference = build_model(SPEC)
    load_numpy(reference, sent)
    stats = train_model(reference, x, y, RECIPE)
    want = state_numpy(reference)
    assert stats.samples == SAMPLES and _max_delta(want, sent) > 1e-3  # training moved the weights
    _close(client.weights(), want)

    logits, features = client.predict(x_test)
    want_logits, want_features = predict_model(reference, x_test)
    _close({"logits": logits, "features": features}, {"logits": want_logits, "features": want_features})


def _max_delta(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    return max(float(np.abs(a[k] - b[k]).max()) for k in b)


def test_the_doc_generator_is_torch_randperm():
    """§23.5's description of the data order is torch's ``randperm`` with the recipe's seed."""
    import torch

    for seed, n in ((0, 1), (4711, 20), (2**31 - 1, 97)):
        torch_gen = torch.Generator().manual_seed(seed)
        doc_gen = DocGenerator(seed)
        for _ in range(2):  # two epochs from one generator
            assert doc_gen.randperm(n).tolist() == torch.randperm(n, generator=torch_gen).tolist()


def test_the_ort_training_index_has_the_names_the_doc_gives():
    """§24.2: the index keys and the training/eval graphs' input and output names."""
    import onnx

    from export.onnx import prepare_ort_program

    iface = doc_interface("ort-training/1")
    pending = prepare_ort_program(SPEC)
    index = pending.index
    assert set(index) | {"format", "files"} == set(iface["index_keys"])  # format, files: added by pack
    assert [i["name"] for i in index["inputs"]] == iface["training_inputs"][:2]
    assert index["inputs"][0]["shape"] == [None, *SPEC["input_shape"]]  # channels-first, any batch
    buffers = [b["name"] for b in index["buffers"]]
    assert index["outputs"] == [*iface["training_outputs"][:2], *(f"new:{name}" for name in buffers)]
    weights = set(state_numpy(build_model(SPEC)))
    assert index["eval_inputs"][0] == iface["eval_inputs"][0] and set(index["eval_inputs"][1:]) == weights
    eval_graph = onnx.load_from_string(pending.eval_bytes).graph
    assert [i.name for i in eval_graph.input] == index["eval_inputs"]
    assert [o.name for o in eval_graph.output] == [iface["eval_outputs"][0]]  # one output: no exit


def test_an_ort_program_trained_by_the_doc_alone_gives_the_torch_runtime_update(tmp_path, digits):
    """§24: ``ort_doc_client.py`` (numpy + ONNX Runtime only) trains 3 SGD steps; one batch
    per epoch, so the data order (§24.3 differs from torch's) cannot matter."""
    from export.onnx import export_ort_training_program
    from tests.ort_env import run_ort

    x, y = digits[0][:16], digits[1][:16]
    recipe = Recipe(epochs=3, batch_size=16, lr=0.05, momentum=0.9, weight_decay=1e-3, seed=5)
    sent = state_numpy(build_model(SPEC, seed=3))
    (tmp_path / "program").write_bytes(export_ort_training_program(SPEC, {"kind": "ce"}))
    np.savez(tmp_path / "data.npz", x=x, y=y, **{f"w:{k}": v for k, v in sent.items()})
    (tmp_path / "recipe.json").write_text(json.dumps(recipe.to_dict()))
    client = Path(__file__).with_name("ort_doc_client.py")
    run_ort([str(client), *(str(tmp_path / f) for f in ("program", "data.npz", "recipe.json", "out.npz"))],
            timeout_s=300)
    out = np.load(tmp_path / "out.npz")
    got = {k[2:]: out[k] for k in out.files}

    reference = build_model(SPEC)
    load_numpy(reference, sent)
    train_model(reference, x, y, recipe)
    want = state_numpy(reference)
    assert _max_delta(want, sent) > 1e-3
    _close(got, want)
