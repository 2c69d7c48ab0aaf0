"""The server's set of hypernetworks for an exit-split model: which conv generates which,
how they learn each round, and the chained generation of what a shallow client lacks.

Pairs: the conv weights of segment ``n + 1`` are generated from those of segment ``n``
(one hypernetwork per target conv). Decision (the paper is silent; the authors' code pairs
"same position" convs of consecutive VGG blocks): within each kernel size, segment
``n + 1``'s convs are matched to segment ``n``'s from the end — target ``j`` of ``m`` takes
source ``p - m + j`` of ``p`` (clamped at 0). For the VGG this maps block 2's two convs to
block 3's and block 3's to block 4's, as the code does; a target conv whose kernel size
does not occur in the previous segment is never generated.

Round: ``train_round`` fits every hypernetwork on this round's clients that trained both
its segments (warm start from the last round); ``generate_missing`` then fills, for a
client of tier ``t``, the convs of segments ``t .. S-1`` in order, each from the client's
own (or already generated) weights of the segment before. A hypernetwork that has never
had training data generates nothing.

Skill gate (``gate=True``, a departure from the paper, which always generates): before a
hypernetwork trains on this round's pairs, those pairs are fresh data it has never seen, so
``train_round`` scores it on them: the relative error ``|G(source) - target|^2 / |target|^2``
of its generated weights against that of the stand-in it competes with, the current global
weight of the target conv (``global_weights``). The hypernetwork generates while its last
check found it better than the stand-in; never before its first check (the round after its
first training). Rounds without pairs for it keep its last verdict.

Why (digits, Dirichlet 0.1, 27 clients, 5 per round): the pairs of a round are 1-4 clients;
on fresh pairs the trained hypernetworks' relative error was 0.22-0.70 while the global
weight's was 0.001-0.02 (a client moves its deep convs by a few percent in a round), and in
the first round (trained on one pair, from scratch) 1.04, no better than zeros. Generated
weights entered the average with 2/3 of the weight and shrank the deep convs' norm 4-5x in
three rounds (9.2 -> 1.7), after which the test features after the last block no longer
varied across samples (their variance 0.1 % of the BN running variance) and the final exit
predicted one class. Gated, the hypernetworks never passed the check there, and HypeMeFed
trains as its no-hypernetwork ablation does.

Residual target (``residual=True``): a hypernetwork maps the correction a client made to the
source conv, ``source - global_source``, to the correction of the target conv; the generated
weight is ``global_target + G(source - global_source)``. Its last layer starts at zero, so before
it learns anything it generates exactly the global weight, the skill check's stand-in.

Pair memory (``memory=R``): the (source, target) pairs of the last ``R`` rounds with pairs are
kept (as corrections to their own round's global model when residual) and a hypernetwork trains
on all of them, not only on this round's 1-6 clients. The skill check still scores only this
round's fresh pairs, before it trains on them.

Decision: the hypernetworks train and generate in one torch thread (restored afterwards).
Their matrices are small (at most k x a few hundred); on a busy 2-core server two threads
made a round's hypernetwork training 5-10x slower, not faster.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

from ...torch_utils import one_torch_thread, tensors_from_json, tensors_to_json
from .lrf_hypernet import Hypernet, fit, generate, make_hypernet

Weights = dict[str, np.ndarray]
Shape = tuple[int, ...]
Segments = list[list[tuple[str, Shape]]]


@dataclass(frozen=True)
class ConvPair:
    """Hypernetwork task: generate conv ``target`` (segment ``stage + 1``) from ``source``."""

    stage: int
    source: str
    target: str
    source_shape: Shape
    target_shape: Shape


@dataclass(frozen=True)
class SkillCheck:
    """A hypernetwork scored on a round's fresh pairs before training on them: mean relative
    error of its generated weights and of the global weight standing in for them."""

    hypernet: float
    stand_in: float

    @property
    def passed(self) -> bool:
        return self.hypernet < self.stand_in


def relative_error(prediction: np.ndarray, target: np.ndarray) -> float:
    """``|prediction - target|^2 / |target|^2`` (1.0 = no better than zeros)."""
    target = np.asarray(target, np.float64)
    error = np.sum((np.asarray(prediction, np.float64) - target) ** 2)
    return float(error / max(float(np.sum(target ** 2)), 1e-12))


def conv_pairs(segments: Segments) -> list[ConvPair]:
    """The (source, target) conv pairs between consecutive segments (see module docstring)."""
    pairs = []
    for stage in range(len(segments) - 1):
        sources, targets = segments[stage], segments[stage + 1]
        for kernel in sorted({shape[2] for _, shape in targets}):
            src = [(n, s) for n, s in sources if s[2] == kernel]
            tgt = [(n, s) for n, s in targets if s[2] == kernel]
            if not src:
                continue
            for j, (t_name, t_shape) in enumerate(tgt):
                s_name, s_shape = src[max(0, len(src) - len(tgt) + j)]
                pairs.append(ConvPair(stage, s_name, t_name, tuple(s_shape), tuple(t_shape)))
    return pairs


class HypernetBank:
    """One hypernetwork per ``ConvPair``; ``kind`` "lrf" (rank ``rank``, None = all) or "naive";
    ``gate``: generate only with the hypernetworks that passed their last skill check;
    ``residual``: predict corrections to the global weights; ``memory``: rounds of pairs kept."""

    def __init__(self, segments: Segments, kind: str = "lrf", rank: int | None = 100, hidden: int = 512,
                 epochs: int = 25, lr: float = 5e-4, seed: int = 0, gate: bool = True,
                 residual: bool = False, memory: int = 1) -> None:
        if memory < 1:
            raise ValueError(f"memory must be >= 1 round, got {memory}")
        self.pairs = conv_pairs(segments)
        self.kind, self.rank, self.hidden = kind, rank, hidden
        self.epochs, self.lr, self.seed, self.gate = epochs, lr, seed, gate
        self.residual, self.memory = residual, memory
        self.nets: dict[str, Hypernet] = {}
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            for pair in self.pairs:
                self.nets[pair.target] = make_hypernet(kind, pair.source_shape, pair.target_shape, rank,
                                                       hidden, zero_output=residual)
        self.kept: dict[str, deque] = {pair.target: deque(maxlen=memory) for pair in self.pairs}
        self.trained: set[str] = set()
        self.skilled: set[str] = set()  # targets whose last skill check passed
        self.checks: dict[str, SkillCheck] = {}  # this round's checks

    def num_parameters(self) -> int:
        """Total trainable parameters of all hypernetworks."""
        return sum(p.numel() for net in self.nets.values() for p in net.parameters())

    def train_round(self, clients: list[tuple[int, Weights]], round_number: int,
                    global_weights: Weights | None = None) -> dict[str, float]:
        """Fit each hypernetwork on the clients (tier, global-named weights) that trained its
        target's segment, after a skill check on those pairs against ``global_weights`` (the
        round's starting global model; None: no check; required when residual). Returns, per
        trained target conv, the last epoch's mean MSE relative to the targets' mean square (1.0 =
        no better than generating zeros; residual: than generating no correction); the checks
        are in ``self.checks``."""
        if self.residual and global_weights is None:
            raise ValueError("a residual hypernetwork bank needs the round's global weights")
        losses = {}
        self.checks = {}
        for index, pair in enumerate(self.pairs):
            data = [(torch.from_numpy(w[pair.source]), torch.from_numpy(w[pair.target]))
                    for tier, w in clients if tier >= pair.stage + 2]
            if not data:
                continue
            if global_weights is not None and pair.target in self.trained:
                check = self.skill_check(pair, data, global_weights)
                self.checks[pair.target] = check
                (self.skilled.add if check.passed else self.skilled.discard)(pair.target)
            if self.residual:
                g_source, g_target = (torch.from_numpy(np.asarray(global_weights[n], np.float32))
                                      for n in (pair.source, pair.target))
                data = [(s - g_source, t - g_target) for s, t in data]
            self.kept[pair.target].append(data)
            kept = [p for past in self.kept[pair.target] for p in past]
            seed = (self.seed * 1_000_003 + round_number) * 1009 + index
            with one_torch_thread():
                history = fit(self.nets[pair.target], kept, self.epochs, self.lr, seed)
            self.trained.add(pair.target)
            scale = float(np.mean([float(torch.mean(target.float() ** 2)) for _, target in kept]))
            losses[pair.target] = history[-1] / max(scale, 1e-12)
        return losses

    def skill_check(self, pair: ConvPair, data: list[tuple[torch.Tensor, torch.Tensor]],
                    global_weights: Weights) -> SkillCheck:
        """Score the hypernetwork of ``pair`` on (source, target) pairs it has not trained on,
        against the global target weight as stand-in."""
        generated = [self.generate_one(pair, source, global_weights) for source, _ in data]
        targets = [target.numpy() for _, target in data]
        stand_in = global_weights[pair.target]
        errors = [relative_error(g, t) for g, t in zip(generated, targets, strict=True)]
        stand_in_errors = [relative_error(stand_in, t) for t in targets]
        return SkillCheck(float(np.mean(errors)), float(np.mean(stand_in_errors)))

    def may_generate(self, target: str) -> bool:
        """Whether the hypernetwork of ``target`` generates (trained; with the gate, skilled)."""
        return target in (self.skilled if self.gate else self.trained)

    def generate_one(self, pair: ConvPair, source: np.ndarray | torch.Tensor,
                     global_weights: Weights | None) -> np.ndarray:
        """The target conv the hypernetwork of ``pair`` generates from one client's source conv
        (residual: ``global_target + G(source - global_source)``)."""
        source = torch.as_tensor(np.asarray(source, np.float32))
        if self.residual:
            source = source - torch.from_numpy(np.asarray(global_weights[pair.source], np.float32))
        with one_torch_thread():
            value = generate(self.nets[pair.target], source).numpy()
        return value + global_weights[pair.target] if self.residual else value

    def generate_missing(self, tier: int, weights: Weights, global_weights: Weights | None = None) -> Weights:
        """Generated conv weights (global names) for the segments a tier-``tier`` client did not
        train, chained segment by segment from its own weights (``global_weights``: the round's
        starting global model, required when residual)."""
        available = dict(weights)
        generated: Weights = {}
        for pair in self.pairs:  # sorted by stage, so a source is generated before it is used
            if pair.stage + 1 < tier or not self.may_generate(pair.target) or pair.source not in available:
                continue
            value = self.generate_one(pair, available[pair.source], global_weights)
            available[pair.target] = generated[pair.target] = value
        return generated

    # -- checkpoint state (JSON-ready) ---------------------------------------------------------
    def state_dict(self) -> dict:
        """Trained and skilled flags and, for LRF, the hypernetwork weights (base64 float32). The
        naive networks are too large for a JSON checkpoint: they restart untrained on resume; the
        kept pairs (``memory``) are not saved: a resumed bank trains on new rounds' pairs only."""
        state: dict = {"kind": self.kind, "trained": sorted(self.trained), "skilled": sorted(self.skilled)}
        if self.kind == "lrf":
            state["nets"] = {target: tensors_to_json(net.state_dict()) for target, net in self.nets.items()}
        return state

    def load_state_dict(self, state: dict) -> None:
        if state.get("kind") != self.kind or "nets" not in state:
            return
        for target, tensors in state["nets"].items():
            if target not in self.nets:
                continue
            self.nets[target].load_state_dict(tensors_from_json(tensors))
        self.trained = {t for t in state.get("trained", []) if t in self.nets}
        self.skilled = {t for t in state.get("skilled", []) if t in self.trained}
