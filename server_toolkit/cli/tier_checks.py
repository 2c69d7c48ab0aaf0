"""``--tiers`` (and ``tier_map``'s tiers) checked against what the method reads a tier as,
before anything starts: a tier the method cannot read is one line at once, not a failure in
round 1 after the broker and the devices have started.

What a tier is, by the method's family (the same rules the methods apply in their rounds):

* width and conv (``tier_ratios`` option): a width ratio in (0, 1] or a name in ``tier_ratios``;
* exit (``depthfl``, ``hypemefed``): an exit count 1..S, S the model's outputs (its exits and
  the final classifier), or a name in ``tier_exits`` (``depthfl``);
* personalised (``pfedhn``, ``mh-pfedhn``, …): an architecture name (``NAME`` or ``NAME@R``);
* resource-skew (``strong_tiers`` option): any name; one in ``strong_tiers`` is strong, the
  others weak. Not an error; a warning when no tier is strong (every device then trains the
  small model);
* methods that train one model on every device (``ignores_tiers``): a warning that ``--tiers``
  is ignored (with ``--edges`` tiers still group the devices).
"""

from __future__ import annotations

import click

from .method_choice import did_you_mean
from .warning import warn


def check_tiers(cls: type, options: object, tiers: list[str], edges: bool,
                outputs: int | None = None, tier_map: dict[str, str] | None = None) -> None:
    """Every tier of ``tiers`` (``--tiers``) and ``tier_map`` ({device id: tier}) readable by
    method ``cls`` with its parsed ``options``; ``outputs`` is the model's output count (exit
    methods; None when unknown: then any count >= 1 passes). click.UsageError naming the first
    tier that is not."""
    given = [("--tiers", t) for t in tiers] + [(f"tier_map[{d!r}]", t) for d, t in (tier_map or {}).items()]
    if not given:
        return
    if cls.ignores_tiers and not edges:
        warn(f"{' and '.join(dict.fromkeys(w.partition('[')[0] for w, _ in given))} ignored: {cls.name} "
             "trains one model on every device (a width method such as heterofl reads tiers)")
        return
    for where, tier in given:
        problem = tier_problem(cls, options, tier, outputs)
        if problem:
            what, names = problem
            raise click.UsageError(f"{where}: {cls.name} reads a tier as {what}; {tier!r} is not one"
                                   + did_you_mean(tier, names))
    strong = getattr(options, "strong_tiers", None)
    if strong is not None:
        names = {n.strip() for n in (strong.split(",") if isinstance(strong, str) else strong)}
        if not names & {tier for _, tier in given}:
            shown = ", ".join(dict.fromkeys(tier for _, tier in given))
            warn(f"--tiers: none of {shown} is in strong_tiers ({', '.join(sorted(names))}): every "
                 f"device is weak and trains {cls.name}'s small model")


def tier_problem(cls: type, options: object, tier: str, outputs: int | None) -> tuple[str, list[str]] | None:
    """None when ``cls`` can read ``tier``; else (what it reads a tier as, the tier names it
    knows, for a "did you mean")."""
    from ..methods.base import DeviceInfo
    from ..methods.exit.depthfl import DepthFL
    from ..methods.hypernet.personalized import PersonalizedMethod
    from ..methods.tiers import tier_ratio

    ratios = getattr(options, "tier_ratios", None)
    if ratios is not None:
        try:
            tier_ratio(DeviceInfo("tier", 0, tier), ratios)
        except ValueError:
            return f"a width ratio in (0, 1] or a name in tier_ratios {sorted(ratios)}", list(ratios)
        return None
    if issubclass(cls, DepthFL):
        exits = getattr(options, "tier_exits", {}) or {}
        if tier in exits or (tier.isdigit() and 1 <= int(tier) <= (outputs or int(tier))):
            return None
        counts = f"an exit count 1..{outputs}" if outputs else "an exit count (1, 2, ...)"
        return counts + (f" or a name in tier_exits {sorted(exits)}" if exits else ""), list(exits)
    if issubclass(cls, PersonalizedMethod):
        from ..models.architectures import architecture_names

        names = architecture_names()
        if tier.strip().lower().partition("@")[0] not in names:
            return f"an architecture name (NAME or NAME@R: NAME at width R) among {', '.join(names)}", names
    return None


def model_outputs(model: str | None, dataset: str | None) -> int | None:
    """How many outputs (exits + the final classifier) zoo model ``model`` has, built for a
    known dataset's shape (another dataset: a 1x28x28, 10-class input); None for a user's
    model or one that cannot be built so (its exit count is then checked in round 1)."""
    from ..byo.load import is_user_ref
    from ..data.catalogue import known_dataset
    from ..data.errors import DatasetError
    from ..models.zoo import model_spec
    from ..submodels.exit_split import num_tiers

    if not model or is_user_ref(model):
        return None
    try:
        known = known_dataset(dataset or "")
        shape, classes = (1, *known.image_shape), known.num_classes
    except DatasetError:
        shape, classes = (1, 28, 28), 10
    try:
        return num_tiers(model_spec(model, shape, classes))
    except (ValueError, KeyError, TypeError):
        return None
