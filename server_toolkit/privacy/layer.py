"""Privacy as a layer of the aggregation stack (``rounds/aggregator.py``): differential
privacy (central or local), label-histogram noise or a robust rule, as ``RoundPrivacy``
applies them (``privacy/round_privacy.py``).

``admit`` stops the run (``BudgetSpent``) before the round that would take epsilon past
``--dp-epsilon``; ``finish`` stamps local DP's clip and noise and the label-noise parameters
on every task; ``aggregate`` is the private or robust aggregate in place of the layers below
(they aggregate when only label noise is on); the state (rates spent, adaptive clip) is the
checkpoint's ``privacy`` entry and the spend is summary.json's ``privacy``.

``on_deltas`` (async mode): the layer sits under ``StalenessFold`` and aggregates a buffer's
staleness-scaled deltas (``rounds/staleness.py``), so central DP clips each scaled delta,
noises the version's sum once and charges the accountant once per version at sampling rate
q = 1 (devices are asked whenever idle: no subsampling to amplify by).

``secure`` (``--secagg``): no update is in the clear; the layer stamps the clip on every task
(the devices clip and mask their deltas) and noises the round's secure sum (the exchange's
``UnmaskedSum``: its ``sums()``) or the sum of the edges' partials (secure groups) once.
"""

from __future__ import annotations

from ..methods.base import ClientUpdate, TrainInstruction, Weights
from ..rounds.aggregator import Aggregator, Finish, RoundInput
from .round_privacy import BudgetSpent, RoundPrivacy
from .settings import PrivacySettings


class PrivateAggregate(Aggregator):
    """``settings`` (active, checked against the method) around the layer below."""

    def __init__(self, inner: Aggregator, settings: PrivacySettings, on_deltas: bool = False,
                 secure: bool = False) -> None:
        super().__init__(inner)
        self.privacy = RoundPrivacy(settings, inner.method, secure)
        self.on_deltas = on_deltas

    def admit(self, rnd: int, rate: float) -> None:
        if why := self.privacy.refusal(rnd, rate):
            raise BudgetSpent(why)
        self.inner.admit(rnd, rate)

    def finish(self, instruction: TrainInstruction, again: Finish) -> TrainInstruction:
        return self.inner.finish(self.privacy.stamp(instruction), again)

    def aggregate(self, rnd: int, global_weights: Weights, updates: list[ClientUpdate],
                  info: RoundInput) -> Weights:
        secure = info.exchange.secure if info.exchange is not None else None
        dp = self.privacy.settings.dp
        sums = secure.sums() if secure is not None and self.privacy.secure and dp else None  # an UnmaskedSum
        private = self.privacy.aggregate(rnd, global_weights, updates, info.rate, info.row, self.on_deltas,
                                         sums)
        return private if private is not None else self.inner.aggregate(rnd, global_weights, updates, info)

    def state_dict(self) -> dict:
        return {**self.inner.state_dict(), "privacy": self.privacy.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.privacy.load_state_dict(state.get("privacy", {}))
        self.inner.load_state_dict(state)

    def summary(self) -> dict:
        mine = self.privacy.summary()
        if self.on_deltas and "dp_assumption" in mine:
            mine["dp_assumption"] = "async: one release per version, no subsampling (q = 1)"
        if self.privacy.secure and "dp_assumption" in mine:
            mine["dp_assumption"] += ("; devices clip under secure aggregation, the server noises the "
                                      "unmasked sum (it sees that sum before the noise)"
                                      if self.privacy.settings.mode == "central" else
                                      "; devices clip and noise under secure aggregation, the server "
                                      "sees only the sum of the noised deltas")
        return {**self.inner.summary(), "privacy": mine}
