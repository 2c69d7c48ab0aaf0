"""The training recipe a task carries (what a runtime must do with the data), and the
statistics a training or evaluation pass reports (torch-free)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

OPTIMIZERS = ("sgd", "adam")

# The default recipe's bound on a device's optimiser steps per round (``Recipe.max_steps``;
# ``--max-steps``). 5 epochs of 16 on simulate's small shards (<= 60 steps) stay whole; a
# device with 900 samples stops after ~2 epochs instead of making 285 steps, at which SGD
# lr 0.05 with momentum 0.9 now and then diverges on one device and ruins the average.
DEFAULT_MAX_STEPS = 100

# The commands' default device learning rate (``--lr`` of ``simulate`` and ``run``; SGD,
# momentum 0.9). Decision: 0.02, not the earlier 0.05. With the step bound alone, lr 0.05 still
# collapsed to chance mid-run on one device of 900 digits in 3 of 5 seeds (the quality guard
# rolled each back); at 0.02 no run of the convergence grid collapsed (1, 2, 5, 10 devices x
# 100 to 5,000 samples each, digits and Fashion-MNIST, 30 rounds; 3 seeds where the CPU time
# allowed: BENCHMARKS.md, "Defaults that converge"). Cost: short runs learn more slowly. A
# lower lr changes only a number every task already carries, so it holds on every runtime
# (torch, ORT, ExecuTorch, the C++ client) with no new recipe field. ``Recipe.lr``'s own
# default (a task recipe without ``lr``, protocol §14.1) stays 0.05.
DEFAULT_LR = 0.02


@dataclass(frozen=True)
class LossKind:
    """A training loss a recipe may name: ``reads`` = the per-sample arrays it takes from a
    teacher model besides the labels (``teacher_logits`` (N, K): the teacher's final output;
    ``teacher_features`` (N, F): the inputs of its last linear layer)."""

    name: str
    reads: tuple[str, ...]
    summary: str


# The one table of loss kinds (``fedcore.losses`` computes them; devices and exporters look here).
LOSS_KINDS: dict[str, LossKind] = {kind.name: kind for kind in (
    LossKind("ce", (), "cross-entropy summed over every output (exits + final), unweighted"),
    LossKind("kd", ("teacher_logits",), "(1 - a) * CE + a * T^2 * KL(teacher || student), final output"),
    LossKind("recipfl_kt", ("teacher_logits", "teacher_features"),
             "CE + CE(student, softmax(teacher)) + KL over the last-hidden features"),
    LossKind("depthfl_sd", (), "CE + a * T^2 / (n - 1) * sum over exit pairs i != j of KL(p_j || p_i), "
             "p_j detached (DepthFL's mutual self-distillation)"),
)}


@dataclass(frozen=True)
class Recipe:
    """Local training settings. ``lr`` per step; ``epochs`` full passes over local data. The
    commands' defaults are ``server_toolkit.server_config.DEFAULT_RECIPE`` (lr ``DEFAULT_LR``
    0.02: at 0.05 a device with many local steps now and then diverged mid-run, see above).

    ``max_steps``: at most this many optimiser steps per training step (task step), whatever
    the device's data size: a device with many samples stops part-way through its epochs
    (``epoch_steps``); 0 = no bound, and then ``to_dict`` leaves the key out. Decision: a
    fixed-lr SGD+momentum recipe that is stable at ~60 local steps (simulate's small shards)
    diverges now and then at ~280 (a device with 900 samples, 5 epochs of 16), and one
    divergence ruins the averaged model; bounding the local steps keeps the work per round
    the same on every device (BENCHMARKS.md, "Defaults that converge").

    ``temperature`` and ``alpha`` parametrise the ``kd`` and ``depthfl_sd`` losses;
    ``teacher_features`` is the teacher's last-hidden feature size for ``recipfl_kt`` (0: no
    feature term; the term is used only when the student's feature size is the same).

    ``prox_mu``: FedProx's proximal weight mu >= 0: every optimiser step adds
    mu * (w - w_start) to each parameter's gradient (before weight decay), w_start = the
    parameters at the start of the step; 0 = plain training, and then ``to_dict`` leaves the
    key out, so such a task reads exactly as before.

    ``dp_clip`` and ``dp_noise`` (local differential privacy, ``server_toolkit/privacy``):
    with ``dp_clip`` > 0 the device clips the trained model's update delta to L2 norm
    ``dp_clip`` and adds Gaussian noise of standard deviation ``dp_noise`` to every float
    element before sending it (``sdk_device.privacy.noised_delta``); 0: off, key left out. In
    a secure round the device masks that noised delta with weight 1 (``secagg_sessions.py``).

    ``dp_secure_clip`` (central DP under secure aggregation, ``docs/privacy.md``): in a secure
    round the device clips its update delta to L2 norm ``dp_secure_clip`` and masks the clipped
    delta with weight 1 instead of its weights with its sample count; the server noises the
    unmasked sum (``sdk_device/secagg_sessions.py``). 0: off, key left out. Not with ``dp_clip``."""

    epochs: int = 1
    batch_size: int = 32
    optimizer: str = "sgd"
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 0.0
    loss: str = "ce"
    seed: int = 0
    temperature: float = 1.0
    alpha: float = 0.0
    teacher_features: int = 0
    prox_mu: float = 0.0
    dp_clip: float = 0.0
    dp_noise: float = 0.0
    max_steps: int = 0
    dp_secure_clip: float = 0.0

    def __post_init__(self) -> None:
        for name, kind in (("epochs", int), ("batch_size", int), ("seed", int), ("optimizer", str),
                           ("loss", str), ("lr", float), ("momentum", float), ("weight_decay", float),
                           ("temperature", float), ("alpha", float), ("teacher_features", int),
                           ("prox_mu", float), ("dp_clip", float), ("dp_noise", float),
                           ("max_steps", int), ("dp_secure_clip", float)):
            value = getattr(self, name)
            ok = (type(value) is int) if kind is int else isinstance(value, str) if kind is str else (
                isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value))
            if not ok:
                raise ValueError(f"recipe field {name!r} must be a finite {kind.__name__}, got {value!r}")
        if self.epochs < 1 or self.batch_size <= 0:
            raise ValueError(f"epochs must be >= 1 and batch_size > 0 (got {self.epochs}, {self.batch_size})")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer {self.optimizer!r} is not one of {OPTIMIZERS}")
        if self.loss not in LOSS_KINDS:
            raise ValueError(f"loss {self.loss!r} is not one of {tuple(LOSS_KINDS)}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.max_steps < 0:
            raise ValueError(f"max_steps must be >= 0 (0: no bound), got {self.max_steps}")
        if self.prox_mu < 0:
            raise ValueError(f"prox_mu must be >= 0, got {self.prox_mu}")
        if self.dp_clip < 0 or self.dp_noise < 0 or (self.dp_noise > 0 and not self.dp_clip > 0):
            raise ValueError(f"need dp_clip >= 0, dp_noise >= 0, and dp_clip > 0 when dp_noise > 0 "
                             f"(got {self.dp_clip}, {self.dp_noise})")
        if self.dp_secure_clip < 0 or (self.dp_secure_clip > 0 and self.dp_clip > 0):
            raise ValueError(f"need dp_secure_clip >= 0, and not with dp_clip (got {self.dp_secure_clip}, "
                             f"{self.dp_clip})")
        if not (self.temperature > 0 and 0 <= self.alpha <= 1 and self.teacher_features >= 0):
            raise ValueError("need temperature > 0, 0 <= alpha <= 1 and teacher_features >= 0 (got "
                             f"{self.temperature}, {self.alpha}, {self.teacher_features})")

    def epoch_steps(self, batches_per_epoch: int) -> list[int]:
        """The optimiser steps of each epoch a training step runs over ``batches_per_epoch``
        mini-batches an epoch: ``epochs`` x ``batches_per_epoch`` steps, cut at ``max_steps``
        when that is > 0 (the last epoch then partial). Every runtime's loop follows it and
        reports the last epoch in it; [] when there is no batch. E.g. 57 batches, 5 epochs,
        max_steps 100 -> [57, 43]."""
        if batches_per_epoch <= 0:
            return []
        left = self.epochs * batches_per_epoch
        if self.max_steps:
            left = min(left, self.max_steps)
        plan = []
        while left > 0:
            plan.append(min(left, batches_per_epoch))
            left -= plan[-1]
        return plan

    @property
    def needs_teacher(self) -> bool:
        """True when the loss reads a teacher's outputs (the task must name a teacher model)."""
        return bool(LOSS_KINDS[self.loss].reads)

    def loss_dict(self) -> dict:
        """The loss as ``fedcore.losses.Loss.from_dict`` (and the exporters) take it."""
        if self.loss in ("kd", "depthfl_sd"):
            return {"kind": self.loss, "temperature": self.temperature, "alpha": self.alpha}
        if self.loss == "recipfl_kt":
            return {"kind": "recipfl_kt", "features": self.teacher_features}
        return {"kind": "ce"}

    @classmethod
    def from_dict(cls, data: dict) -> Recipe:
        """Build from a task's recipe dict; ValueError on unknown keys or bad values."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ValueError(f"unknown recipe keys {unknown}")
        try:
            return cls(**data)
        except TypeError as exc:
            raise ValueError(f"bad recipe: {exc}") from None

    def to_dict(self) -> dict:
        """The task's recipe dict; ``prox_mu``, ``dp_clip``, ``dp_noise``, ``max_steps``,
        ``dp_secure_clip`` only when not 0."""
        out = asdict(self)
        for key in ("prox_mu", "dp_clip", "dp_noise", "max_steps", "dp_secure_clip"):
            if not out[key]:
                del out[key]
        return out


@dataclass(frozen=True)
class StepStats:
    """What a training or evaluation pass measured. loss: mean per sample (summed over
    outputs when training a multi-exit model); accuracy: of the final output, 0..1. A
    training pass reports the last epoch it ran (a partial one when ``max_steps`` cut it
    short), with ``samples`` = the local sample count (the weight an average gives it)."""

    samples: int
    loss: float
    accuracy: float
