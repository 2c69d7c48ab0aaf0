"""The training recipe a task carries: what a runtime must do with the data."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

OPTIMIZERS = ("sgd", "adam")
LOSSES = ("ce",)  # cross-entropy, summed over every output (exits + final), unweighted


@dataclass(frozen=True)
class Recipe:
    """Local training settings. ``lr`` per step; ``epochs`` full passes over local data."""

    epochs: int = 1
    batch_size: int = 32
    optimizer: str = "sgd"
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 0.0
    loss: str = "ce"
    seed: int = 0

    def __post_init__(self) -> None:
        for name, kind in (("epochs", int), ("batch_size", int), ("seed", int), ("optimizer", str),
                           ("loss", str), ("lr", float), ("momentum", float), ("weight_decay", float)):
            value = getattr(self, name)
            ok = (type(value) is int) if kind is int else isinstance(value, str) if kind is str else (
                isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value))
            if not ok:
                raise ValueError(f"recipe field {name!r} must be a finite {kind.__name__}, got {value!r}")
        if self.epochs < 1 or self.batch_size <= 0:
            raise ValueError(f"epochs must be >= 1 and batch_size > 0 (got {self.epochs}, {self.batch_size})")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer {self.optimizer!r} is not one of {OPTIMIZERS}")
        if self.loss not in LOSSES:
            raise ValueError(f"loss {self.loss!r} is not one of {LOSSES}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")

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
        return asdict(self)
