"""ONNX Runtime runtimes: training from ``ort-training/1`` programs, evaluation of ``onnx/1``.

Training (:class:`OrtTrainingRuntime`, needs the ``onnxruntime-training`` build): the
program is unpacked into a temporary directory, loaded as an ORT training ``Module``
(ORT reads its files from disk) and the directory removed. Between rounds only weights
move: ORT's parameter buffers are exposed as numpy views
(``CheckpointState.parameters[name].data`` aliases the buffer the training session
reads; so does ``.grad``), so ``set_weights`` copies into them and the optimizer updates
them in place, with no copy per step. Each step: reset gradients, run forward + backward
on one batch, store the new BatchNorm running statistics the graph returns, then one
optimizer step.

* Optimizers: torch-equivalent SGD (momentum, weight decay) and Adam written over the
  parameter and gradient views (``optimizers``); ORT's own optimizer graph is AdamW
  (decoupled decay), which differs from torch's Adam when weight decay is set.
* Batches: a fresh permutation per epoch from ``numpy.random.default_rng(recipe.seed)``;
  the graph's batch axis is dynamic, so the last, smaller batch trains as it is (no
  sample is dropped), with its loss averaged over its own samples as in torch.
* Loss recipes with teacher inputs (``kd``, ``recipfl_kt``): ``train(..., extras=)`` takes
  the per-sample teacher arrays by the names the program's index lists.
* Dropout draws its masks from ORT's own generator (not seeded by the recipe).

Evaluation (:class:`OnnxEvalRuntime`, any ``onnxruntime``): the eval graph takes every
weight as an input, so a device loads the ``onnx/1`` model once and feeds new weights
each round. An ``onnx/1`` program is that eval graph alone (``export.onnx.export_inference``).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from fedcore.recipe import Recipe

from . import ort_program
from .base import Progress, StepStats
from .optimizers import make_optimizer

EVAL_FORMAT = "onnx/1"


def cross_entropy_sum(logits: np.ndarray, labels: np.ndarray) -> float:
    """Sum over the batch of -log softmax(logits)[label]; logits (B, K), labels (B,)."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_norm = np.log(np.exp(shifted).sum(axis=1))
    return float((log_norm - shifted[np.arange(len(labels)), labels]).sum())


def _session_options(threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return options


class OnnxEvalRuntime:
    """Evaluates an eval graph (weights as inputs) with ``onnxruntime.InferenceSession``."""

    name = "onnx"
    formats: tuple[str, ...] = (EVAL_FORMAT,)

    def __init__(self, threads: int = 1) -> None:
        self.threads = threads
        self.session = None
        self.weight_names: list[str] = []
        self.weights: dict[str, np.ndarray] = {}

    def load_program(self, program: bytes, fmt: str) -> None:
        if fmt != EVAL_FORMAT:
            raise ValueError(f"{self.name} runtime cannot run {fmt!r} programs")
        self._load_eval_graph(program)

    def _load_eval_graph(self, model_bytes: bytes) -> None:
        import onnxruntime as ort

        self.session = ort.InferenceSession(model_bytes, _session_options(self.threads),
                                            providers=["CPUExecutionProvider"])
        self.weight_names = [i.name for i in self.session.get_inputs()][1:]

    def set_weights(self, weights: dict[str, np.ndarray]) -> None:
        _check_names(weights, self.weight_names)
        self.weights = {name: np.ascontiguousarray(weights[name]) for name in self.weight_names}

    def get_weights(self) -> dict[str, np.ndarray]:
        return {name: value.copy() for name, value in self.weights.items()}

    def train(self, x: np.ndarray, y: np.ndarray, recipe: Recipe,
              progress: Progress | None = None) -> StepStats:
        raise NotImplementedError(f"the {self.name} runtime only evaluates")

    def predict(self, x: np.ndarray) -> list[np.ndarray]:
        """Every output's logits (exits, final) for a batch x (B, C, H, W)."""
        if self.session is None:
            raise RuntimeError("load_program() first")
        feeds = {"input": np.ascontiguousarray(x, np.float32), **self._current_weights()}
        return self.session.run(None, feeds)

    def _current_weights(self) -> dict[str, np.ndarray]:
        return self.weights

    def evaluate(self, x: np.ndarray, y: np.ndarray, batch_size: int = 256) -> StepStats:
        total_loss = correct = 0.0
        for start in range(0, len(y), batch_size):
            logits = self.predict(x[start:start + batch_size])[-1]
            labels = y[start:start + batch_size].astype(np.int64)
            total_loss += cross_entropy_sum(logits, labels)
            correct += float((logits.argmax(axis=1) == labels).sum())
        n = max(len(y), 1)
        return StepStats(len(y), total_loss / n, correct / n)

    def outputs(self, x: np.ndarray, batch_size: int = 256) -> list[np.ndarray]:
        """Logits (N, K) of every output of the eval graph, exits then final (``Runtime.outputs``);
        ``predict`` in batches of ``batch_size``."""
        parts = [self.predict(x[start:start + batch_size]) for start in range(0, len(x), batch_size)]
        if not parts:  # no rows: every output's (0, K), from one zero row
            return [out[:0] for out in self.predict(np.zeros((1, *np.shape(x)[1:]), np.float32))]
        return [np.concatenate([part[i] for part in parts]) for i in range(len(parts[0]))]


class OrtTrainingRuntime(OnnxEvalRuntime):
    """Trains ``ort-training/1`` programs with ONNX Runtime's training API."""

    name = "onnxruntime"
    formats = (ort_program.FORMAT,)

    def __init__(self, threads: int = 1) -> None:
        super().__init__(threads)
        self.index: dict = {}
        self.module = None
        self.state = None
        self.values: dict[str, np.ndarray] = {}  # name -> view of ORT's buffer (params + running stats)
        self.grad_views: dict[str, np.ndarray] = {}

    def load_program(self, program: bytes, fmt: str) -> None:
        if fmt not in self.formats:
            raise ValueError(f"{self.name} runtime cannot run {fmt!r} programs")
        from onnxruntime.training import api

        # ORT's training API reads files; once loaded, the unpacked copies are not needed
        with tempfile.TemporaryDirectory(prefix="fedsdk-ort-") as work_dir:
            self.index, paths = ort_program.unpack(program, Path(work_dir))
            self.state = api.CheckpointState.load_checkpoint(str(paths["checkpoint"]))
            self.module = api.Module(str(paths["training_model"]), self.state,
                                     session_options=_session_options(self.threads))
            self._load_eval_graph(paths["eval_model"].read_bytes())
        self.param_names = [p["name"] for p in self.index["parameters"]]
        self.buffer_names = [b["name"] for b in self.index["buffers"]]
        self.extra_names = [i["name"] for i in self.index["inputs"][2:]]
        # numpy views of ORT's own buffers: writing them changes what the next step reads
        self.values = {n: self.state.parameters[n].data for n in self.param_names + self.buffer_names}
        self.grad_views = {}

    def _require_module(self):
        if self.module is None:
            raise RuntimeError("load_program() first")
        return self.module

    def set_weights(self, weights: dict[str, np.ndarray]) -> None:
        self._require_module()
        _check_names(weights, self.weight_names)
        for name, view in self.values.items():
            if weights[name].shape != view.shape:
                raise ValueError(f"{name}: shape {weights[name].shape}, the program has {view.shape}")
            view[...] = weights[name]

    def get_weights(self) -> dict[str, np.ndarray]:
        self._require_module()
        return {name: self.values[name].copy() for name in self.weight_names}

    def _current_weights(self) -> dict[str, np.ndarray]:
        return {name: self.values[name] for name in self.weight_names}

    def forward_backward(self, x: np.ndarray, y: np.ndarray,
                         extras: dict[str, np.ndarray] | None = None) -> tuple[float, np.ndarray]:
        """One training forward + backward on a batch: returns (loss, final logits (B, K)).
        Gradients are left in :attr:`grad_views`; running statistics are updated."""
        module = self._require_module()
        extras = extras or {}
        missing = [n for n in self.extra_names if n not in extras]
        if missing:
            raise ValueError(f"this program's loss needs per-sample inputs {missing}")
        module.lazy_reset_grad()
        outputs = module(np.ascontiguousarray(x, np.float32), np.ascontiguousarray(y, np.int64),
                         *(np.ascontiguousarray(extras[n], np.float32) for n in self.extra_names))
        for name, value in zip(self.buffer_names, outputs[2:], strict=True):
            self.values[name][...] = value
        if not self.grad_views:  # ORT allocates the gradient buffers at the first step
            self.grad_views = {name: self.state.parameters[name].grad for name in self.param_names}
        return float(outputs[0]), outputs[1]

    def train(self, x: np.ndarray, y: np.ndarray, recipe: Recipe, progress: Progress | None = None,
              extras: dict[str, np.ndarray] | None = None) -> StepStats:
        """``recipe.epochs`` passes of mini-batch training, at most ``recipe.max_steps`` steps
        when that is > 0; stats of the last epoch that ran (samples = N)."""
        self._require_module()
        extras = extras or {}
        optimizer = make_optimizer(recipe)
        params = {name: self.values[name] for name in self.param_names}
        rng = np.random.default_rng(recipe.seed)
        n, steps_per_epoch = len(y), -(-len(y) // recipe.batch_size)
        plan = recipe.epoch_steps(steps_per_epoch)  # steps per epoch; the last epoch is reported
        total, last_epoch = sum(plan), len(plan) - 1
        total_loss = correct = seen = 0.0
        done = 0
        for epoch, steps in enumerate(plan):
            order = rng.permutation(n)
            for step in range(steps):
                idx = order[step * recipe.batch_size:(step + 1) * recipe.batch_size]
                loss, logits = self.forward_backward(x[idx], y[idx], {k: v[idx] for k, v in extras.items()})
                optimizer.step(params, self.grad_views)
                done += 1
                if epoch == last_epoch:
                    total_loss += loss * len(idx)
                    correct += float((logits.argmax(axis=1) == y[idx]).sum())
                    seen += len(idx)
                if progress:
                    progress(done / total)
        return StepStats(n if seen else 0, total_loss / max(seen, 1), correct / max(seen, 1))


def _check_names(weights: dict[str, np.ndarray], expected: list[str]) -> None:
    if set(weights) != set(expected):
        missing, extra = sorted(set(expected) - set(weights)), sorted(set(weights) - set(expected))
        raise KeyError(f"weights do not fit the program: missing {missing[:5]}, unexpected {extra[:5]}")
