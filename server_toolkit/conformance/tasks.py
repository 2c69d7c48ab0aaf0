"""The tasks the conformance kit sends: a FedAvg-style one-model task (docs/protocol.md §5.4)
over the reference model for a dataset's input shape, its programs in the asked formats and
its weights. Every check uses fresh weights (a tiny per-check offset), so a device's blob
cache never hides a transfer.
"""

from __future__ import annotations

import functools
import time
import uuid

import numpy as np

from fedcore.recipe import Recipe
from sdk_device.protocol.blobs import decode_tensors, encode_tensors
from server_toolkit.models.zoo import model_spec

from .peer import ServerPeer, message

RECIPE = Recipe(epochs=1, batch_size=16, lr=0.05, momentum=0.9, seed=7)


@functools.cache
def _programs(
    formats: tuple[str, ...], model: str, input_shape: tuple[int, ...], num_classes: int
) -> list[tuple[str, bytes]]:
    """The programs of ``model`` in ``formats``, exported once per process (pte/1 takes seconds)."""
    from export.programs import ProgramCache  # torch: imported when a task is made, not by --help

    return ProgramCache(list(formats)).programs(model_spec(model, input_shape, num_classes), RECIPE)


class TaskFactory:
    """Builds tasks for ``model`` on ``input_shape``/``num_classes`` with programs in ``formats``."""

    def __init__(
        self,
        formats: list[str],
        model: str = "small_cnn",
        input_shape: tuple[int, int, int] = (1, 8, 8),
        num_classes: int = 10,
    ) -> None:
        from fedcore.torch_model import build_model, state_numpy  # torch, only when checks run

        self.spec = model_spec(model, input_shape, num_classes)
        self.programs = _programs(tuple(formats), model, tuple(input_shape), num_classes)
        self.weights = state_numpy(build_model(self.spec, seed=0))
        self.sent: dict[str, dict[str, np.ndarray]] = {}  # task id -> the weights it carried
        self._serial = 0

    def fresh_weights(self) -> bytes:
        """The model's weights with a tiny offset unique to this call (a new blob id)."""
        self._serial += 1
        first = sorted(self.weights)[0]
        weights = dict(self.weights)
        weights[first] = weights[first] + np.float32(1e-6 * self._serial)
        return encode_tensors(weights)

    def task(
        self,
        peer: ServerPeer,
        *,
        deadline_s: float = 120.0,
        server_clock_s: float = 0.0,
        config: dict | None = None,
        formats: list[str] | None = None,
        weights: bytes | None = None,
    ) -> dict:
        """Offer this task's blobs to the device and return the task message (not sent).

        ``deadline_s``: seconds from the task's ``server_time`` to its deadline;
        ``server_clock_s``: how far the kit's server clock is ahead of the real time (the clock
        rule, docs/protocol.md §9.6: the device must not care)."""
        weights = weights if weights is not None else self.fresh_weights()
        programs = [
            peer.offer(data, "program", fmt)
            for fmt, data in self.programs
            if formats is None or fmt in formats
        ]
        if formats is not None:
            programs += [
                peer.offer(b"unknown program " + fmt.encode(), "program", fmt)
                for fmt in formats
                if fmt not in dict(self.programs)
            ]
        task_id = uuid.uuid4().hex
        self.sent[task_id] = decode_tensors(weights)
        return message(
            "task",
            task_id=task_id,
            round=1,
            programs={"model": programs},
            arrays={"model": peer.offer(weights, "weights", "safetensors")},
            config=config
            or {"steps": [{"train": "model", "recipe": RECIPE.to_dict()}], "return": ["model"], "report": {}},
            deadline=time.time() + server_clock_s + deadline_s,
            server_time=time.time() + server_clock_s,
        )
