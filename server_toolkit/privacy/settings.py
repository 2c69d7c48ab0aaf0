"""What the user asked for (``--dp-*``, ``--label-noise-epsilon``, ``--robust``), checked
against the method before anything starts (``check``: a one-line ValueError)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ..methods.base import Method
from ..methods.records import LABEL_COUNTS
from ..rounds.robust import RULES
from .accountant import epsilon
from .windows import refusal as window_refusal

MODES = ("central", "local")


@dataclass(frozen=True)
class PrivacySettings:
    """``clip``: the L2 clipping norm C of an update delta (with ``adaptive_quantile``: its
    first value); ``noise_multiplier`` z (noise std = z·C); ``mode``: who adds the noise;
    ``delta``: the δ epsilon is reported for; ``epsilon_budget``: stop before a round would
    spend more; ``label_epsilon``: Laplace noise on label histograms (epsilon per report);
    ``robust``: "median" or "trimmed-mean" (``trim_fraction`` cut from each side)."""

    clip: float | None = None
    adaptive_quantile: float | None = None
    noise_multiplier: float = 0.0
    mode: str = "central"
    delta: float = 1e-5
    epsilon_budget: float | None = None
    label_epsilon: float | None = None
    robust: str | None = None
    trim_fraction: float = 0.1

    @property
    def dp(self) -> bool:
        """Whether updates are clipped (and noised) at all."""
        return self.clip is not None

    @property
    def active(self) -> bool:
        return self.dp or self.label_epsilon is not None or self.robust is not None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict | None) -> PrivacySettings | None:
        return cls(**data) if data else None

    def check(self, method: Method | type[Method], rate: float | None = None) -> None:
        """ValueError (one line) when the options contradict each other or ``method`` cannot
        honour them; ``rate``: the sampling rate, when known, to check one round fits the budget."""
        name = getattr(method, "name", str(method))
        if self.clip is None and (self.noise_multiplier or self.epsilon_budget is not None
                                  or self.adaptive_quantile is not None):
            raise ValueError("--dp-noise-multiplier, --dp-epsilon and --dp-adaptive-clip need --dp-clip C")
        if self.dp:
            if not self.clip > 0 or self.noise_multiplier < 0 or not 0 < self.delta < 1:
                raise ValueError(f"need --dp-clip > 0, --dp-noise-multiplier >= 0 and 0 < --dp-delta < 1 "
                                 f"(got {self.clip}, {self.noise_multiplier}, {self.delta})")
            if self.mode not in MODES:
                raise ValueError(f"--dp-mode must be one of {MODES}, got {self.mode!r}")
            if self.adaptive_quantile is not None and (self.mode != "central"
                                                       or not 0 < self.adaptive_quantile < 1):
                raise ValueError("--dp-adaptive-clip takes a quantile in (0, 1) and needs --dp-mode central "
                                 "(the server noises the count of unclipped updates)")
            if self.adaptive_quantile is not None and self.noise_multiplier <= 0:
                raise ValueError("--dp-adaptive-clip needs --dp-noise-multiplier > 0")
            if why := window_refusal(method):
                raise ValueError(f"differential privacy is not supported by {name}: {why}")
            if self.robust is not None:
                raise ValueError("--robust and --dp-clip do not combine: the noise is calibrated to a "
                                 "sum, a median's sensitivity is not bounded by C")
        if self.epsilon_budget is not None:
            if self.noise_multiplier <= 0 or not self.epsilon_budget > 0:
                raise ValueError("--dp-epsilon needs a budget > 0 and --dp-noise-multiplier > 0")
            if rate is not None and epsilon(self.mode, self.noise_multiplier, [rate], self.delta) > \
                    self.epsilon_budget:
                raise ValueError(f"--dp-epsilon {self.epsilon_budget:g} is spent by one round "
                                 f"(sampling rate {rate:.3g}); raise the noise or the budget")
        if self.label_epsilon is not None:
            if not 0 < self.label_epsilon < math.inf:
                raise ValueError(f"--label-noise-epsilon must be > 0, got {self.label_epsilon}")
            if LABEL_COUNTS not in getattr(method, "asks", {}):
                raise ValueError(f"--label-noise-epsilon: {name} asks devices for no label histograms")
        if self.robust is not None:
            if self.robust not in RULES:
                raise ValueError(f"--robust must be one of {RULES}, got {self.robust!r}")
            if not 0 <= self.trim_fraction < 0.5:
                raise ValueError(f"--trim-fraction must be in [0, 0.5), got {self.trim_fraction}")
            if why := window_refusal(method):
                raise ValueError(f"robust aggregation is not supported by {name}: {why}")
