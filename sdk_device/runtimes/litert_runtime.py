"""LiteRT (TFLite) runtime: evaluates ``tflite/1`` programs; it cannot train.

A ``tflite/1`` program is a ``program_archive`` holding ``model.tflite`` and an index::

    {"batch": B, "input_shape": [C, H, W], "num_outputs": n, "weight_names": [...]}

The model's signature inputs are ``args_0`` (the batch, B x C x H x W) then ``args_1..``
(the weights, in ``weight_names`` order); its outputs ``output_0..`` are the logits of
every exit and the final output. Weights being inputs, a device loads the program once
and ``set_weights`` writes each round's weights into the interpreter's input tensors.

The batch dimension is fixed (litert-torch 0.10 cannot lower a dynamic batch through
``flatten``, and the interpreter cannot resize the converted graph), so ``evaluate``
pads the last chunk with zero rows and drops their outputs. That is exact because
eval-mode BatchNorm uses running statistics: each row is computed on its own (the
exporter refuses models whose BatchNorm has no running statistics).

The interpreter is ``ai_edge_litert.interpreter.Interpreter`` (``pip install
ai-edge-litert``): the drop-in for tflite-runtime that works with numpy 2 and has aarch64
wheels.
"""

from __future__ import annotations

import re

import numpy as np

from fedcore.recipe import Recipe

from . import program_archive
from .base import Progress, StepStats
from .onnxruntime_runtime import cross_entropy_sum

FORMAT = "tflite/1"
MODEL_FILE = "model.tflite"


def pack(index: dict, tflite_bytes: bytes) -> bytes:
    """The ``tflite/1`` blob from its index (batch, input_shape, num_outputs, weight_names)."""
    return program_archive.pack(FORMAT, index, {MODEL_FILE: tflite_bytes})


def read(blob: bytes) -> tuple[dict, bytes]:
    """(index, model.tflite bytes) of a ``tflite/1`` blob."""
    index, files = program_archive.read(blob, FORMAT)
    if MODEL_FILE not in files:
        raise program_archive.ProgramError(f"{FORMAT} program has no {MODEL_FILE}")
    return index, files[MODEL_FILE]


def _position(name: str) -> int:
    """The number at the end of a signature tensor name (args_3 -> 3, output_1 -> 1)."""
    found = re.search(r"(?:args|output)_(\d+)", name)
    if found is None:
        raise program_archive.ProgramError(f"unexpected tensor {name!r} in the tflite model")
    return int(found.group(1))


class LiteRTRuntime:
    """Evaluates a tflite/1 program with the LiteRT interpreter."""

    name = "litert"
    formats = (FORMAT,)

    def __init__(self, threads: int = 1) -> None:
        self.threads = threads
        self.interpreter = None
        self.index: dict = {}
        self.weights: dict[str, np.ndarray] = {}

    def load_program(self, program: bytes, fmt: str) -> None:
        if fmt != FORMAT:
            raise ValueError(f"litert runtime cannot run {fmt!r} programs")
        from ai_edge_litert.interpreter import Interpreter

        self.index, model = read(program)
        self.interpreter = Interpreter(model_content=model, num_threads=self.threads)
        self.interpreter.allocate_tensors()
        inputs = sorted(self.interpreter.get_input_details(), key=lambda d: _position(d["name"]))
        if len(inputs) != 1 + len(self.index["weight_names"]):
            raise program_archive.ProgramError("the tflite model's inputs do not match its index")
        self.input_index = inputs[0]["index"]
        self.weight_index = {name: d["index"] for name, d in zip(self.index["weight_names"], inputs[1:],
                                                                 strict=True)}
        self.output_indices = [d["index"] for d in sorted(self.interpreter.get_output_details(),
                                                          key=lambda d: _position(d["name"]))]
        self.weights = {}

    def _require_interpreter(self):
        if self.interpreter is None:
            raise RuntimeError("load_program() first")
        return self.interpreter

    def set_weights(self, weights: dict[str, np.ndarray]) -> None:
        interpreter = self._require_interpreter()
        if set(weights) != set(self.weight_index):
            missing = sorted(set(self.weight_index) - set(weights))
            raise KeyError(f"weights do not fit the program: missing {missing[:5]}, "
                           f"unexpected {sorted(set(weights) - set(self.weight_index))[:5]}")
        for name, index in self.weight_index.items():
            interpreter.set_tensor(index, np.ascontiguousarray(weights[name], np.float32))
        self.weights = {name: np.array(value, np.float32) for name, value in weights.items()}

    def get_weights(self) -> dict[str, np.ndarray]:
        return {name: value.copy() for name, value in self.weights.items()}

    def train(self, x: np.ndarray, y: np.ndarray, recipe: Recipe,
              progress: Progress | None = None) -> StepStats:
        raise NotImplementedError("the litert runtime only evaluates")

    def predict(self, x: np.ndarray) -> list[np.ndarray]:
        """Every output's logits (exits, final) for x (N, C, H, W), any N."""
        interpreter = self._require_interpreter()
        if not self.weights:
            raise RuntimeError("set_weights() first")
        batch = self.index["batch"]
        chunks: list[list[np.ndarray]] = []
        for start in range(0, len(x), batch):
            rows = np.ascontiguousarray(x[start:start + batch], np.float32)
            padded = np.zeros((batch, *rows.shape[1:]), np.float32)
            padded[:len(rows)] = rows
            interpreter.set_tensor(self.input_index, padded)
            interpreter.invoke()
            chunks.append([interpreter.get_tensor(i)[:len(rows)].copy() for i in self.output_indices])
        return [np.concatenate([chunk[k] for chunk in chunks]) for k in range(len(self.output_indices))]

    def outputs(self, x: np.ndarray) -> list[np.ndarray]:
        """Logits (N, K) of every output, exits then final (``Runtime.outputs``)."""
        if len(x) == 0:  # no rows: every output's (0, K), from one zero row
            return [out[:0] for out in self.predict(np.zeros((1, *np.shape(x)[1:]), np.float32))]
        return self.predict(x)

    def evaluate(self, x: np.ndarray, y: np.ndarray, batch_size: int = 256) -> StepStats:
        logits = self.predict(x)[-1] if len(y) else np.zeros((0, 1), np.float32)
        labels = y.astype(np.int64)
        n = max(len(y), 1)
        return StepStats(len(y), cross_entropy_sum(logits, labels) / n,
                         float((logits.argmax(axis=1) == labels).sum()) / n)
