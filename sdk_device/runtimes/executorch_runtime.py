"""ExecuTorch runtime: trains ``pte/1`` programs (see ``export.executorch``) on the CPU.

The program is loaded once per architecture. Its training method returns the gradients
and the parameter tensors themselves; those parameter tensors alias the program's own
memory, so this runtime keeps numpy views of them and

* ``set_weights`` writes a task's weights into them in place (no re-export, no reload),
* the optimizer (``optimizers.SGD`` / ``optimizers.Adam``, torch's update rules; ExecuTorch
  only ships plain SGD) updates them in place after each step,
* ``get_weights`` copies them out.

BatchNorm running statistics are program inputs/outputs kept here. The program's batch
is fixed: a short last batch is zero-padded and masked (exact, see the exporter), so no
sample is dropped. Dropout masks are drawn here from the recipe's seed and passed in.
Programs take channels-last input; the data is transposed once per call, not per step.
Data order per epoch is ``torch.randperm`` with the recipe's seed, as in the torch runtime.

The parts of a program exported with the XNNPACK backend (the default) run in XNNPACK,
which shares ExecuTorch's threadpool (``threads``). Imports torch and executorch; the
registry imports this module only when asked.
"""

from __future__ import annotations

import json

import numpy as np
import torch

from fedcore.recipe import Recipe

from .base import Progress, StepStats
from .optimizers import make_optimizer

FORMAT = "pte/1"
META_METHOD = "fedsdk_meta"
SCHEMA = 1


class ExecutorchRuntime:
    """Runs pte/1 training programs with the ExecuTorch C++ runtime (Python bindings)."""

    name = "executorch"
    formats = (FORMAT,)

    def __init__(self, threads: int | None = None) -> None:
        from executorch.extension.pybindings import portable_lib

        self._lib = portable_lib
        if threads:
            portable_lib._unsafe_reset_threadpool(threads)
            torch.set_num_threads(threads)
        self.module = None
        self.meta: dict = {}
        self.dropout_enabled = True  # a parity check switches dropout off in every runtime
        self._program: bytes = b""
        self._params: dict[str, np.ndarray] = {}  # views of the program's parameter memory
        self._param_tensors: list[torch.Tensor] = []  # the aliased tensors (keep them alive)
        self._running: dict[str, np.ndarray] = {}
        self._weight_order: list[str] = []

    # -- program -------------------------------------------------------------------------------
    def load_program(self, program: bytes, fmt: str) -> None:
        if fmt not in self.formats:
            raise ValueError(f"executorch runtime cannot run {fmt!r} programs")
        module = self._lib._load_for_executorch_from_buffer(program)
        if META_METHOD not in module.method_names():
            raise ValueError("not a fedsdk training program: no metadata method")
        meta = json.loads(module.run_method(META_METHOD, ())[0])
        if meta.get("format") != FORMAT or meta.get("schema") != SCHEMA:
            raise ValueError(f"program format {meta.get('format')}/{meta.get('schema')} is not {FORMAT}")
        self.module, self.meta, self._program = module, meta, program
        # One step on a zero batch returns the parameter tensors; they alias program memory.
        outputs = self._run_train(self._zero_train_inputs())
        n_user, n_params = len(meta["train_outputs"]), len(meta["params"])
        self._param_tensors = list(outputs[n_user + n_params:])
        shapes = {name: tuple(shape) for name, shape in meta["params"]}
        self._params = {}
        for name, tensor in zip(meta["parameter_output_order"], self._param_tensors, strict=True):
            if tuple(tensor.shape) != shapes[name]:
                raise ValueError(f"program parameter {name} has shape {tuple(tensor.shape)}, "
                                 f"metadata says {shapes[name]}")
            self._params[name] = tensor.numpy()
        self._running = {name: np.zeros(shape, np.float32) if name.endswith("mean") else
                         np.ones(shape, np.float32) for name, shape in meta["running"]}
        self._weight_order = [name for name, _ in meta["params"]] + list(self._running)

    def _require(self) -> None:
        if self.module is None:
            raise RuntimeError("load_program() first")

    def _run_train(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return self.module.run_method("train", inputs, clone_outputs=False)

    def _zero_train_inputs(self) -> list[torch.Tensor]:
        tensors = []
        for name, shape, dtype in self.meta["train_inputs"]:
            if dtype == "int64":
                tensors.append(torch.zeros(shape, dtype=torch.int64))
            elif name == "sample_mask" or name.startswith("dropout:") or name.endswith("running_var"):
                tensors.append(torch.ones(shape))
            else:
                tensors.append(torch.zeros(shape))
        return tensors

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
        and recipe). ``extras``: per-sample teacher tensors the program's loss reads, e.g.
        {"teacher_logits": (N, K)}. Returns the last epoch's mean loss and accuracy."""
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
        yt = torch.from_numpy(np.asarray(y).astype(np.int64))
        extra_t = {name: torch.from_numpy(np.ascontiguousarray(extras[name], np.float32))
                   for name, _ in meta["extras"]}
        gen = torch.Generator().manual_seed(recipe.seed)
        n, steps_per_epoch = len(yt), -(-len(yt) // batch)
        n_user, n_params = len(meta["train_outputs"]), len(meta["params"])
        total_loss = correct = seen = 0.0
        for epoch in range(recipe.epochs):
            order = torch.randperm(n, generator=gen)
            for step in range(steps_per_epoch):
                idx = order[step * batch:(step + 1) * batch]
                inputs = self._train_inputs(xt[idx], yt[idx], {k: v[idx] for k, v in extra_t.items()}, gen)
                outputs = self._run_train(inputs)
                loss = float(outputs[0])
                for (name, _), value in zip(meta["running"], outputs[2:n_user], strict=True):
                    self._running[name] = value.numpy().copy()
                grads = {name: g.numpy() for name, g in zip(meta["gradient_order"],
                                                            outputs[n_user:n_user + n_params], strict=True)}
                optimizer.step(self._params, grads)
                if epoch == recipe.epochs - 1:
                    real = len(idx)
                    total_loss += loss * real
                    correct += float((outputs[1][:real] == yt[idx]).sum())
                    seen += real
                if progress:
                    progress((epoch * steps_per_epoch + step + 1) / (recipe.epochs * steps_per_epoch))
        return StepStats(int(seen), total_loss / max(seen, 1), correct / max(seen, 1))

    def gradients(self, x: np.ndarray, y: np.ndarray, extras: dict[str, np.ndarray] | None = None,
                  dropout_masks: list[np.ndarray] | None = None
                  ) -> tuple[float, dict[str, np.ndarray], dict[str, np.ndarray]]:
        """One forward+backward on one batch without updating anything (for parity checks).

        ``dropout_masks``: one (N, *shape) array per dropout layer (0 or 1/(1-p)); None =
        no dropout. Returns (loss, gradients by parameter name, updated running stats).
        """
        self._require()
        meta = self.meta
        extras_t = {name: torch.from_numpy(np.ascontiguousarray(extras[name], np.float32))
                    for name, _ in meta["extras"]}
        masks = None if dropout_masks is None else [torch.from_numpy(np.ascontiguousarray(m, np.float32))
                                                     for m in dropout_masks]
        labels = torch.from_numpy(np.asarray(y).astype(np.int64))
        inputs = self._train_inputs(_channels_last(x), labels, extras_t, None, masks)
        outputs = self._run_train(inputs)
        n_user, n_params = len(meta["train_outputs"]), len(meta["params"])
        grads = {name: g.numpy().copy() for name, g in zip(meta["gradient_order"],
                                                           outputs[n_user:n_user + n_params], strict=True)}
        running = {name: v.numpy().copy() for (name, _), v in zip(meta["running"], outputs[2:n_user],
                                                                   strict=True)}
        return float(outputs[0]), grads, running

    def _train_inputs(self, xb: torch.Tensor, yb: torch.Tensor, extras: dict[str, torch.Tensor],
                      gen: torch.Generator | None, dropout_masks: list[torch.Tensor] | None = None
                      ) -> list[torch.Tensor]:
        """The training method's inputs for one batch, padded to the program's batch.
        Dropout masks are ``dropout_masks`` if given, else drawn from ``gen`` (None: none)."""
        meta, real = self.meta, len(yb)
        b = meta["max_batch"]
        if real > b:
            raise ValueError(f"{real} samples exceed the program's batch {b}")
        mask = torch.zeros(b)
        mask[:real] = 1.0
        inputs = [_pad(xb, b), _pad(yb, b), mask]
        inputs += [_pad(extras[name], b) for name, _ in meta["extras"]]
        for i, (_, p, shape) in enumerate(meta["dropout"]):
            if dropout_masks is not None:
                inputs.append(_pad(dropout_masks[i], b))
            elif self.dropout_enabled and gen is not None:
                keep = torch.rand((b, *shape), generator=gen) >= p
                inputs.append(keep.to(torch.float32) * (1.0 / (1.0 - p)))
            else:
                inputs.append(torch.ones((b, *shape)))
        inputs += [torch.from_numpy(self._running[name]) for name, _ in meta["running"]]
        return inputs

    # -- inference -----------------------------------------------------------------------------
    def predict(self, x: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
        """Eval-mode outputs: ([logits (N, K) per output, exits then final], features (N, F))."""
        self._require()
        meta = self.meta
        b, n_out = meta["max_batch"], meta["num_outputs"]
        xt = _channels_last(x)
        params = [torch.from_numpy(self._params[name]) for name, _ in meta["params"]]
        running = [torch.from_numpy(self._running[name]) for name, _ in meta["running"]]
        logits: list[list[np.ndarray]] = [[] for _ in range(n_out)]
        features = []
        for start in range(0, len(xt), b):
            chunk = xt[start:start + b]
            mask = torch.zeros(b)
            mask[:len(chunk)] = 1.0
            outputs = self.module.run_method("eval", [_pad(chunk, b), mask, *params, *running])
            for i in range(n_out):
                logits[i].append(outputs[i][:len(chunk)].numpy())
            features.append(outputs[n_out][:len(chunk)].numpy())
        if not features:
            return [np.zeros((0, meta["num_classes"]), np.float32)] * n_out, np.zeros(
                (0, meta["feature_size"]), np.float32)
        return [np.concatenate(parts) for parts in logits], np.concatenate(features)

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


def _channels_last(x: np.ndarray) -> torch.Tensor:
    """(N, C, H, W) data -> a (N, H, W, C) float32 tensor (the programs' input layout)."""
    return torch.from_numpy(np.ascontiguousarray(np.asarray(x, np.float32).transpose(0, 2, 3, 1)))


def _pad(t: torch.Tensor, rows: int) -> torch.Tensor:
    """``t`` with zero rows appended up to ``rows`` rows."""
    if len(t) == rows:
        return t
    out = torch.zeros((rows, *t.shape[1:]), dtype=t.dtype)
    out[:len(t)] = t
    return out
