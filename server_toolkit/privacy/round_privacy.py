"""What the round loop asks of the privacy settings, round by round.

* ``refusal(rate)``: before a round, the reason to stop when the round would take epsilon
  past ``--dp-epsilon`` (a budget stop ends the run cleanly: rounds so far stand);
* ``stamp``: a task's recipe gets ``dp_clip``/``dp_noise`` (local mode) and its
  ``label_counts`` report the Laplace parameters (``--label-noise-epsilon``);
* ``aggregate``: the private (``clipping``) or robust (``rounds/robust``) aggregate in
  place of the method's, with its metrics (``dp_epsilon``, ``dp_clip``, ...) in the row;
  under secure aggregation (``secure``) the devices clipped (``stamp`` gives them the clip as
  the recipe's ``dp_secure_clip``) and ``aggregate`` noises the sum it is given once, charging
  one release per round (per version in async mode) at the rate central DP is charged; in
  local mode the devices clipped, noised and masked their deltas weighted 1 and ``aggregate``
  averages the unmasked sum per element (local DP's unweighted mean), charged as local DP;
  label-histogram noise is the devices' (their noised histograms ride the secure round's
  ``masked`` message in the clear), counted here as without secure aggregation;
* ``state_dict``: the rates spent and the adaptive clip, saved with each checkpoint.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections import Counter

import numpy as np

from ..methods.base import ClientUpdate, Method, TrainInstruction, Weights
from ..methods.records import LABEL_COUNTS
from ..rounds.aggregator import StopRun
from ..rounds.robust import coverage_robust
from .accountant import epsilon
from .adaptive import count_noise, next_clip, update_noise_multiplier
from .clipping import clipped_deltas, noised_sum_mean, noised_window_mean, partial_sums
from .settings import PrivacySettings
from .windows import contributions, window_of

log = logging.getLogger(__name__)

ADAPTIVE = ("adaptive clipping counts the updates whose norm is under the clip, which needs each "
            "device's norm in the clear; a secure count of it is not built")


class BudgetSpent(StopRun):
    """The next round would take epsilon past the budget; the run stops cleanly."""


class RoundPrivacy:
    """The settings applied to ``method``'s rounds (checked by ``PrivacySettings.check``)."""

    def __init__(self, settings: PrivacySettings, method: Method, secure: bool = False) -> None:
        settings.check(method)
        if secure and settings.adaptive_quantile is not None:
            raise ValueError(f"--dp-adaptive-clip and --secagg do not combine: {ADAPTIVE}")
        if secure and settings.robust is not None:
            raise ValueError("--robust and --secagg do not combine: a median or trimmed mean cannot be "
                             "computed from a masked sum")
        self.settings = settings
        self.method = method
        self.secure = secure  # devices clip (and, local DP, noise) and mask their deltas
        self.clip = settings.clip
        self.rates: list[float] = []  # the sampling rate of every round that released a model
        self.label_reports = 0  # rounds whose tasks asked for noised label histograms
        self._rng = np.random.default_rng()  # OS entropy: the noise must not follow from the seed
        if settings.dp and settings.label_epsilon is None and LABEL_COUNTS in method.asks:
            log.warning("%s asks devices for label histograms, sent in clear: dp_epsilon covers the model "
                        "updates only (add --label-noise-epsilon)", method.name)

    @property
    def replaces_norm_bound(self) -> bool:
        """Central clipping bounds every update; the norm bound (relative to the round's other
        updates) would make one device's update depend on the others' and break the analysis."""
        return self.settings.dp and self.settings.mode == "central"

    def epsilon(self, rates: list[float] | None = None) -> float:
        s = self.settings
        return epsilon(s.mode, s.noise_multiplier, self.rates if rates is None else rates, s.delta)

    def refusal(self, rnd: int, rate: float) -> str | None:
        """Why round ``rnd`` must not run (budget), or None."""
        budget = self.settings.epsilon_budget
        if budget is None:
            return None
        after = self.epsilon([*self.rates, rate])
        if after <= budget:
            return None
        return (f"privacy budget reached: round {rnd} would take epsilon from {self.epsilon():.3g} to "
                f"{after:.3g} > --dp-epsilon {budget:g} (delta {self.settings.delta:g}); stopping after "
                f"round {rnd - 1}")

    def stamp(self, instruction: TrainInstruction) -> TrainInstruction:
        s = self.settings
        if s.dp and s.mode == "central" and self.secure:
            recipe = dataclasses.replace(instruction.recipe, dp_secure_clip=float(self.clip))
            instruction = dataclasses.replace(instruction, recipe=recipe)
        if s.dp and s.mode == "local":
            recipe = dataclasses.replace(instruction.recipe, dp_clip=float(s.clip),
                                         dp_noise=float(s.noise_multiplier * s.clip))
            instruction = dataclasses.replace(instruction, recipe=recipe)
        if s.label_epsilon is not None and LABEL_COUNTS in instruction.reports:
            classes = int(self.method.global_spec["num_classes"])
            instruction = dataclasses.replace(instruction, reports={
                **instruction.reports, LABEL_COUNTS: {"epsilon": float(s.label_epsilon), "classes": classes}})
        return instruction

    def aggregate(self, rnd: int, global_weights: Weights, updates: list[ClientUpdate], rate: float,
                  row: dict, deltas: bool = False,
                  sums: tuple[Weights, Weights] | None = None) -> Weights | None:
        """The new global weights (None: the method aggregates as usual); metrics into ``row``.
        ``deltas``: the updates' weights are deltas already (async: ``StalenessFold`` scaled them
        and ``global_weights`` is all zeros), not weights to take the sent ones from. Central
        mode clips a device with m updates in one call (async: a fast device) to C / m each, so
        one device still moves the sum by at most C. ``secure``: the devices clipped; ``sums`` =
        (S, A) of a secure round's unmasked sum, else the updates are edges' partials of it."""
        s = self.settings
        if s.label_epsilon is not None and any(LABEL_COUNTS in u.instruction.reports for u in updates):
            self.label_reports += 1
            row["label_epsilon"] = self.label_reports * s.label_epsilon
        if s.robust is not None:
            return coverage_robust(global_weights, contributions(self.method, updates, global_weights),
                                   s.robust, s.trim_fraction)
        if not s.dp:
            return None
        if self.secure:  # local mode: the devices noised, the sum is averaged as it came
            total, cover = sums if sums is not None else partial_sums(updates, deltas)
            std = s.noise_multiplier * self.clip if s.mode == "central" else 0.0
            new = noised_sum_mean(global_weights, total, cover, std, self._rng)
            row["dp_clip"] = self.clip
            return self._charged(rate, row, new)
        counted = [u for u in updates if u.num_samples > 0]
        if not counted:
            return global_weights
        windows = [window_of(self.method, u, global_weights) for u in counted]
        pairs = [({k: np.zeros_like(v) for k, v in u.weights.items()} if deltas else u.instruction.weights,
                  u.weights) for u in counted]
        if s.mode == "local":  # the devices clipped and noised; average what came
            moved, norms = clipped_deltas(pairs, None)
            new = noised_window_mean(global_weights, list(zip(moved, windows, strict=True)), 0.0, self._rng)
        else:
            z = s.noise_multiplier
            if s.adaptive_quantile is not None:
                count_std = count_noise(len(counted), z)
                z = update_noise_multiplier(z, count_std)
            share = Counter(u.device_id for u in counted)  # 1 each in a round
            clips = [self.clip / share[u.device_id] for u in counted]
            moved, norms = [], []
            for pair, clip in zip(pairs, clips, strict=True):
                (delta,), (norm,) = clipped_deltas([pair], clip)
                moved.append(delta)
                norms.append(norm)
            new = noised_window_mean(global_weights, list(zip(moved, windows, strict=True)), z * self.clip,
                                     self._rng)
            row["dp_clipped"] = sum(1 for n, c in zip(norms, clips, strict=True) if n > c)
            row["dp_clip"] = self.clip
            if s.adaptive_quantile is not None:
                self.clip = next_clip(self.clip, norms, s.adaptive_quantile, count_std, self._rng)
        return self._charged(rate, row, new)

    def _charged(self, rate: float, row: dict, new: Weights) -> Weights:
        """``new``, once the release at sampling ``rate`` is charged and its metrics are in ``row``."""
        self.rates.append(rate)
        spent = self.epsilon()
        row["dp_epsilon"] = spent if math.isfinite(spent) else None
        return new

    def summary(self) -> dict:
        """What the run spent, for summary.json."""
        s = self.settings
        out: dict = {"settings": s.to_dict()}
        if s.dp:
            spent = self.epsilon()
            out.update(dp_epsilon=spent if math.isfinite(spent) else None, dp_delta=s.delta,
                       dp_rounds=len(self.rates),
                       dp_assumption="Poisson sampling at rate q = devices per round / devices online"
                       if s.mode == "central" else "local: no amplification, every round counted")
        if s.label_epsilon is not None:
            out["label_epsilon"] = self.label_reports * s.label_epsilon
        return out

    def state_dict(self) -> dict:
        return {"rates": list(self.rates), "clip": self.clip, "label_reports": self.label_reports}

    def load_state_dict(self, state: dict) -> None:
        self.rates = [float(q) for q in state.get("rates", [])]
        self.clip = state.get("clip", self.clip)
        self.label_reports = int(state.get("label_reports", 0))


def privacy_summary(loop) -> dict:
    """The ``privacy`` (and ``stopped``) entries of a run's summary.json from its round loop
    (its aggregation stack's summary: ``privacy/layer.py``)."""
    out: dict = dict(loop.aggregator.summary())
    if loop.stopped:
        out["stopped"] = loop.stopped
    return out
