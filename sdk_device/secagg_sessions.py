"""The agent's secure-aggregation rounds (``--secagg``): it keeps each round's ``setup``,
diverts a secure round's trained update into a ``SecAggClient`` (``secagg_client.py``) and
answers the server's stages. ``cryptography`` is imported only when a secure round starts, so
a device without it still runs plain rounds (and refuses a secure one with the reason).

Central DP under secure aggregation (the task's recipe ``dp_secure_clip`` = C > 0): the
device masks its update delta (trained - sent), clipped to L2 norm C - ``rounding_norm`` (so
that its fixed-point encoding still has norm <= C: ``fedcore/secagg/fixed_point.py``), with
weight 1 instead of its weights with its sample count; the server noises the unmasked sum of
the clipped deltas once (``server_toolkit/privacy/round_privacy.py``). Decision: weight 1, as
central DP counts each device once (a sample weight would let a device with many samples
exceed the sensitivity C); a classifier weighted per class (DepthFL) is refused."""

from __future__ import annotations

import numpy as np

from fedcore.secagg.fixed_point import rounding_norm

from .privacy import secure_delta
from .protocol import messages as msgs


class SecAggSessions:
    """The agent's secure rounds: the ``setup`` of each round announced, and the client of the
    round in progress. ``endpoint`` sends the stage answers and offers the masked vector."""

    def __init__(self, device_id: str, endpoint) -> None:
        self.device_id = device_id
        self.endpoint = endpoint
        self.setups: dict[int, dict] = {}  # round -> its setup (the newest few)
        self.client = None  # the SecAggClient of the round in progress
        self.trained_update: tuple | None = None  # (tensors, samples, class counts, metrics)

    def expects(self, round_number: int) -> bool:
        """Whether the task of ``round_number`` is a secure one (its result goes masked)."""
        return round_number in self.setups

    def start(self, round_number: int, tensors: dict[str, np.ndarray], samples: int, labels: np.ndarray,
              metrics: dict, sent: dict[str, np.ndarray] | None = None, dp_clip: float = 0.0) -> None:
        """The task is trained: keep its update here and advertise this round's keys.
        ``dp_clip`` > 0 (the recipe's ``dp_secure_clip``): the update kept is the delta from
        ``sent`` clipped for the sum, weighted 1 (module docstring)."""
        try:
            from .secagg_client import SecAggClient
        except ImportError as exc:
            raise RuntimeError(f"secure aggregation needs the cryptography package on this device "
                               f"(pip install cryptography): {exc}") from None
        client = SecAggClient(self.device_id, round_number, self.setups.pop(round_number))
        counts = np.bincount(np.asarray(labels, np.int64))
        if dp_clip > 0:
            tensors, samples, counts = clipped_for_sum(client.layout, sent or {}, tensors, dp_clip), 1, None
        self.client = client
        self.trained_update = (tensors, samples, counts, metrics)
        self._send("advertise", self.client.advertise())

    def on_message(self, message) -> bool:
        """Answer one server stage (``msgs.SecAgg``); True when this device's part of the round
        is over. ValueError (or a crypto error) on a request it refuses."""
        if message.stage == "setup":
            self.setups = {r: s for r, s in self.setups.items() if r > message.round - 3}
            self.setups[message.round] = message.data
            return False
        client = self.client
        if client is None or client.round != message.round:
            raise ValueError(f"no secure round {message.round} in progress here")
        if message.stage == "keys":
            self._send("shares", client.share(message.data))
        elif message.stage == "collect":
            tensors, samples, counts, metrics = self.trained_update
            vector = client.masked_input(message.data, tensors, samples, counts)
            ref = self.endpoint.offer("server", vector.astype("<u8").tobytes(), "weights", "secagg-u64")
            self.trained_update = None  # the plain update is not kept past its masking
            self._send("masked", {"blob": {"id": ref.id, "size": ref.size, "kind": ref.kind,
                                           "format": ref.format}, "metrics": metrics})
        elif message.stage == "unmask":
            self._send("reveal", client.reveal(message.data))
            self.client = None
            return True
        else:
            raise ValueError(f"unknown secagg stage {message.stage!r}")
        return False

    def _send(self, stage: str, data: dict) -> None:
        self.endpoint.send("server", msgs.SecAgg(round=self.client.round, stage=stage, data=data))


def clipped_for_sum(layout, sent: dict[str, np.ndarray], trained: dict[str, np.ndarray],
                    clip: float) -> dict[str, np.ndarray]:
    """The delta a device masks under central DP: ``trained - sent`` clipped to L2 norm
    ``clip - rounding_norm(elements)`` (float64). ValueError when ``clip`` is below the
    fixed-point slack or the layout weighs a tensor per class (not one weight per device)."""
    if any(p.weight != "samples" for p in layout.placements.values()):
        raise ValueError("dp_secure_clip weighs every device 1; this task's layout weighs a tensor per class")
    bound = clip - rounding_norm(sum(int(np.size(v)) for v in trained.values()))
    if not bound > 0:
        raise ValueError(f"dp_secure_clip {clip:g} is below the fixed-point rounding of the update")
    return secure_delta(sent, trained, bound)[0]
