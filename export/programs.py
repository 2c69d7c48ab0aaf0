"""Which training programs the server offers for a (sub-model spec, recipe), built once.

A task lists one program per format; each device pulls only the one its runtime runs.
Exporting is slow (seconds for ExecuTorch), so programs are cached by the spec's content,
the loss and the batch size, i.e. once per (architecture, tier, runtime).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable

from fedcore import modelspec
from fedcore.recipe import Recipe

Exporter = Callable[[dict, Recipe], bytes]

# torch.export is not thread-safe (two at once fail with "ProxyTorchDispatchMode slot already
# occupied"): `fedsdk-server run` exports for round 1 while its pairing service prepares the
# same programs, so every export in the process runs under this lock.
_EXPORT_LOCK = threading.Lock()


def _torchspec(spec: dict, recipe: Recipe) -> bytes:
    return modelspec.dumps(spec)


def _pte(spec: dict, recipe: Recipe) -> bytes:
    from .executorch import export_training_program  # imports executorch only when asked

    return export_training_program(spec, recipe.loss_dict(), max_batch=recipe.batch_size)


def _ort_training(spec: dict, recipe: Recipe) -> bytes:
    from .onnx import export_ort_training_program  # needs torch here and the ORT environment

    return export_ort_training_program(spec, recipe.loss_dict())


def _onnx_eval(spec: dict, recipe: Recipe) -> bytes:
    from .onnx import export_inference

    return export_inference(spec)


EXPORTERS: dict[str, Exporter] = {
    modelspec.FORMAT: _torchspec,
    "pte/1": _pte,
    "ort-training/1": _ort_training,
    "onnx/1": _onnx_eval,
}


class ProgramCache:
    """Builds and remembers the programs of each (spec, loss, batch size) in ``formats``."""

    def __init__(self, formats: list[str] | None = None) -> None:
        self.formats = list(formats or [modelspec.FORMAT])
        unknown = [f for f in self.formats if f not in EXPORTERS]
        if unknown:
            raise ValueError(f"no exporter for {unknown}; known formats: {', '.join(EXPORTERS)}")
        self._built: dict[tuple[str, str, str, int], bytes] = {}

    @staticmethod
    def _key(spec: dict, fmt: str, recipe: Recipe) -> tuple[str, str, str, int]:
        spec_id = hashlib.sha256(modelspec.dumps(spec)).hexdigest()
        return spec_id, fmt, json.dumps(recipe.loss_dict(), sort_keys=True), recipe.batch_size

    def put(self, spec: dict, recipe: Recipe, fmt: str, program: bytes) -> None:
        """Remember a program built elsewhere (e.g. exported earlier and kept on disk)."""
        self._built[self._key(spec, fmt, recipe)] = program

    def programs(self, spec: dict, recipe: Recipe) -> list[tuple[str, bytes]]:
        """``[(format, program bytes), ...]`` in the configured order."""
        out = []
        for fmt in self.formats:
            key = self._key(spec, fmt, recipe)
            with _EXPORT_LOCK:
                if key not in self._built:
                    self._built[key] = EXPORTERS[fmt](spec, recipe)
            out.append((fmt, self._built[key]))
        return out
