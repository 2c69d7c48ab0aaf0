"""The one error type of dataset handling."""

from __future__ import annotations


class DatasetError(ValueError):
    """A dataset could not be found, read, validated, verified or fetched.

    The message is one line and names the file or directory concerned."""


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (its type name when it has none)."""
    return " ".join(str(exc).split()) or type(exc).__name__
