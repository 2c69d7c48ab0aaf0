"""The server's side of one SecAgg+ round: a state machine fed with the devices' stage
messages (``sdk_device/secagg_client.py`` has the stages); transport-free, so the MQTT grid
and the in-process driver run the same code.

Sets of devices: ``U1`` advertised keys, ``U2`` sent their shares, ``U3`` sent a masked
vector. Masked vectors are added into one running sum as they arrive and never kept one
by one. To unmask, every survivor (U3) must have at least ``t`` neighbours in U3 (its
self-mask seed is rebuilt from their shares), and so must every device of U2 - U3 (its mask
private key is rebuilt and its pairwise masks with the survivors removed). Otherwise the
round fails (``SecAggFailed``) and the global model stays as it was.
"""

from __future__ import annotations

import numpy as np

from fedcore.secagg import crypto, masks, shamir
from fedcore.secagg.graph import default_degree, neighbours
from fedcore.secagg.wire import threshold, unb64


class SecAggFailed(RuntimeError):
    """The round cannot be unmasked (too few devices or shares); the reason in words."""


class SecAggRound:
    """One round. ``devices``: those asked; ``vector_length``: of every masked vector;
    ``fraction``: the threshold fraction (t = floor(fraction * k) + 1); ``degree``: k (None:
    ``default_degree``, sized for 30 % of the devices dropping); ``seed``: the neighbour graph's."""

    def __init__(self, round_number: int, devices: list[str], vector_length: int, fraction: float = 0.5,
                 degree: int | None = None, seed: int = 0) -> None:
        if not 0.5 <= fraction < 1.0:
            raise ValueError(f"--secagg-threshold must be in [0.5, 1), got {fraction}")
        self.round = round_number
        self.devices = sorted(devices)
        self.x = {d: i + 1 for i, d in enumerate(self.devices)}  # Shamir x coordinates
        self.vector_length = vector_length
        self.fraction = fraction
        self.degree = degree
        self.seed = seed
        self.context = f"round {round_number}".encode()
        self.keys: dict[str, tuple[bytes, bytes]] = {}  # U1: device -> (c_pk, s_pk)
        self._advertised: dict[str, dict] = {}  # U1: device -> its keys as sent (base64)
        self.graph: dict[str, list[str]] = {}
        self.t = 0
        self.boxes: dict[str, dict[str, str]] = {}  # U2: sender -> {receiver: box}
        self.masked: set[str] = set()  # U3
        self.total = np.zeros(vector_length, np.uint64)
        self.revealed: dict[str, dict] = {}  # device -> its reveal

    # -- stage 1: advertise ------------------------------------------------------------------
    def on_advertise(self, dev: str, data: dict) -> None:
        if dev not in self.x:
            raise ValueError(f"{dev} is not in round {self.round}")
        self.keys[dev] = (unb64(data.get("c_pk"), 32, "c_pk"), unb64(data.get("s_pk"), 32, "s_pk"))
        self._advertised[dev] = {"c_pk": data["c_pk"], "s_pk": data["s_pk"]}  # checked above

    def keys_messages(self) -> dict[str, dict]:
        """Per device of U1: its neighbours' keys and x coordinates, and t."""
        u1 = sorted(self.keys)
        if len(u1) < 3:
            raise SecAggFailed(f"{len(u1)} devices sent keys; secure aggregation needs at least 3")
        k = default_degree(len(u1), self.fraction) if self.degree is None else min(self.degree, len(u1) - 1)
        self.graph = neighbours(u1, k, self.seed)
        self.t = threshold(min(len(v) for v in self.graph.values()), self.fraction)
        return {dev: {"threshold": self.t, "neighbours": {n: {**self._advertised[n], "x": self.x[n]}
                                                          for n in self.graph[dev]}} for dev in u1}

    # -- stage 2: shares ---------------------------------------------------------------------
    def on_shares(self, dev: str, data: dict) -> None:
        boxes = data.get("boxes")
        if dev not in self.graph or not isinstance(boxes, dict) or set(boxes) != set(self.graph[dev]):
            raise ValueError(f"{dev}: shares must be boxed for exactly its neighbours")
        for box in boxes.values():
            unb64(box, None, "box")
        self.boxes[dev] = boxes

    def collect_messages(self) -> dict[str, dict]:
        """Per device of U2: the boxes its neighbours in U2 sent it, and who they are."""
        return {dev: {"alive": alive, "boxes": {n: self.boxes[n][dev] for n in alive}}
                for dev in sorted(self.boxes) for alive in [[n for n in self.graph[dev] if n in self.boxes]]}

    # -- stage 3: masked vectors ---------------------------------------------------------------
    def on_masked(self, dev: str, vector: np.ndarray) -> None:
        """Add ``dev``'s masked vector to the sum (once per device)."""
        if dev not in self.boxes or dev in self.masked:
            raise ValueError(f"{dev} sent no shares, or a masked vector already")
        if vector.dtype != np.uint64 or vector.shape != (self.vector_length,):
            raise ValueError(f"{dev}: masked vector must be uint64 of {self.vector_length}, got "
                             f"{vector.dtype} {vector.shape}")
        self.total += vector
        self.masked.add(dev)

    def unmask_messages(self) -> dict[str, dict]:
        """Per survivor: its neighbours (of U2) that survived and those that dropped."""
        dropped = set(self.boxes) - self.masked
        for dev in sorted(self.masked | dropped):
            holders = [n for n in self.graph[dev] if n in self.masked]
            if len(holders) < self.t:
                raise SecAggFailed(f"{dev} has {len(holders)} surviving neighbours; t = {self.t} needed "
                                   f"({len(dropped)} of {len(self.boxes)} devices dropped)")
        return {dev: {"survivors": [n for n in self.graph[dev] if n in self.masked],
                      "dropped": [n for n in self.graph[dev] if n in dropped]} for dev in sorted(self.masked)}

    # -- stage 4: reveal and unmask -----------------------------------------------------------
    def on_reveal(self, dev: str, data: dict) -> None:
        if dev not in self.masked or not all(isinstance(data.get(k), dict) for k in ("b", "sk")):
            raise ValueError(f"{dev}: not a survivor, or a malformed reveal")
        self.revealed[dev] = data

    def unmasked_sum(self) -> np.ndarray:
        """The sum of the survivors' unmasked vectors (uint64 fixed point); SecAggFailed when a
        secret lacks t shares."""
        total = self.total.copy()
        dropped = sorted(set(self.boxes) - self.masked)
        for dev in sorted(self.masked):
            seed = self._rebuild(dev, "b")
            masks.apply(total, seed, -1)
        for dev in dropped:
            private = crypto.private_from(self._rebuild(dev, "sk"))
            for other in self.graph[dev]:
                if other in self.masked:  # it added sign(other, dev) * PRG(s); take it out
                    seed = crypto.agree(private, self.keys[other][1], crypto.MASK_INFO, self.context)
                    masks.apply(total, seed, -masks.pairwise_sign(other, dev))
        return total

    def _rebuild(self, dev: str, kind: str) -> bytes:
        shares = {self.x[h]: unb64(self.revealed[h][kind][dev], shamir.SHARE_BYTES, "share")
                  for h in self.graph[dev] if dev in self.revealed.get(h, {}).get(kind, {})}
        if len(shares) < self.t:
            raise SecAggFailed(f"{len(shares)} shares of {dev}'s {kind}; t = {self.t} needed")
        return shamir.reconstruct(shares, self.t)

    @property
    def dropped(self) -> list[str]:
        return sorted(set(self.boxes) - self.masked)

