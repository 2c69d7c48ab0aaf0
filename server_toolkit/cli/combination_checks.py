"""Which aggregation features combine, decided pair by pair before anything starts.

The features are layers of one aggregation stack (``rounds/aggregator.py``, built by
``assembly.py:aggregation_stack``): edges (``--edges``), async (``--mode async``), secure
aggregation (``--secagg``), central DP (``--dp-clip`` in ``--dp-mode central``), local DP
(``--dp-mode local``), label-histogram noise (``--label-noise-epsilon``) and a robust rule
(``--robust``). A set of them runs when every pair in it runs; ``REFUSED`` holds each pair
that does not, with its reason in one line (the table in ``docs/privacy.md`` is checked
against it by ``tests/unit/test_combination_checks.py``). Method-level refusals (a method
that is not a weighted sum, ...) are the features' own checks.

How the pairs that run are built: under privacy (DP, label noise, robust) every edge
forwards its members' updates instead of their sum (``edge/layer.py``), so the server clips,
noises (once, on the round's sum) or takes a median over the flat round; under async the
privacy layer sits under the staleness fold and noises each version's sum once
(``privacy/layer.py``); async behind edges folds the edges' partials into the buffer; under
secure aggregation each edge runs its group's rounds as secure aggregations and sends up its
group's unmasked sum only (``edge/secure_group.py``).

Secure aggregation with central DP (distributed clipping, central noise): no update is in the
clear, so the server cannot clip; each device clips its own delta to C and masks it with weight
1 (the recipe's ``dp_secure_clip``), the server (or each secure edge) unmasks the sum, and the
server adds N(0, (zC)^2) once and divides by the coverage, exactly as central DP does with the
deltas it clipped itself; the accountant charges one release per round (per version in async
mode) at the same rate. The norm bound is off (the device's clip bounds every update, the bound
would need updates in the clear); adaptive clipping is refused (``privacy/round_privacy.py:ADAPTIVE``).

Secure aggregation with local DP: each device clips and noises its own delta (recipe
``dp_clip``, ``dp_noise``) and, in a secure round, masks that noised delta with weight 1
(``sdk_device/secagg_sessions.py``), so the unmasked sum is the unweighted sum local DP
averages; the server (or each secure edge) divides by the coverage and adds nothing; epsilon is
local DP's, one release per round. Secure aggregation with label-histogram noise: the devices
noise their histograms themselves and send them in the clear by design (local label DP), in
the secure round's ``masked`` message beside the masked vector; a secure edge passes the noise
parameters to its group and sums the noised histograms; the privacy layer sits on top of
``SecureSum`` and counts them as without secure aggregation.

Async with local DP or label-histogram noise (refused; decision): both epsilons are a device's
k noised releases composed, and the accountant counts k as the rounds (a device takes part in
each round at most once). In async mode a version folds whoever arrived, and a fast device may
release several updates (histograms) per version, so k would be its own count of releases;
the accountant does not keep one per device, so the pair is refused rather than reported low.

Async with secure aggregation (``NEEDS_EDGES``): the masks cancel only over a cohort that agreed
keys before training, and a buffer fills with whoever arrives, so the server runs no secure
round itself; behind edges each edge's group is such a cohort (a synchronous secure round per
task) and the async server folds each edge's sum into the buffer with its staleness. Flat async
+ SecAgg (``simulate`` without ``--edges``) is refused; ``run`` (whose edges say hello
themselves) gives tasks to secure edges only (``secagg/layer.py``).
"""

from __future__ import annotations

import click

EDGES, ASYNC, SECAGG, CENTRAL_DP, LOCAL_DP, LABEL_NOISE, ROBUST = (
    "edges", "async", "secagg", "central DP", "local DP", "label noise", "robust")
FEATURES = (EDGES, ASYNC, SECAGG, CENTRAL_DP, LOCAL_DP, LABEL_NOISE, ROBUST)
OPTIONS = {EDGES: "--edges", ASYNC: "--mode async", SECAGG: "--secagg", CENTRAL_DP: "--dp-clip (central)",
           LOCAL_DP: "--dp-mode local", LABEL_NOISE: "--label-noise-epsilon", ROBUST: "--robust"}

NEEDS_EDGES: dict[frozenset[str], str] = {
    frozenset({SECAGG, ASYNC}): "the masks cancel only over a cohort that agreed keys before training, and "
                                "a buffer fills with whoever arrives; behind edges each group is one",
}
REFUSED: dict[frozenset[str], str] = {
    frozenset({SECAGG, ROBUST}): "a median or trimmed mean cannot be computed from a masked sum",
    frozenset({ASYNC, LOCAL_DP}): "local DP's epsilon is k noised releases per device, counted as k = "
                                  "rounds; under async a fast device releases several updates per "
                                  "version, so k is not the number of versions",
    frozenset({ASYNC, LABEL_NOISE}): "the label epsilon is k histograms per device, counted as k = rounds; "
                                     "under async a fast device reports several per version, so k is not "
                                     "the number of versions",
    frozenset({CENTRAL_DP, LOCAL_DP}): "one --dp-mode per run: central or local",
    frozenset({CENTRAL_DP, ROBUST}): "the noise is calibrated to a sum; a median's sensitivity is not "
                                     "bounded by the clip",
    frozenset({LOCAL_DP, ROBUST}): "the noise is calibrated to a sum; a median's sensitivity is not "
                                   "bounded by the clip",
}


def features(params: dict) -> list[str]:
    """The aggregation features ``params`` (a command's options) switch on, in ``FEATURES`` order."""
    dp = params.get("dp_clip") is not None or params.get("dp_adaptive_clip") is not None
    local = dp and params.get("dp_mode") == "local"
    on = {EDGES: bool(params.get("edges")), ASYNC: params.get("mode") == "async",
          SECAGG: bool(params.get("secagg")), CENTRAL_DP: dp and not local, LOCAL_DP: local,
          LABEL_NOISE: params.get("label_noise_epsilon") is not None,
          ROBUST: params.get("robust") is not None}
    return [name for name in FEATURES if on[name]]


def refusal(on: list[str], flat: bool = True) -> str | None:
    """The one-line reason the features ``on`` cannot run together (None: they can); ``flat``:
    the command says how many edges there are (``simulate``), so a ``NEEDS_EDGES`` pair without
    edges is refused too."""
    for i, first in enumerate(on):
        for second in on[i + 1:]:
            why = REFUSED.get(frozenset({first, second}))
            if why:
                return f"{OPTIONS[first]} and {OPTIONS[second]} do not combine: {why}"
            why = NEEDS_EDGES.get(frozenset({first, second}))
            if why and flat and EDGES not in on:
                return f"{OPTIONS[first]} and {OPTIONS[second]} do not combine without --edges: {why}"
    return None


def validate(params: dict) -> None:
    """Refuse a refused pair of aggregation features, and adaptive clipping under secure
    aggregation (a ``validate.py`` validator)."""
    why = refusal(features(params), flat="edges" in params)
    if why:
        raise click.UsageError(why)
    if params.get("secagg") and params.get("dp_adaptive_clip") is not None:
        from ..privacy.round_privacy import ADAPTIVE

        raise click.UsageError(f"--dp-adaptive-clip and --secagg do not combine: {ADAPTIVE}")
