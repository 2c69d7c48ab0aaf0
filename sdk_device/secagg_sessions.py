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
exceed the sensitivity C); a classifier weighted per class (DepthFL) is refused.

Local DP under secure aggregation (the task's recipe ``dp_clip`` > 0 in a secure round): the
update the task runner kept is already clipped and noised on this device
(``privacy.noised_delta``); the device masks its delta (noised - sent) with weight 1, so the
unmasked sum is the unweighted sum of the noised deltas local DP averages (no second clip:
the noise has given its guarantee, the rest is post-processing)."""

from __future__ import annotations

import numpy as np

from fedcore.recipe import Recipe
from fedcore.secagg.fixed_point import rounding_norm
from fedcore.secagg.layout import Layout

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

    def refusal(self, round_number: int, recipe: Recipe) -> str | None:
        """Why this device cannot honour ``recipe``'s privacy fields in round ``round_number``'s
        task (None: it can), decided before training: ``dp_secure_clip`` outside a secure round,
        a per-class layout under ``dp_secure_clip`` or local DP, a ``dp_secure_clip`` at or
        below the fixed-point rounding of the layout's elements (``clipped_for_sum``)."""
        if recipe.dp_secure_clip > 0 and not self.expects(round_number):
            return ("dp_secure_clip: the clipped delta goes masked, and no secure round was set up for "
                    "this task")
        if not self.expects(round_number) or not (recipe.dp_secure_clip > 0 or recipe.dp_clip > 0):
            return None
        try:
            layout = Layout.from_json(self.setups[round_number]["layout"])
            _weighs_devices(layout, "dp_secure_clip" if recipe.dp_secure_clip > 0 else "local DP (dp_clip)")
        except ValueError as exc:
            return str(exc)
        except (KeyError, TypeError) as exc:
            return f"the secure round's setup has no layout ({exc})"
        elements = sum(int(p.flat_indices().size) for p in layout.placements.values())
        if recipe.dp_secure_clip > 0 and not recipe.dp_secure_clip > rounding_norm(elements):
            return (f"dp_secure_clip {recipe.dp_secure_clip:g} is at or below the fixed-point rounding of "
                    f"{elements} elements ({rounding_norm(elements):.3g})")
        return None

    def start(self, round_number: int, tensors: dict[str, np.ndarray], samples: int, labels: np.ndarray,
              metrics: dict, sent: dict[str, np.ndarray] | None = None, dp_clip: float = 0.0,
              local_dp: bool = False) -> None:
        """The task is trained: keep its update here and advertise this round's keys.
        ``dp_clip`` > 0 (the recipe's ``dp_secure_clip``): the update kept is the delta from
        ``sent`` clipped for the sum, weighted 1; ``local_dp`` (the recipe's ``dp_clip`` > 0):
        the delta of the noised ``tensors`` from ``sent``, weighted 1 (module docstring)."""
        try:
            from .secagg_client import SecAggClient
        except ImportError as exc:
            raise RuntimeError(f"secure aggregation needs the cryptography package on this device "
                               f"(pip install cryptography): {exc}") from None
        client = SecAggClient(self.device_id, round_number, self.setups.pop(round_number))
        counts = np.bincount(np.asarray(labels, np.int64))
        if dp_clip > 0:
            tensors, samples, counts = clipped_for_sum(client.layout, sent or {}, tensors, dp_clip), 1, None
        elif local_dp:
            tensors, samples, counts = noised_for_sum(client.layout, sent or {}, tensors), 1, None
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
    _weighs_devices(layout, "dp_secure_clip")
    bound = clip - rounding_norm(sum(int(np.size(v)) for v in trained.values()))
    if not bound > 0:
        raise ValueError(f"dp_secure_clip {clip:g} is below the fixed-point rounding of the update")
    return secure_delta(sent, trained, bound)[0]


def noised_for_sum(layout, sent: dict[str, np.ndarray],
                   noised: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The delta a device masks under local DP: ``noised - sent`` over the float tensors (the
    task runner clipped and noised it already), integer tensors 0, float64. ValueError when
    the layout weighs a tensor per class (not one weight per device)."""
    _weighs_devices(layout, "local DP (dp_clip)")
    return secure_delta(sent, noised, np.inf)[0]


def _weighs_devices(layout, what: str) -> None:
    if any(p.weight != "samples" for p in layout.placements.values()):
        raise ValueError(f"{what} under secure aggregation weighs every device 1; this task's layout "
                         "weighs a tensor per class")
