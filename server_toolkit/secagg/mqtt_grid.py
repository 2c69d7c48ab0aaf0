"""Secure aggregation over MQTT: an ``MqttGrid`` whose rounds end in a masked sum.

An exchange: send each device its ``setup`` (its layout in global coordinates), then its
task (as the plain grid does) -> devices train and ``advertise`` keys -> ``keys`` ->
``shares`` -> ``collect`` -> ``masked`` (the server pulls each masked vector and adds it to
the round's sum at once) -> ``unmask`` -> ``reveal`` -> the unmasked sum. Each stage waits
until every device still in answered, went offline or refused, or its time is up (training:
the round's deadline; later stages: ``stage_timeout_s``). The exchange hands the round loop
metrics-only updates (no weights) and ``Exchange.secure``, which turns the sum into the next
global weights (``secagg/aggregate.py``). The server never holds a device's update in the
clear. Updates are not persisted one by one, so a server restarted mid-round redoes it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np

from sdk_device.protocol import messages as msgs
from sdk_device.protocol.errors import ProtocolError

from ..methods.base import ClientUpdate, DeviceInfo, Method, TrainInstruction, Weights
from ..methods.records import COVERAGE
from ..rounds.async_loop import AsyncConfig
from ..rounds.grid import Exchange
from ..rounds.modes import mqtt_grid_class
from ..rounds.mqtt_grid import MqttGrid
from .aggregate import UnmaskedSum, layout_for, refusal
from .protocol import SecAggFailed, SecAggRound

log = logging.getLogger(__name__)

SECURE_EDGE = "secagg"  # hello profile key of an edge whose group rounds are secure (edge/secure_group.py)
_NOBODY = DeviceInfo("", 0)


@dataclass(frozen=True)
class SecAggSettings:
    """``--secagg`` options: ``threshold`` = t / k (t = floor(threshold * k) + 1), ``neighbours``
    = k (None: ``fedcore.secagg.graph.default_degree``); ``stage_timeout_s`` bounds every stage
    after training."""

    threshold: float = 0.5
    neighbours: int | None = None
    stage_timeout_s: float = 60.0


class SecAggMqttGrid(MqttGrid):
    """``MqttGrid`` running every round as a secure aggregation of ``method``'s updates."""

    def __init__(self, endpoint, registry, method: Method, settings: SecAggSettings, seed: int = 0,
                 **kwargs) -> None:
        # the instance's answer: its options may make it no sum (HeteroFL's). An edge's relay
        # (no name: edge/sum_relay.py) has no method until the server's task; it checks that one.
        if method.name and (why := refusal(method)):
            raise ValueError(why)
        super().__init__(endpoint, registry, **kwargs)
        self.method, self.settings, self.seed = method, settings, seed
        self._template: Weights | None = None  # the global tensors' names and shapes (offsets)
        self._stages: dict[str, dict[str, dict]] = {}  # stage -> device -> data, of the open round
        self.last_secure: SecAggRound | None = None
        self.last_updates: list[ClientUpdate] = []  # the last secure round's metrics-only updates

    def serve(self, method: Method, template: Weights) -> None:
        """Run the next rounds for ``method``, in the coordinates of ``template``'s tensors (an
        edge's group round: the server's method and the global model it sent)."""
        self.method, self._template = method, template

    def _handle(self, incoming) -> None:
        message = incoming.message
        if not isinstance(message, msgs.SecAgg):
            super()._handle(incoming)
        elif message.round == self._open_round:
            self._stages.setdefault(message.stage, {}).setdefault(incoming.peer, message.data)
        else:
            err = ProtocolError("round_closed", f"round {message.round} is not open")
            self._reject(incoming.peer, None, err, self._open_round)

    def exchange(self, round_number: int, instructions: list[TrainInstruction], deadline: float,
                 quorum: int) -> Exchange:
        instructions, edges_only = self._edges(round_number, instructions)
        if edges_only:  # each answer is already an edge group's secure sum: a plain exchange
            return super().exchange(round_number, instructions, deadline, quorum)
        self.last_updates = []
        if self._template is None:
            self._template = self.method.initial_weights(self.seed)
        for instruction in instructions:  # export first: the deadline is the devices' time
            if not instruction.programs:
                self.programs_for(instruction.device_id, instruction.spec, instruction.recipe)
        self.registry.open_round(round_number, sorted(i.device_id for i in instructions), "")
        layouts = {i.device_id: layout_for(self.method, self._template, i) for i in instructions}
        by_device = {i.device_id: i for i in instructions}
        with self._lock:
            self._open_round, self._resolved, self._accepted, self._rejections = round_number, set(), [], {}
            self._left, self._deadline, self._last_rejection = set(), deadline, {}
        self._stages = {}
        for instruction in instructions:
            layout = layouts[instruction.device_id].to_json()
            self._say(instruction.device_id, round_number, "setup", {"layout": layout})
            self._send_task(round_number, instruction, deadline)
        secure = SecAggRound(round_number, list(by_device), next(iter(layouts.values())).vector_length
                             if layouts else 1, self.settings.threshold, self.settings.neighbours,
                             seed=self.seed * 1_000_003 + round_number)
        self.last_secure = secure
        try:
            metrics = self._run_stages(round_number, secure, deadline)
        except SecAggFailed as exc:
            log.warning("round %d: secure aggregation failed: %s; global model unchanged", round_number, exc)
            self._rejections["secagg_failed"] = 1
            metrics = None
        with self._lock:
            self._open_round = None
            rejections = dict(self._rejections)
        if not metrics:  # failed, or no device got as far as its masked vector (all dropped)
            return Exchange([], rejections, False)
        first = by_device[min(metrics)]
        updates = [ClientUpdate(dev, int(m["samples"]), {}, m, by_device[dev])
                   for dev, m in sorted(metrics.items())]
        self.last_updates = updates
        unmasked = UnmaskedSum(secure.unmasked_sum(), layouts[first.device_id], first, self._template)
        return Exchange(updates, rejections, False, secure=unmasked)

    def _edges(self, rnd: int, instructions: list[TrainInstruction]) -> tuple[list[TrainInstruction], bool]:
        """``(the instructions to run, whether they are all edges')``. An edge's instruction
        (it returns a ``coverage`` record: a partial sum) runs in a round of edges only, and only
        for an edge that sums its group securely (hello profile ``secagg: true``); any other is
        left out of the round, with an error in the log (docs/privacy.md)."""
        edges = {i.device_id for i in instructions if COVERAGE in i.returns}
        if not edges:
            return instructions, False
        secure = {d for d in edges if (self.devices.get(d) or _NOBODY).profile.get(SECURE_EDGE) is True}
        mixed = len(edges) < len(instructions)
        for dev in sorted(edges):
            if mixed or dev not in secure:
                log.error("round %d: edge %s left out: %s", rnd, dev,
                          "it adds its group in the clear (start it with --secagg)" if dev not in secure
                          else "a secure round does not mix devices and edges")
        keep = (lambda d: d not in edges) if mixed else (lambda d: d in secure)
        kept = [i for i in instructions if keep(i.device_id)]
        return kept, not mixed and bool(kept)

    def _run_stages(self, rnd: int, secure: SecAggRound, deadline: float) -> dict[str, dict]:
        """Stages 1-4; the survivors' metrics (their masked vectors are in ``secure``'s sum)."""
        self._feed(secure.on_advertise, self._gather("advertise", set(secure.devices), deadline))
        for dev, data in secure.keys_messages().items():
            self._say(dev, rnd, "keys", data)
        self._feed(secure.on_shares, self._gather("shares", set(secure.graph), self._stage_end(deadline)))
        for dev, data in secure.collect_messages().items():
            self._say(dev, rnd, "collect", data)
        metrics = {}
        for dev, data in self._gather("masked", set(secure.boxes), self._stage_end(deadline)).items():
            try:
                reported = data.get("metrics")
                if not isinstance(reported, dict) or type(reported.get("samples")) is not int \
                        or reported["samples"] <= 0:
                    raise ValueError("metrics.samples must be an integer > 0")
                secure.on_masked(dev, self._pull_masked(dev, data, secure.vector_length))
                metrics[dev] = reported
            except (ValueError, KeyError, TypeError, ProtocolError, TimeoutError) as exc:
                self._reject(dev, None, ProtocolError("secagg_masked", str(exc)), rnd)
        for dev, data in secure.unmask_messages().items():
            self._say(dev, rnd, "unmask", data)
        self._feed(secure.on_reveal, self._gather("reveal", set(secure.masked), self._stage_end(deadline)))
        if secure.dropped:
            log.info("round %d: %d devices dropped after the key exchange: %s", rnd, len(secure.dropped),
                     ", ".join(secure.dropped))
        return metrics

    def _pull_masked(self, dev: str, data: dict, length: int) -> np.ndarray:
        """The masked vector ``dev`` offered (raw little-endian uint64)."""
        ref = msgs.BlobRef(**data["blob"])
        if ref.size != 8 * length or ref.format != "secagg-u64":
            raise ValueError(f"masked vector of {ref.size} bytes ({ref.format}); {8 * length} expected")
        blob = self.endpoint.fetch(dev, ref, timeout_s=self.fetch_timeout_s, from_peer=True)
        return np.frombuffer(blob, "<u8").astype(np.uint64)

    def _gather(self, stage: str, expected: set[str], until: float) -> dict[str, dict]:
        """The ``stage`` answers of ``expected`` devices, once all answered or the rest left."""
        started = time.monotonic()
        while time.time() < until:
            got = set(self._stages.get(stage, {}))
            if expected <= got | self._resolved | (expected - set(self.devices)):
                break
            self._pump(timeout_s=0.05)
        got = {d: v for d, v in self._stages.get(stage, {}).items() if d in expected}
        log.info("round %s: secagg %s from %d/%d devices in %.2f s", self._open_round, stage, len(got),
                 len(expected), time.monotonic() - started)
        return got

    def _feed(self, handler, answers: dict[str, dict]) -> None:
        for dev, data in sorted(answers.items()):
            try:
                handler(dev, data)
            except (ValueError, KeyError, TypeError) as exc:
                self._reject(dev, None, ProtocolError("secagg_invalid", str(exc)), self._open_round)

    def _stage_end(self, deadline: float) -> float:
        return min(deadline, time.time() + self.settings.stage_timeout_s)

    def _say(self, dev: str, rnd: int, stage: str, data: dict) -> None:
        self.endpoint.send(dev, msgs.SecAgg(round=rnd, stage=stage, data=data))


def secagg_grid(endpoint, registry, method: Method, secagg: dict | None, seed: int,
                async_settings: AsyncConfig | None = None, **kwargs) -> MqttGrid:
    """The MQTT grid of a run: ``SecAggMqttGrid`` when ``secagg`` holds settings (the dict of
    ``SecAggSettings``), else the mode's grid (``AsyncMqttGrid`` for async settings, else the
    plain ``MqttGrid``). In async mode the server runs no secure round itself (its edges do:
    ``secagg/layer.py``), so ``secagg`` gives the async grid too."""
    if secagg is None or async_settings is not None:
        return mqtt_grid_class(async_settings)(endpoint, registry, **kwargs)
    return SecAggMqttGrid(endpoint, registry, method, SecAggSettings(**secagg), seed=seed, **kwargs)
