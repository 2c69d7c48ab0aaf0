"""HeteroFL (Diao et al., 2021): every tier trains the top-left block of each layer.

A device of ratio r gets the first ``ceil(r * C)`` channels of every hidden channel space
(window offset 0, the same every round); results are averaged per element over the
devices covering it. Static BatchNorm; tiers as in ``width_shared``.

As RecipFL's width-scaled baseline: name the tiers ``strong`` and ``weak`` and give their
ratios, e.g. ``--tiers strong,weak,weak --method-option tier_ratios={"strong":1.0,"weak":0.3}``;
evaluation then also reports ``accuracy_strong`` / ``accuracy_weak``: each device's own
width-r sub-model on the test set re-weighted to its labels (``target_accuracy``).

Option ``fresh_windows`` (issue 32; default none): the windows of these ratios start as a fresh
seeded model of their own shape, written into the global initial weights from the largest
ratio to the smallest (so the smallest is exactly a fresh model of its shape, as AllSmall's
is). Why: cut from a fresh full model, a width-r window keeps the full fan-in's scale, sqrt(r)
of a fresh model's (lenet5's 0.25 window: logit std 0.05 against 0.11) and sat at chance for
its first 4-6 rounds on Fashion-MNIST. Server-side only: devices, programs and the
aggregation are unchanged (the paper's "scaler" would change every tier's program instead).

Option ``train_widths`` (issue 32; default none): each round, a device of ratio r trains a
window whose ratio is drawn uniformly from its own r and the listed ratios below r (seeded by
the round and the device id): FjORD's ordered dropout (Horvath et al., 2021), drawn per round
instead of per batch so the device runtimes and programs stay as they are. Why: in plain
HeteroFL only the smallest tier trains the smallest window as a model of its own; the others
train it inside a wider one, and its deployable accuracy lagged AllSmall's.

Option ``train_widths_weight`` (issue 32; default 1.0, the uniform draw above): the weight of
each ``train_widths`` ratio in that draw against the device's own ratio's weight 1, e.g. 0.5
(a narrower window half as likely as the own one: the wide windows keep more of their
training) or 2.0 (the narrow windows trained more often, toward AllSmall's small model).

Option ``narrowest_owns`` (issue 32; default off): per element, the new value is the mean over
only those covering updates whose *trained* ratio is the narrowest among this round's covering
ones (elements nobody covers keep their value). So the smallest window is averaged over the
devices that trained it as a model of its own, as AllSmall's model is, and a wider window's
update changes only the channels outside the narrower windows trained this round. Why
(measured, tiers 1.0 / 0.5 / 0.125, BENCHMARKS "Width, beyond HeteroFL"): with ``train_widths``
alone the 0.125 window, also averaged with the wider models' updates of its elements, stayed
5.7 pts below AllSmall. With it the aggregate is no longer one weighted mean per element
(``weighted_sum`` None: edges, async, DP and secure aggregation refuse it).

Option ``also_narrowest=r_min`` (issue 32; default 0, off): a device wider than r_min trains,
in the same task, the narrowest window too (``nested.py``: step ``"narrow"``, then its own
window; both returned), and the r_min window is the sample-weighted mean of every device's
narrow model, in the updates' order: exactly AllSmall's FedAvg (with ``fresh_windows``
holding r_min, the 0.125 tier's deployable model equals AllSmall's bit for bit, measured and
tested). The other elements are the coverage mean of the wide windows. Why: with
``train_widths`` / ``narrowest_owns`` the narrowest window matched AllSmall only when the wide
devices gave up their own rounds for it (BENCHMARKS "A smallest tier that is really small");
here every device trains it every round, at about (r_min / r)² of its own window's compute
(1/64 for a full device at r_min 0.125). Decisions, measured at seed 0, α 0.5 (tiers 1.0 /
0.5 / 0.125, BENCHMARKS "also_narrowest"): ``also_narrowest_inner="narrow"`` (default; a wide
window's values inside the narrow window are discarded: 0.842 / 0.816 / 0.763, AllSmall 0.763)
over ``"average"`` (averaged in: 0.861 / 0.826 / 0.726, the smallest tier −3.7); no
distillation by default (``also_narrowest_kd=0.5``, the wide step's kd loss from the fresh
narrow model: 0.798 / 0.779 / 0.763; from the fleet's narrow model as received,
``also_narrowest_kd_teacher="global"``: 0.805 / 0.787 / 0.760, and its small wide deltas let the
norm bound clip the 0.125 devices' own updates). Seeds 0-2: at α 0.5 the 0.125 tier equals
AllSmall (0.761 ± 0.018), the 0.5 tier 0.804 ± 0.010 (beyond both stds), the full tier 0.805 ±
0.042 (ahead in every seed, +1.6 to +7.9, within the stds); at α 0.1 the wide tiers were not
above AllSmall (0.677 / 0.649 vs 0.674). Each device returns two models, which edges (a bundle
carries one model per member), async, DP and secure aggregation do not read: ``weighted_sum``
None and ``bundles`` False, so each refuses it in one line. A device without the torch
runtime trains only its own window (the narrow model is offered as ``torchspec/1`` only).

Option ``also_nested`` (issue 32; default false; needs ``also_narrowest`` with its defaults
``also_narrowest_inner="narrow"`` and no kd): a device also trains every fleet window between
r_min and its own ratio (``nested.py``: models ``"nested_1"``, ... after ``"narrow"``), and the
aggregate gives each window level its own elements (``coverage.narrowest_average`` over
(trained ratio, model) pairs): the r_min window is AllSmall's FedAvg as above, a 0.5 window's
elements outside it the mean of every 0.5 model (the 0.5 devices' own, the full devices'
second one), the full window's outer elements the full models'. Why: under ``also_narrowest``
the middle window's own channels were trained by its tier and the full tier only as parts of
wider models; at α 0.1 each tier's few devices hold a few classes. Cost: a full device at 1.0
/ 0.5 / 0.125 trains 1 + 1/4 + 1/64 of its window a round.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from fedcore.recipe import Recipe

from ...submodels.offsets import heterofl_offsets
from ...submodels.width import WidthPlan, extract, plan_args
from ..base import ClientUpdate, DeviceInfo, TrainInstruction, Weights
from ..capability import WINDOW, WeightedSum
from ..options import OptionError, option
from ..target_accuracy import TargetAccuracy, role_by_tier_name
from .coverage import narrowest_average, nested_average
from .nested import narrow_returns, window_returns, with_narrow, with_windows
from .width_shared import WidthOptions, WidthSharedMethod


@dataclass(frozen=True)
class HeteroFLOptions(WidthOptions):
    fresh_windows: list[float] = option(
        [], "Width ratios in (0, 1) whose windows start as a fresh model of their own shape, e.g. "
        "[0.5, 0.25] (default none: every window is cut from a fresh full model).")
    train_widths: list[float] = option(
        [], "Ratios in (0, 1) a wider device may train instead of its own, drawn each round, e.g. "
        "[0.5, 0.25] (FjORD's ordered dropout per round; default none: its own ratio).")
    train_widths_weight: float = option(
        1.0, "Weight of each train_widths ratio in a device's draw against its own ratio's 1, "
        "e.g. 0.5 or 2.0 (default 1.0: uniform).")
    narrowest_owns: bool = option(
        False, "Average each element over only the updates of the narrowest window trained over it "
        "this round (default false: over every covering update).")
    also_narrowest: float = option(
        0.0, "Ratio r_min in (0, 1) of the narrowest window: a wider device also trains it, in the same "
        "task, and it is averaged over every device's copy, e.g. 0.125 (default 0: off).")
    also_narrowest_inner: str = option(
        "narrow", "With also_narrowest, what a wide window's values inside the narrowest window do: "
        "'narrow' (discarded, the narrow models own them) or 'average' (averaged in beside them).")
    also_narrowest_kd: float = option(
        0.0, "With also_narrowest, the wide step distils from the device's fresh narrow model with the "
        "kd loss at this alpha in [0, 1], temperature 1 (default 0: plain cross-entropy).")
    also_nested: bool = option(
        False, "With also_narrowest, a device also trains every fleet window between r_min and its own "
        "ratio, and each window's own elements are averaged over that window's models only (default false).")
    also_narrowest_kd_teacher: str = option(
        "trained", "With also_narrowest_kd, the teacher: 'trained' (the device's narrow model after its "
        "step) or 'global' (the narrow model as received, frozen).")


class HeteroFL(WidthSharedMethod):
    name = "heterofl"
    asks = {"label_counts": {}}  # accuracy_strong / accuracy_weak weigh the test set by them
    family = "width"
    example = "--tiers 1.0,0.75,0.5,0.25"
    Options = HeteroFLOptions
    options: HeteroFLOptions
    # declared again: aggregate_train below is coverage_average unless narrowest_owns (then the
    # instance says None, __init__)
    weighted_sum = WeightedSum(WINDOW)

    def __init__(self, global_spec: dict, recipe: Recipe, **options) -> None:
        super().__init__(global_spec, recipe, **options)
        self.targets = TargetAccuracy(int(global_spec["num_classes"]))
        for name in ("fresh_windows", "train_widths"):
            if bad := [r for r in getattr(self.options, name)
                       if not isinstance(r, int | float) or isinstance(r, bool) or not 0 < r < 1]:
                raise OptionError(f"method 'heterofl': option {name} takes ratios in (0, 1), got {bad}")
        weight = self.options.train_widths_weight
        if not isinstance(weight, int | float) or isinstance(weight, bool) or not weight > 0:
            raise OptionError(
                f"method 'heterofl': option train_widths_weight takes a number > 0, got {weight!r}")
        if self.options.narrowest_owns:
            self.weighted_sum = None  # module docstring
            self.not_a_sum = ("with narrowest_owns it averages each element over the narrowest "
                              "windows trained over it, not over every covering update")
        self._check_also_narrowest()

    def _check_also_narrowest(self) -> None:
        """OptionError for a bad ``also_narrowest*`` option; with it on, not a weighted sum."""
        o = self.options
        if not isinstance(o.also_narrowest, int | float) or isinstance(o.also_narrowest, bool) \
                or not 0 <= o.also_narrowest < 1:
            raise OptionError(f"method 'heterofl': option also_narrowest takes a ratio in (0, 1) or 0 (off), "
                              f"got {o.also_narrowest!r}")
        if o.also_narrowest_inner not in ("narrow", "average"):
            raise OptionError("method 'heterofl': option also_narrowest_inner takes 'narrow' or 'average', "
                              f"got {o.also_narrowest_inner!r}")
        if not isinstance(o.also_narrowest_kd, int | float) or isinstance(o.also_narrowest_kd, bool) \
                or not 0 <= o.also_narrowest_kd <= 1:
            raise OptionError(f"method 'heterofl': option also_narrowest_kd takes a number in [0, 1], "
                              f"got {o.also_narrowest_kd!r}")
        if o.also_narrowest_kd_teacher not in ("trained", "global"):
            raise OptionError("method 'heterofl': option also_narrowest_kd_teacher takes 'trained' or "
                              f"'global', got {o.also_narrowest_kd_teacher!r}")
        if not isinstance(o.also_nested, bool):
            raise OptionError(f"method 'heterofl': option also_nested takes true or false, "
                              f"got {o.also_nested!r}")
        if o.also_nested and not (o.also_narrowest and o.also_narrowest_inner == "narrow"
                                  and not o.also_narrowest_kd):
            raise OptionError("method 'heterofl': option also_nested needs also_narrowest, with "
                              "also_narrowest_inner 'narrow' and no also_narrowest_kd")
        if not o.also_narrowest:
            return
        if o.narrowest_owns:
            raise OptionError("method 'heterofl': also_narrowest and narrowest_owns exclude each other "
                              "(both decide who owns the narrow window)")
        self.weighted_sum = None  # module docstring
        self.bundles = False  # a bundle edge carries one model per member
        self.not_a_sum = ("with also_narrowest each device returns two models (its window and the "
                          "narrowest one), and this feature reads one")

    def initial_weights(self, seed: int) -> Weights:
        """A fresh full model, each ``fresh_windows`` window overwritten by a fresh model of its
        own shape (same seed), the largest ratio first (module docstring)."""
        from fedcore.torch_model import build_model, state_numpy

        weights = super().initial_weights(seed)
        for ratio in sorted(set(self.options.fresh_windows), reverse=True):
            plan = self.layout.plan(float(ratio), {})
            fresh = state_numpy(build_model(plan.spec, seed=seed))
            for name, indices in plan.index_map.items():
                weights[name][np.ix_(*indices)] = fresh[name]
        return weights

    def nested_ratios(self) -> list[float]:
        """``also_narrowest``'s r_min: every device trains that window (``deploy="nested"``)."""
        return [float(self.options.also_narrowest)] if self.options.also_narrowest else []

    def offsets(self, round_number: int, device: DeviceInfo, ratio: float) -> dict[int, int]:
        return heterofl_offsets(self.layout, ratio, round_number)

    def training_ratio(self, round_number: int, device: DeviceInfo) -> float:
        """The ratio ``device`` trains in ``round_number``: its own, or one of ``train_widths``
        below it, drawn with weight ``train_widths_weight`` each against the own ratio's 1
        (deterministic in the round and the device id)."""
        ratio = self.ratio_of(device)
        choices = sorted({ratio, *(float(r) for r in self.options.train_widths if r < ratio)})
        if len(choices) == 1:
            return ratio
        rng = np.random.default_rng([round_number, zlib.crc32(device.device_id.encode())])
        weight = float(self.options.train_widths_weight)
        if weight == 1.0:  # the uniform draw, as before the option
            return choices[int(rng.integers(len(choices)))]
        odds = np.array([weight] * (len(choices) - 1) + [1.0])  # choices ascend: the own ratio last
        return choices[int(rng.choice(len(choices), p=odds / odds.sum()))]

    def plan_for(self, round_number: int, device: DeviceInfo) -> WidthPlan:
        ratio = self.training_ratio(round_number, device)
        return self.layout.plan(ratio, self.offsets(round_number, device, ratio))

    def aggregate_train(self, round_number: int, global_weights: Weights,
                        updates: list[ClientUpdate]) -> Weights:
        if self.options.also_nested:
            return narrowest_average(global_weights, self._window_contributions(updates))
        if r_min := self.options.also_narrowest:
            narrow, wide = [], []
            for update, own in zip(updates, self.contributions(updates), strict=True):
                # in the updates' order, as FedAvg sums: the narrow window then equals AllSmall's bit for bit
                (narrow if plan_args(update.instruction.context)[0] <= r_min else wide).append(own)
                narrow += narrow_returns([update], self.index_map)
            return nested_average(global_weights, narrow, wide, self.options.also_narrowest_inner)
        if not self.options.narrowest_owns:
            return super().aggregate_train(round_number, global_weights, updates)
        return narrowest_average(global_weights, [
            (plan_args(u.instruction.context)[0], contribution)
            for u, contribution in zip(updates, self.contributions(updates), strict=True)])

    def _window_contributions(self, updates: list[ClientUpdate]) -> list[tuple[float, tuple]]:
        """``also_nested``: (trained ratio, contribution) of every returned model, in the updates'
        order: each update's own window, its narrow model, then its nested windows."""
        out = []
        for update, own in zip(updates, self.contributions(updates), strict=True):
            out.append((plan_args(update.instruction.context)[0], own))
            out += [(float(self.options.also_narrowest), c) for c in narrow_returns([update], self.index_map)]
            out += [(plan_args(context)[0], c) for context, c in window_returns(update, self.index_map)]
        return out

    def role_of(self, device: DeviceInfo) -> str | None:
        return role_by_tier_name(device)

    def configure_train(self, round_number: int, global_weights: Weights,
                        devices: list[DeviceInfo]) -> list[TrainInstruction]:
        self.targets.see(devices, self.role_of)
        instructions = super().configure_train(round_number, global_weights, devices)
        if not (r_min := self.options.also_narrowest):
            return instructions
        by_id = {d.device_id: d for d in devices}
        out = []
        for instruction in instructions:
            device = by_id[instruction.device_id]
            if plan_args(instruction.context)[0] <= r_min or "torch" not in device.runtimes:
                out.append(instruction)  # the narrowest devices' own model; no torch: no second model
                continue
            plan = self.layout.plan(float(r_min), self.offsets(round_number, device, float(r_min)))
            instruction = with_narrow(instruction, plan, extract(global_weights, plan.index_map),
                                      float(self.options.also_narrowest_kd),
                                      self.options.also_narrowest_kd_teacher)
            if self.options.also_nested:
                own = plan_args(instruction.context)[0]
                between = sorted(q for q in self.fleet_ratios if r_min < q < own)
                plans = [self.layout.plan(q, self.offsets(round_number, device, q)) for q in between]
                instruction = with_windows(instruction,
                                           [(p, extract(global_weights, p.index_map)) for p in plans])
            out.append(instruction)
        return out

    def aggregate_evaluate(self, round_number: int, updates: list[ClientUpdate]) -> dict:
        self.targets.report(updates)
        return super().aggregate_evaluate(round_number, updates)

    def evaluate(self, global_weights: Weights, x: np.ndarray, y: np.ndarray) -> dict:
        def target(device: DeviceInfo, role: str) -> tuple[dict, Weights]:
            plan = self.layout.plan(self.ratio_of(device), {})  # the tier's own window
            return plan.spec, extract(global_weights, plan.index_map)

        return {**super().evaluate(global_weights, x, y), **self.targets.evaluate(target, x, y)}

    def state_dict(self) -> dict:
        return {"targets": self.targets.state()}

    def load_state_dict(self, state: dict) -> None:
        self.targets.load(state.get("targets", {}))
