"""The in-process grid: simulated devices trained in this process, for benchmarks.

The same instructions as on the MQTT grid, each trained on its ``LocalDevice`` as the
device agent trains it (``rounds/local_device.py``); devices are loop iterations instead
of processes and blobs never leave memory. Every device is online and answers every task;
a result holding NaN or Inf (a device whose training diverged) is rejected, as the MQTT
grid rejects it (``non_finite``), so no method ever aggregates it.
Each device trains in one torch thread, as a device process does (``runtimes/registry.py``):
a different thread count changes the order of float reductions, and a few rounds amplify
that into accuracy differences of several points.
"""

from __future__ import annotations

import logging

from sdk_device.protocol.blobs import first_non_finite

from ..methods.base import ClientUpdate, DeviceInfo, TrainInstruction, Weights
from ..torch_utils import one_torch_thread
from .grid import Exchange, Grid
from .local_device import LocalDevice, TorchRuntimePool, train_on_device

log = logging.getLogger(__name__)


def non_finite(update: ClientUpdate) -> str | None:
    """The first ``record/tensor`` of ``update`` holding NaN or Inf (a diverged device), or None."""
    for record, tensors in sorted(update.arrays.items()):
        name = first_non_finite(tensors)
        if name is not None:
            return f"{record}/{name}"
    return None


class InProcessGrid(Grid):
    """``devices`` trained here, one after the other, every round. ``traffic()`` counts the
    tensor bytes that would travel (every model's weights down, array records up; no
    programs, no headers)."""

    def __init__(self, devices: list[LocalDevice]) -> None:
        self.devices = {d.info.device_id: d for d in devices}
        self.runtimes = TorchRuntimePool()
        self.bytes_down = self.bytes_up = 0

    def online(self) -> list[DeviceInfo]:
        return sorted((d.info for d in self.devices.values()), key=lambda d: d.device_id)

    def exchange(self, round_number: int, instructions: list[TrainInstruction], deadline: float,
                 quorum: int) -> Exchange:
        exchange = Exchange()
        for instruction in instructions:
            self.bytes_down += sum(_nbytes(m.weights) for m in instruction.all_models().values())
            with one_torch_thread():  # as a device process trains (same float reductions)
                update = train_on_device(self.devices[instruction.device_id], instruction, self.runtimes)
            self.bytes_up += sum(_nbytes(record) for record in update.arrays.values())
            bad = non_finite(update)
            if bad:  # as the MQTT grid rejects it (check_update: non_finite)
                log.warning("round %d: rejected the update of %s: %s contains NaN or Inf",
                            round_number, instruction.device_id, bad)
                exchange.rejections["non_finite"] = exchange.rejections.get("non_finite", 0) + 1
                continue
            exchange.updates.append(update)
        return exchange

    def traffic(self) -> tuple[int, int]:
        return self.bytes_down, self.bytes_up


def _nbytes(tensors: Weights) -> int:
    return sum(int(v.nbytes) for v in tensors.values())
