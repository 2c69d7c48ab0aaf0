"""Options of different features that do not combine yet, refused before anything starts.

Each of privacy (``--dp-*``, ``--label-noise-epsilon``, ``--robust``), secure aggregation
(``--secagg``), asynchronous mode (``--mode async``) and edge aggregators (``--edges``) changes
how a round's updates become the global model, and each was built on the plain synchronous
round: the aggregation path of one would silently skip the other (e.g. an async version would
fold updates without the DP noise). Until a pair is built and tested together it is refused
in one line. Built and tested together: ``--mode async`` with ``--edges`` (``docs/async.md``).
"""

from __future__ import annotations

import click

PRIVACY = ("dp_clip", "dp_adaptive_clip", "dp_noise_multiplier", "label_noise_epsilon", "robust")


def _features(params: dict) -> list[str]:
    """The aggregation features ``params`` switch on, as the options a user typed."""
    on = []
    if any(params.get(name) for name in PRIVACY):
        on.append("--dp-*/--label-noise-epsilon/--robust")
    if params.get("secagg"):
        on.append("--secagg")
    if params.get("mode") == "async":
        on.append("--mode async")
    if params.get("edges") and params.get("mode") != "async":  # async behind edges: built (docs/async.md)
        on.append("--edges")
    return on


def validate(params: dict) -> None:
    """Refuse two aggregation features at once (a ``validate.py`` validator)."""
    on = _features(params)
    if len(on) > 1:
        raise click.UsageError(f"{on[0]} and {on[1]} do not combine (yet): each replaces how a round's "
                               "updates are aggregated; use one of them")
