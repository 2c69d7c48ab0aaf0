"""Parsing JSON that came over the network: the one place numbers from a peer are bounded.

Python's ``json`` turns any run of digits into an int and the exponent ``1e400`` into
``inf``; a 400-digit integer then breaks whoever converts it (``float()`` raises
OverflowError, sqlite refuses it). ``loads`` rejects such numbers while parsing, so every
receiver (control messages, the server epoch, chunk headers) fails with one ``ValueError``:

* integers outside the signed 64-bit range (|n| > 2**63 - 1, what sqlite and the C++ client
  hold) and floats that are not finite (``1e400``) or written with more than 400 characters;
* ``NaN``, ``Infinity``, ``-Infinity``; nesting deep enough to exhaust the recursion limit.

Decision: a bound for *every* integer, not per field: a field of any type, a key of
``metrics`` or ``profile`` alike, can then be stored or converted without a second check.
"""

from __future__ import annotations

import json
import math
from typing import Any

MAX_INT = 2**63 - 1  # the largest integer a peer may send (sqlite INTEGER, int64_t)
MAX_NUMBER_CHARS = 400  # longer numbers are refused before conversion


def _bounded_int(text: str) -> int:
    if len(text) > MAX_NUMBER_CHARS:
        raise ValueError(f"a number of {len(text)} digits is out of range")
    value = int(text)
    if abs(value) > MAX_INT:
        raise ValueError(f"{text[:24]}... is out of range (|n| <= 2**63 - 1)")
    return value


def _finite_float(text: str) -> float:
    if len(text) > MAX_NUMBER_CHARS:
        raise ValueError(f"a number of {len(text)} characters is out of range")
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:24]} is out of range")
    return value


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not allowed")


def loads(data: bytes | str) -> Any:
    """Parse JSON from a peer; ValueError (never OverflowError or RecursionError) when it is
    not UTF-8, not JSON, or holds a number out of range (module docstring)."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        return json.loads(text, parse_int=_bounded_int, parse_float=_finite_float,
                          parse_constant=_reject_constant)
    except (ValueError, OverflowError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise ValueError(str(exc)) from None
