"""Names chosen from a list on the command line (``--method``, ``--model``, ``--dataset``, …).

``--method``'s help lists the registered methods (built in and from the ``fedsdk.methods``
entry-point group), read only when the help is shown: the registry imports torch, and a
command must not pay that to start. A name that is not in its list gets one line naming the
closest choices (``did you mean heterofl?``, by ``difflib``) before the full list.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

import click


class MethodOption(click.Option):
    """An option naming a federated method; ``--help`` shows the choices."""

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        from ..methods import methods

        record = super().get_help_record(ctx)
        if record is None:
            return None
        names = ", ".join(sorted(methods()))
        return record[0], f"{record[1]} One of: {names} (`fedsdk-server methods list`)."


def close_choices(name: str, choices: Iterable[str]) -> list[str]:
    """The (at most three) ``choices`` closest to ``name``, best first, compared without case,
    ``-`` or ``_``; empty when none is close (difflib's ratio below 0.6)."""
    def key(text: str) -> str:
        return text.lower().replace("-", "").replace("_", "")

    by_key: dict[str, str] = {}
    for choice in choices:
        by_key.setdefault(key(choice), choice)
    return [by_key[k] for k in difflib.get_close_matches(key(name), list(by_key), n=3, cutoff=0.6)]


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """``" (did you mean heterofl?)"`` (``… fedavg, fedavgm or fedavg-groups?`` for several), or
    ``""`` when no choice is close to ``name``."""
    close = close_choices(name, choices)
    if not close:
        return ""
    listed = close[0] if len(close) == 1 else f"{', '.join(close[:-1])} or {close[-1]}"
    return f" (did you mean {listed}?)"


def unknown_choice(option: str, name: str, choices: Iterable[str], more: str = "") -> str:
    """One line for a name not in ``choices``: ``unknown --method 'hetrofl' (did you mean
    heterofl?); one of: …`` (``more`` is appended to the list, e.g. ``" or npz:<path>"``)."""
    choices = list(choices)
    return f"unknown {option} {name!r}{did_you_mean(name, choices)}; one of: {', '.join(choices)}{more}"
