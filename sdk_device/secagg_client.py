"""The device's side of secure aggregation (SecAgg+; ``fedcore/secagg`` has the maths).

One ``SecAggClient`` per task whose round the server opened with a ``setup`` stage. Stages
(each a ``SecAgg`` message answered by the next; ``docs/privacy.md``, "Secure aggregation"):

1. ``advertise``: two fresh X25519 public keys (``c``: boxes for shares, ``s``: masks);
2. ``keys`` -> ``shares``: the neighbours' keys in; out: per neighbour, an AES-GCM box with
   its Shamir share of this device's self-mask seed ``b`` and of its mask private key;
3. ``collect`` -> ``masked``: the neighbours' boxes for this device in (kept, unopened), and
   the neighbours still in; out: the masked vector ``encode(update in global coordinates)
   + PRG(b) + sum_v +-PRG(s_uv)`` mod 2**64 (a blob; the update never leaves in the clear);
4. ``unmask`` -> ``reveal``: per neighbour the server says survived or dropped; out: its
   ``b`` share, or its mask-key share, never both for one neighbour.

Test-only fault injection: with ``FEDSDK_TEST_SECAGG_DROP=after_shares`` (or
``after_shares:ROUND``) in its environment the device process exits when asked for its
masked vector (in every round, or in round ROUND): a device dropping after the key exchange.
With ``FEDSDK_TEST_SECAGG_DUMP=DIR`` it writes its plain update to
``DIR/round<r>/<device>.safetensors`` (so a test can compare). Neither is for production use.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from pathlib import Path

import numpy as np

from fedcore.secagg import crypto, fixed_point, masks, shamir
from fedcore.secagg.layout import Layout
from fedcore.secagg.wire import b64, unb64

from .protocol.blobs import encode_tensors

log = logging.getLogger(__name__)

DROP_ENV, DUMP_ENV = "FEDSDK_TEST_SECAGG_DROP", "FEDSDK_TEST_SECAGG_DUMP"


def drops_now(round_number: int) -> bool:
    """Whether ``FEDSDK_TEST_SECAGG_DROP`` (test-only) says: drop out in this round."""
    value = os.environ.get(DROP_ENV, "")
    return value == "after_shares" or value == f"after_shares:{round_number}"


class SecAggClient:
    """The secrets and state of one device in one SecAgg round (see the module docstring)."""

    def __init__(self, device_id: str, round_number: int, setup: dict) -> None:
        self.device_id = device_id
        self.round = round_number
        self.layout = Layout.from_json(setup["layout"])
        self.clip = float(setup.get("clip", fixed_point.CLIP))
        self.context = f"round {round_number}".encode()
        self.c_key, self.s_key = crypto.new_private(), crypto.new_private()
        self.self_seed = secrets.token_bytes(32)
        self.neighbours: dict[str, dict] = {}  # id -> {"c_pk", "s_pk", "x", "box": AES key}
        self.threshold = 0
        self.held: dict[str, bytes] = {}  # neighbour -> the box it sent this device
        self.alive: set[str] = set()
        self.revealed = False

    # 1 -------------------------------------------------------------------------------------
    def advertise(self) -> dict:
        return {"c_pk": b64(crypto.public_bytes(self.c_key)), "s_pk": b64(crypto.public_bytes(self.s_key))}

    # 2 -------------------------------------------------------------------------------------
    def share(self, keys: dict) -> dict:
        """Boxes of this device's secret shares, one per neighbour."""
        self.threshold = int(keys["threshold"])
        for dev, entry in dict(keys["neighbours"]).items():
            if dev == self.device_id:
                raise ValueError("the server lists this device as its own neighbour")
            self.neighbours[str(dev)] = {"c_pk": unb64(entry["c_pk"], 32, "c_pk"),
                                         "s_pk": unb64(entry["s_pk"], 32, "s_pk"), "x": int(entry["x"])}
        if not 1 <= self.threshold <= len(self.neighbours) or 2 * self.threshold <= len(self.neighbours):
            raise ValueError(f"threshold {self.threshold} of {len(self.neighbours)} neighbours is unsafe")
        xs = [n["x"] for n in self.neighbours.values()]
        b_shares = shamir.share(self.self_seed, self.threshold, xs)
        sk_shares = shamir.share(crypto.private_bytes(self.s_key), self.threshold, xs)
        boxes = {}
        for dev, n in self.neighbours.items():
            key = n["box"] = crypto.agree(self.c_key, n["c_pk"], crypto.BOX_INFO, self.context)
            plain = b_shares[n["x"]] + sk_shares[n["x"]]
            boxes[dev] = b64(crypto.seal(key, plain, self._ad(self.device_id, dev)))
        return {"boxes": boxes}

    # 3 -------------------------------------------------------------------------------------
    def masked_input(self, collect: dict, tensors: dict[str, np.ndarray], samples: int,
                     class_counts: np.ndarray | None) -> np.ndarray:
        """The masked uint64 vector of ``tensors`` (the trained sub-model) weighted by ``samples``."""
        if drops_now(self.round):
            log.warning("%s: this device drops out now (test fault injection)", DROP_ENV)
            os._exit(3)
        alive = {str(d) for d in collect["alive"]}
        if not alive <= set(self.neighbours) or len(alive) < self.threshold:
            raise ValueError(f"{len(alive)} neighbours alive, {self.threshold} needed")
        self.alive = alive
        self.held = {str(d): unb64(box, None, "box")
                     for d, box in dict(collect["boxes"]).items() if d in alive}
        values, cover = self.layout.scatter(tensors, samples, class_counts, self.clip)
        dump = os.environ.get(DUMP_ENV)
        if dump:
            where = Path(dump) / f"round{self.round}"
            where.mkdir(parents=True, exist_ok=True)
            (where / f"{self.device_id}.safetensors").write_bytes(encode_tensors(tensors))
            (where / f"{self.device_id}.json").write_text(json.dumps({"samples": samples}))
        vector = np.concatenate([fixed_point.encode(values), fixed_point.encode(cover)])
        masks.apply(vector, self.self_seed, +1)
        for dev in sorted(alive):
            seed = crypto.agree(self.s_key, self.neighbours[dev]["s_pk"], crypto.MASK_INFO, self.context)
            masks.apply(vector, seed, masks.pairwise_sign(self.device_id, dev))
        return vector

    # 4 -------------------------------------------------------------------------------------
    def reveal(self, unmask: dict) -> dict:
        """Per neighbour that survived its ``b`` share, per one that dropped its mask-key share."""
        survivors, dropped = {str(d) for d in unmask["survivors"]}, {str(d) for d in unmask["dropped"]}
        if self.revealed or survivors & dropped or not (survivors | dropped) <= self.alive:
            raise ValueError("inconsistent unmask request (a neighbour both survived and dropped, "
                             "or asked twice)")
        if len(survivors) + 1 < self.threshold:  # the survivors and this device
            raise ValueError(f"only {len(survivors)} neighbours survived; {self.threshold} needed")
        self.revealed = True
        out: dict[str, dict[str, str]] = {"b": {}, "sk": {}}
        for dev in sorted(survivors | dropped):
            key = self.neighbours[dev]["box"]
            plain = crypto.open_box(key, self.held[dev], self._ad(dev, self.device_id))
            if dev in survivors:
                out["b"][dev] = b64(plain[: shamir.SHARE_BYTES])
            else:
                out["sk"][dev] = b64(plain[shamir.SHARE_BYTES:])
        return out

    def _ad(self, sender: str, receiver: str) -> bytes:
        return f"{sender}>{receiver}|".encode() + self.context

