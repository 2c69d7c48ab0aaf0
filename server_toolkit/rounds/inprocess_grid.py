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
from .grid import ACCEPTED, REJECTED, TRAINING, WAITING, Exchange, Grid, LiveRound
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
    programs, no headers); ``accepted`` / ``rejected`` / ``last_error`` tally each device."""

    def __init__(self, devices: list[LocalDevice]) -> None:
        self.devices = {d.info.device_id: d for d in devices}
        self.runtimes = TorchRuntimePool()
        self.bytes_down = self.bytes_up = 0
        self.accepted: dict[str, int] = {}  # device -> updates accepted over the run
        self.rejected: dict[str, int] = {}  # device -> results rejected over the run
        self.last_error: dict[str, str] = {}  # device -> its last rejection, "code: detail"
        self._live: LiveRound | None = None

    def online(self) -> list[DeviceInfo]:
        return sorted((d.info for d in self.devices.values()), key=lambda d: d.device_id)

    def exchange(self, round_number: int, instructions: list[TrainInstruction], deadline: float,
                 quorum: int) -> Exchange:
        exchange = Exchange()
        asked = sorted(i.device_id for i in instructions)
        live = LiveRound(round_number, asked, [], exchange.rejections, deadline,
                         dict.fromkeys(asked, WAITING))
        self._live = live
        for instruction in instructions:
            dev = instruction.device_id
            live.states[dev] = TRAINING
            self.bytes_down += sum(_nbytes(m.weights) for m in instruction.all_models().values())
            with one_torch_thread():  # as a device process trains (same float reductions)
                update = train_on_device(self.devices[dev], instruction, self.runtimes)
            self.bytes_up += sum(_nbytes(record) for record in update.arrays.values())
            bad = non_finite(update)
            if bad:  # as the MQTT grid rejects it (check_update: non_finite)
                log.warning("round %d: rejected the update of %s: %s contains NaN or Inf",
                            round_number, dev, bad)
                exchange.rejections["non_finite"] = exchange.rejections.get("non_finite", 0) + 1
                self.rejected[dev] = self.rejected.get(dev, 0) + 1
                self.last_error[dev] = f"non_finite: {bad} contains NaN or Inf"
                live.states[dev] = REJECTED + "non_finite"
                continue
            exchange.updates.append(update)
            self.accepted[dev] = self.accepted.get(dev, 0) + 1
            live.accepted = sorted([*live.accepted, dev])
            live.states[dev] = ACCEPTED
        self._live = None
        return exchange

    def live(self) -> LiveRound | None:
        live = self._live
        return None if live is None else LiveRound(live.round, list(live.asked), list(live.accepted),
                                                   dict(live.rejections), live.deadline, dict(live.states))

    def traffic(self) -> tuple[int, int]:
        return self.bytes_down, self.bytes_up


def _nbytes(tensors: Weights) -> int:
    return sum(int(v.nbytes) for v in tensors.values())
