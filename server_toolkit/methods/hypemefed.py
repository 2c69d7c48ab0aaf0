"""HypeMeFed (seed 000): exit-split sub-models + hypernetwork-generated deep conv weights.

A round: tier ``t`` devices train the prefix through exit ``t`` (as ``depthfl``); the
server then (1) trains one hypernetwork per conv pair of consecutive segments on this
round's clients that trained both (``reconstruct.hypernet_bank``: 25 epochs, Adam 5e-4,
warm-started), (2) generates, for every client that lacks deeper segments, their conv
weights from its own (chained n -> n+1 -> n+2), and (3) averages: each global tensor is
the sample-weighted mean over the clients that trained it *or had it generated*. Only conv
weights are generated; BN and classifier tensors come from the clients that have them.

Options (``--method-option key=value``):

* ``hypernet``: "lrf" (default), "naive" (full-weight MLP; only sensible for tiny models)
  or "none" (= the ``depthfl`` baseline).
* ``rank``: singular values kept, default 100; "all" (or 0) keeps every one.
* ``hidden`` (512), ``hn_epochs`` (25), ``hn_lr`` (5e-4), ``seed`` (0): hypernetwork settings.
* ``client_lr``, ``client_batch_size``, ``user_recipe``: the device recipe (see ``depthfl``).

Decisions where the paper is silent: the average is sample-weighted (FedAvg), a generated
conv counts with its client's sample count; a hypernetwork generates only once it has been
trained at least once; the training pairs are the current round's only (the paper discards
them after use). Unlike the authors' released code, the rank really is ``rank`` and the
generated weights really enter the average.
"""

from __future__ import annotations

from sdk_device.runtimes.recipe import Recipe

from ..reconstruct.hypernet_bank import HypernetBank
from ..reconstruct.present_average import average_present
from ..submodels.exit_split import conv_segments, num_tiers
from .base import ClientUpdate, Weights
from .depthfl import DepthFL


def parse_rank(rank: int | str | None) -> int | None:
    """100 -> 100; "all", 0 or None -> None (every singular value)."""
    if rank is None or rank == 0 or (isinstance(rank, str) and rank.lower() in ("all", "full")):
        return None
    value = int(rank)
    if value < 0:
        raise ValueError(f"rank must be >= 1 or 'all', got {rank!r}")
    return value


class HypeMeFed(DepthFL):
    name = "hypemefed"
    family = "exit"
    example = "--model vgg_multi_exit --tiers 1,2,3"

    def __init__(self, global_spec: dict, recipe: Recipe, hypernet: str = "lrf", rank: int | str | None = 100,
                 hidden: int = 512, hn_epochs: int = 25, hn_lr: float = 5e-4, seed: int = 0,
                 client_lr: float = 0.005, client_batch_size: int = 16, user_recipe: bool = False) -> None:
        super().__init__(global_spec, recipe, client_lr=client_lr, client_batch_size=client_batch_size,
                         user_recipe=user_recipe)
        if hypernet not in ("lrf", "naive", "none"):
            raise ValueError(f"hypernet must be 'lrf', 'naive' or 'none', got {hypernet!r}")
        if num_tiers(global_spec) < 2:
            raise ValueError("HypeMeFed needs a multi-exit global model (e.g. --model vgg_multi_exit)")
        self.hypernet = hypernet
        self.bank = None if hypernet == "none" else HypernetBank(
            conv_segments(global_spec), kind=hypernet, rank=parse_rank(rank), hidden=hidden,
            epochs=hn_epochs, lr=hn_lr, seed=seed)
        self.last_round: dict = {}

    def aggregate_train(self, round_number: int, global_weights: Weights,
                        updates: list[ClientUpdate]) -> Weights:
        clients = [self.client_tensors(global_weights, u) for u in updates]
        losses = self.bank.train_round(clients, round_number) if self.bank else {}
        contributions, generated = [], 0
        for (tier, tensors), update in zip(clients, updates, strict=True):
            extra = self.bank.generate_missing(tier, tensors) if self.bank else {}
            generated += len(extra)
            contributions.append(({**tensors, **extra}, float(update.num_samples)))
        self.last_round = {"hn_rel_mse": sum(losses.values()) / len(losses) if losses else None,
                           "hn_trained": len(losses), "generated": generated}
        return average_present(global_weights, contributions)

    def aggregate_evaluate(self, round_number: int, updates: list[ClientUpdate]) -> dict:
        out = super().aggregate_evaluate(round_number, updates)
        out.update({k: v for k, v in self.last_round.items() if v is not None})
        return out

    def state_dict(self) -> dict:
        return {**super().state_dict(), **({"hypernets": self.bank.state_dict()} if self.bank else {})}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if self.bank and "hypernets" in state:
            self.bank.load_state_dict(state["hypernets"])
