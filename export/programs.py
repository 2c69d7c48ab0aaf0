"""Which training programs the server offers for a (sub-model spec, recipe), built once.

A task lists one program per format; each device pulls only the one its runtime runs.
Exporting is slow (20 s to minutes for ExecuTorch), so programs are cached by the spec's
content, the loss and the batch size, i.e. once per (architecture, tier, runtime), in memory
and on disk (``program_store.py``), and each export is logged with its duration.

``pte/1`` programs are exported with the cache's kernel set (``kernels``: "fused" uses the
``fedsdk::`` training ops where the spec has a layer they cover, else "portable"); a caller asks
for the portable program instead (``portable=True``) for a device that refused the fused one
(``unsupported_kernels``, protocol §23.8), so both may be cached for one spec.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from fedcore import modelspec
from fedcore.recipe import Recipe
from sdk_device.runtimes.pte_contract import FORMAT as PTE_FORMAT
from sdk_device.runtimes.pte_contract import KERNEL_SETS, PORTABLE

from .program_store import ProgramStore

log = logging.getLogger(__name__)

Exporter = Callable[[dict, Recipe, str], bytes]  # (spec, recipe, kernel set: pte/1 only) -> bytes

# torch.export is not thread-safe (two at once fail with "ProxyTorchDispatchMode slot already
# occupied"): `fedsdk-server run` exports for round 1 while its pairing service prepares the
# same programs, so every export in the process runs under this lock.
_EXPORT_LOCK = threading.Lock()


def _torchspec(spec: dict, recipe: Recipe, kernels: str) -> bytes:
    return modelspec.dumps(spec)


def _pte(spec: dict, recipe: Recipe, kernels: str) -> bytes:
    from .executorch import export_training_program  # imports executorch only when asked

    return export_training_program(spec, recipe.loss_dict(), max_batch=recipe.batch_size, kernels=kernels)


def _ort_training(spec: dict, recipe: Recipe, kernels: str) -> bytes:
    from .onnx import export_ort_training_program  # needs torch here and the ORT environment

    return export_ort_training_program(spec, recipe.loss_dict())


def _onnx_eval(spec: dict, recipe: Recipe, kernels: str) -> bytes:
    from .onnx import export_inference

    return export_inference(spec)


EXPORTERS: dict[str, Exporter] = {
    modelspec.FORMAT: _torchspec,
    PTE_FORMAT: _pte,
    "ort-training/1": _ort_training,
    "onnx/1": _onnx_eval,
}


def program_key(spec: dict, fmt: str, loss: dict, batch: int) -> tuple[str, str, str, int]:
    """What a program is exported from: (spec hash, format, loss as JSON, batch size)."""
    return hashlib.sha256(modelspec.dumps(spec)).hexdigest(), fmt, json.dumps(loss, sort_keys=True), batch


def store_key(key: tuple[str, str, str, int], kernels: str = PORTABLE) -> str:
    """``program_key`` (of a program of kernel set ``kernels``) as the program store's key."""
    return ":".join(map(str, key)) + ("" if kernels == PORTABLE else f":{kernels}")


def kernel_set_of(spec: dict, kernels: str) -> str:
    """The kernel set a pte/1 program of ``spec`` exported with ``kernels`` needs: "fused"
    only when the spec has a layer the fused ops cover (``program_model.fused_layers``)."""
    if kernels == PORTABLE:
        return PORTABLE
    from .program_model import fused_layers  # imports torch

    return kernels if fused_layers(spec) else PORTABLE


class ProgramCache:
    """Builds and remembers the programs of each (spec, loss, batch size) in ``formats``:
    in memory, and exported formats also on disk (``program_store.py``: in ``directory``, by
    default ``~/.cache/fedsdk/programs``; ``on_disk=False`` keeps them in memory only).
    ``kernels``: the kernel set of its pte/1 programs (``KERNEL_SETS``; see the module doc)."""

    def __init__(self, formats: list[str] | None = None, on_disk: bool = True,
                 directory: Path | None = None, kernels: str = PORTABLE) -> None:
        self.formats = list(formats or [modelspec.FORMAT])
        unknown = [f for f in self.formats if f not in EXPORTERS]
        if unknown:
            raise ValueError(f"no exporter for {unknown}; known formats: {', '.join(EXPORTERS)}")
        if kernels not in KERNEL_SETS:
            raise ValueError(f"kernel set {kernels!r} is not one of {', '.join(KERNEL_SETS)}")
        self.kernels = kernels
        self.store = ProgramStore(directory) if on_disk else None
        self._built: dict[tuple[str, str, str, int, str], bytes] = {}

    def _key(self, spec: dict, fmt: str, recipe: Recipe, portable: bool) -> tuple[str, str, str, int, str]:
        kernels = kernel_set_of(spec, self.kernels) if fmt == PTE_FORMAT and not portable else PORTABLE
        return (*program_key(spec, fmt, recipe.loss_dict(), recipe.batch_size), kernels)

    def put(self, spec: dict, recipe: Recipe, fmt: str, program: bytes, kernels: str = PORTABLE) -> None:
        """Remember a program (of kernel set ``kernels``) built elsewhere (e.g. exported earlier
        and kept on disk)."""
        self._built[(*program_key(spec, fmt, recipe.loss_dict(), recipe.batch_size), kernels)] = program

    def programs(self, spec: dict, recipe: Recipe, portable: bool = False) -> list[tuple[str, bytes]]:
        """``[(format, program bytes), ...]`` in the configured order; ``portable``: the pte/1
        program in the portable kernel set whatever the cache's ``kernels``."""
        out = []
        for fmt in self.formats:
            key = self._key(spec, fmt, recipe, portable)
            with _EXPORT_LOCK:
                if key not in self._built:
                    self._built[key] = self._build(spec, fmt, recipe, key)
            out.append((fmt, self._built[key]))
        return out

    def _build(self, spec: dict, fmt: str, recipe: Recipe, key: tuple[str, str, str, int, str]) -> bytes:
        """Export one program (or read it from the store), saying so when it takes time."""
        kernels = key[-1]
        if fmt == modelspec.FORMAT or self.store is None:
            return EXPORTERS[fmt](spec, recipe, kernels)
        started = time.monotonic()
        what = fmt if kernels == PORTABLE else f"{fmt} ({kernels} kernels)"

        def export() -> bytes:
            log.info("exporting the %s program of model %s (batch %d): seconds to minutes "
                     "(ExecuTorch: ~20 s for a small CNN, minutes for a VGG); kept in %s for the next run",
                     what, key[0][:12], recipe.batch_size, self.store.directory)
            return EXPORTERS[fmt](spec, recipe, kernels)

        data, stored = self.store.get_or_make(store_key(key[:4], kernels), fmt, export)
        if not stored:
            log.info("exported the %s program of model %s in %.0f s", what, key[0][:12],
                     time.monotonic() - started)
        return data
