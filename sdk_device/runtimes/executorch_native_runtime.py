"""Torch-free ExecuTorch runtime: trains ``pte/1`` programs through the native shim (ctypes).

Same programs, same maths and same interface as ``executorch_runtime.ExecutorchRuntime`` (the
Python-bindings path, which imports torch), but nothing here imports torch or loads libtorch:
the program runs in the ExecuTorch C++ runtime of the ``executorch`` wheel's shared libraries
(``native_program`` / ``native_build``), data and weights are numpy arrays.

* The training method returns the gradients and the parameter tensors; the parameters alias
  the program's own memory, so ``set_weights`` writes into numpy views of them in place and
  the optimizer (``optimizers``: torch's SGD / Adam rules in numpy) updates them there.
* BatchNorm running statistics are program inputs/outputs kept here. A short last batch is
  zero-padded and masked (exact). Programs take channels-last input, transposed once per call.
* Data order and dropout masks come from ``torch_rng.TorchCpuGenerator`` seeded with the
  recipe's seed: bit-identical to the torch runtime's ``torch.randperm`` / ``torch.rand``.
* A program exported with ``kernels="fused"`` (metadata "kernels") needs the fused kernels
  library (``fused_kernels``, built on first use like the shim); without it ``load_program``
  raises ``UnsupportedKernels`` (refusal code ``unsupported_kernels``).
* Registered as ``executorch-native``; "installed" when the wheel's native files exist and
  the shim is built or a compiler can build it on first use.
"""

from __future__ import annotations

import json

import numpy as np

from fedcore.recipe import Recipe

from .base import Progress, StepStats
from .optimizers import make_optimizer
from .pte_contract import FORMAT, KERNELS_KEY, META_METHOD, PORTABLE, SCHEMA
from .torch_rng import TorchCpuGenerator


class NativeExecutorchRuntime:
    """Runs pte/1 training programs with the ExecuTorch C++ runtime, without torch."""

    name = "executorch-native"
    formats = (FORMAT,)

    def __init__(self, threads: int | None = None) -> None:
        from . import native_program

        self._native = native_program
        if threads:
            native_program.set_threads(threads)
        self._init_state()

    def _init_state(self) -> None:
        self.program = None
        self.meta: dict = {}
        self.dropout_enabled = True  # a parity check switches dropout off in every runtime
        self._params: dict[str, np.ndarray] = {}  # views of the program's parameter memory
        self._running: dict[str, np.ndarray] = {}
        self._weight_order: list[str] = []

    # -- program -------------------------------------------------------------------------------
    def load_program(self, program: bytes, fmt: str) -> None:
        if fmt not in self.formats:
            raise ValueError(f"{self.name} runtime cannot run {fmt!r} programs")
        loaded = self._open(program)
        if META_METHOD not in loaded.method_names():
            raise ValueError("not a fedsdk training program: no metadata method")
        meta = json.loads(loaded.run(META_METHOD, [])[0])
        if meta.get("format") != FORMAT or meta.get("schema") != SCHEMA:
            raise ValueError(f"program format {meta.get('format')}/{meta.get('schema')} is not {FORMAT}")
        kernels = meta.get(KERNELS_KEY, PORTABLE)
        if kernels != PORTABLE:
            self._require_kernels(kernels)  # before "train" is first run: its operators resolve then
        self.program, self.meta = loaded, meta
        # One step on a zero batch returns the parameter tensors; they alias program memory.
        outputs = self.program.run("train", self._zero_train_inputs())
        n_user, n_params = len(meta["train_outputs"]), len(meta["params"])
        shapes = {name: tuple(shape) for name, shape in meta["params"]}
        self._params = {}
        for name, array in zip(meta["parameter_output_order"], outputs[n_user + n_params:], strict=True):
            if array.shape != shapes[name]:
                raise ValueError(f"program parameter {name} has shape {array.shape}, "
                                 f"metadata says {shapes[name]}")
            self._params[name] = array
        self._running = {name: np.zeros(shape, np.float32) if name.endswith("mean") else
                         np.ones(shape, np.float32) for name, shape in meta["running"]}
        self._weight_order = [name for name, _ in meta["params"]] + list(self._running)

    def _open(self, program: bytes):
        """The loaded program: ``run(method, [numpy]) -> outputs`` and ``method_names()``."""
        return self._native.NativeProgram(program)

    def _require_kernels(self, kernel_set: str) -> None:
        """Register ``kernel_set``'s kernels (libfedsdk_kernels) or raise UnsupportedKernels."""
        from . import fused_kernels

        fused_kernels.require(kernel_set)

    def _require(self) -> None:
        if self.program is None:
            raise RuntimeError("load_program() first")

    def _zero_train_inputs(self) -> list[np.ndarray]:
        arrays = []
        for name, shape, dtype in self.meta["train_inputs"]:
            if dtype == "int64":
                arrays.append(np.zeros(shape, np.int64))
            elif name == "sample_mask" or name.startswith("dropout:") or name.endswith("running_var"):
                arrays.append(np.ones(shape, np.float32))
            else:
                arrays.append(np.zeros(shape, np.float32))
        return arrays

    # -- weights -------------------------------------------------------------------------------
    def set_weights(self, weights: dict[str, np.ndarray]) -> None:
        """Write ``weights`` (the model's parameters and BN running stats) into the program."""
        self._require()
        own = set(self._params) | set(self._running)
        if set(weights) != own:
            missing, extra = sorted(own - set(weights)), sorted(set(weights) - own)
            raise KeyError(f"weights do not fit the program: missing {missing[:5]}, unexpected {extra[:5]}")
        for name, value in weights.items():
            target = self._params.get(name, self._running.get(name))
            if tuple(value.shape) != target.shape:
                raise ValueError(f"{name}: shape {tuple(value.shape)}, program has {target.shape}")
        for name, value in weights.items():
            if name in self._params:
                self._params[name][...] = value
            else:
                self._running[name] = np.array(value, dtype=np.float32, copy=True)
        self._weight_order = list(weights)

    def get_weights(self) -> dict[str, np.ndarray]:
        self._require()
        return {name: np.array(self._params[name] if name in self._params else self._running[name],
                               copy=True) for name in self._weight_order}

    # -- training ------------------------------------------------------------------------------
    def train(self, x: np.ndarray, y: np.ndarray, recipe: Recipe, progress: Progress | None = None,
              extras: dict[str, np.ndarray] | None = None) -> StepStats:
        """``recipe.epochs`` passes of mini-batch training (loss and optimizer of the program
        and recipe), at most ``recipe.max_steps`` steps when that is > 0. ``extras``: per-sample
        teacher arrays the program's loss reads, e.g. {"teacher_logits": (N, K)}. Returns the
        last epoch's (partial when cut short) mean loss and accuracy, samples = N."""
        self._require()
        meta = self.meta
        batch = recipe.batch_size
        if batch > meta["max_batch"]:
            raise ValueError(f"recipe batch {batch} exceeds the program's batch {meta['max_batch']}")
        extras = extras or {}
        missing = [name for name, _ in meta["extras"] if name not in extras]
        if missing:
            raise ValueError(f"the program's loss needs {missing}")
        optimizer = make_optimizer(recipe)
        xt = _channels_last(x)
        yt = np.asarray(y).astype(np.int64)
        extra_t = {name: np.ascontiguousarray(extras[name], np.float32) for name, _ in meta["extras"]}
        gen = TorchCpuGenerator(recipe.seed)
        n, steps_per_epoch = len(yt), -(-len(yt) // batch)
        n_user, n_params = len(meta["train_outputs"]), len(meta["params"])
        plan = recipe.epoch_steps(steps_per_epoch)  # steps per epoch; the last epoch is reported
        total, last_epoch = sum(plan), len(plan) - 1
        total_loss = correct = seen = 0.0
        done = 0
        for epoch, steps in enumerate(plan):
            order = gen.randperm(n)
            for step in range(steps):
                idx = order[step * batch:(step + 1) * batch]
                inputs = self._train_inputs(xt[idx], yt[idx], {k: v[idx] for k, v in extra_t.items()}, gen)
                outputs = self.program.run("train", inputs)
                loss = float(outputs[0])
                for (name, _), value in zip(meta["running"], outputs[2:n_user], strict=True):
                    self._running[name] = value.copy()
                grads = dict(zip(meta["gradient_order"], outputs[n_user:n_user + n_params], strict=True))
                optimizer.step(self._params, grads)
                done += 1
                if epoch == last_epoch:
                    real = len(idx)
                    total_loss += loss * real
                    correct += float((outputs[1][:real] == yt[idx]).sum())
                    seen += real
                if progress:
                    progress(done / total)
        return StepStats(n if seen else 0, total_loss / max(seen, 1), correct / max(seen, 1))

    def gradients(self, x: np.ndarray, y: np.ndarray, extras: dict[str, np.ndarray] | None = None,
                  dropout_masks: list[np.ndarray] | None = None
                  ) -> tuple[float, dict[str, np.ndarray], dict[str, np.ndarray]]:
        """One forward+backward on one batch without updating anything (for parity checks).

        ``dropout_masks``: one (N, *shape) array per dropout layer (0 or 1/(1-p)); None =
        no dropout. Returns (loss, gradients by parameter name, updated running stats).
        """
        self._require()
        meta = self.meta
        extras_t = {name: np.ascontiguousarray(extras[name], np.float32) for name, _ in meta["extras"]}
        masks = None if dropout_masks is None else [np.ascontiguousarray(m, np.float32)
                                                     for m in dropout_masks]
        labels = np.asarray(y).astype(np.int64)
        outputs = self.program.run("train", self._train_inputs(_channels_last(x), labels, extras_t,
                                                                None, masks))
        n_user, n_params = len(meta["train_outputs"]), len(meta["params"])
        grads = {name: g.copy() for name, g in zip(meta["gradient_order"],
                                                   outputs[n_user:n_user + n_params], strict=True)}
        running = {name: v.copy() for (name, _), v in zip(meta["running"], outputs[2:n_user], strict=True)}
        return float(outputs[0]), grads, running

    def _train_inputs(self, xb: np.ndarray, yb: np.ndarray, extras: dict[str, np.ndarray],
                      gen: TorchCpuGenerator | None, dropout_masks: list[np.ndarray] | None = None
                      ) -> list[np.ndarray]:
        """The training method's inputs for one batch, padded to the program's batch.
        Dropout masks are ``dropout_masks`` if given, else drawn from ``gen`` (None: none)."""
        meta, real = self.meta, len(yb)
        b = meta["max_batch"]
        if real > b:
            raise ValueError(f"{real} samples exceed the program's batch {b}")
        mask = np.zeros(b, np.float32)
        mask[:real] = 1.0
        inputs = [_pad(xb, b), _pad(yb, b), mask]
        inputs += [_pad(extras[name], b) for name, _ in meta["extras"]]
        for i, (_, p, shape) in enumerate(meta["dropout"]):
            if dropout_masks is not None:
                inputs.append(_pad(dropout_masks[i], b))
            elif self.dropout_enabled and gen is not None:
                keep = gen.rand((b, *shape)) >= p
                inputs.append(keep.astype(np.float32) * np.float32(1.0 / (1.0 - p)))
            else:
                inputs.append(np.ones((b, *shape), np.float32))
        inputs += [self._running[name] for name, _ in meta["running"]]
        return inputs

    # -- inference -----------------------------------------------------------------------------
    def predict(self, x: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
        """Eval-mode outputs: ([logits (N, K) per output, exits then final], features (N, F))."""
        self._require()
        meta = self.meta
        b, n_out = meta["max_batch"], meta["num_outputs"]
        xt = _channels_last(x)
        params = [self._params[name] for name, _ in meta["params"]]
        running = [self._running[name] for name, _ in meta["running"]]
        logits: list[list[np.ndarray]] = [[] for _ in range(n_out)]
        features = []
        for start in range(0, len(xt), b):
            chunk = xt[start:start + b]
            mask = np.zeros(b, np.float32)
            mask[:len(chunk)] = 1.0
            outputs = self.program.run("eval", [_pad(chunk, b), mask, *params, *running])
            for i in range(n_out):
                logits[i].append(outputs[i][:len(chunk)].copy())
            features.append(outputs[n_out][:len(chunk)].copy())
        if not features:
            return [np.zeros((0, meta["num_classes"]), np.float32)] * n_out, np.zeros(
                (0, meta["feature_size"]), np.float32)
        return [np.concatenate(parts) for parts in logits], np.concatenate(features)

    def outputs(self, x: np.ndarray) -> list[np.ndarray]:
        """Eval-mode logits (N, K) of every output, exits then final (``Runtime.outputs``)."""
        return self.predict(x)[0]

    def evaluate(self, x: np.ndarray, y: np.ndarray, batch_size: int = 256) -> StepStats:
        """Loss and accuracy of the final output (the program's own batch size is used)."""
        logits = self.predict(x)[0][-1]
        labels = np.asarray(y).astype(np.int64)
        n = max(len(labels), 1)
        if len(labels) == 0:
            return StepStats(0, 0.0, 0.0)
        shifted = logits - logits.max(axis=1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        loss = -float(log_probs[np.arange(len(labels)), labels].sum())
        correct = float((logits.argmax(axis=1) == labels).sum())
        return StepStats(len(labels), loss / n, correct / n)


def _channels_last(x: np.ndarray) -> np.ndarray:
    """(N, C, H, W) data -> (N, H, W, C) float32 (the programs' input layout)."""
    return np.ascontiguousarray(np.asarray(x, np.float32).transpose(0, 2, 3, 1))


def _pad(a: np.ndarray, rows: int) -> np.ndarray:
    """``a`` (contiguous) with zero rows appended up to ``rows`` rows."""
    if len(a) == rows:
        return np.ascontiguousarray(a)
    out = np.zeros((rows, *a.shape[1:]), dtype=a.dtype)
    out[:len(a)] = a
    return out
