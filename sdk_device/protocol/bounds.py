"""The bounds of every field of every control message, in one place (docs/protocol.md §5.2).

``messages.decode`` checks each field's JSON type against the message's dataclass; then
``check_fields`` checks what this table states, by field name (a name means the same in every
message): integers in range, floats in range, strings of bounded length and alphabet, lists of
bounded length, free-form objects (``profile``, ``metrics``, ``config``, …) of bounded depth.
Anything else is ``invalid_field``: never a traceback, never stored. Decision: ids that the
doc's examples write as ``…`` (``msg_id``, ``task_id``, ``ref``) allow any printable text, since
only their equality matters, and so do texts a person typed (a pairing ``code``, a ``name``: the
pairing service judges them, §19); names that become topic levels or registry keys
(``device_id``, ``runtimes``, ``kind``, ``format``, …) have a strict alphabet.
"""

from __future__ import annotations

import re
from typing import Any

from .errors import ProtocolError

MAX_SAMPLES = 10**9  # hello.num_samples (and a result's metrics.samples) at most this
MAX_INT32 = 2**31 - 1
MAX_TIME = 1e13  # unix seconds (far past any real date): sent_at, deadline, server_time, expires_at
MAX_DEPTH = 16  # nesting of free-form objects (profile, metrics, config, data, models, recipe)

_PRINTABLE = r"[^\x00-\x1f\x7f]"
# field name -> (lowest, highest) for integers and floats
RANGES: dict[str, tuple[float, float]] = {
    "round": (0, MAX_INT32), "num_samples": (1, MAX_SAMPLES), "size": (0, 2**53),
    "chunk_bytes": (0, MAX_INT32), "indices": (0, MAX_INT32),  # (holders judge chunk_bytes, §7.2)
    "sent_at": (0, MAX_TIME), "deadline": (0, MAX_TIME), "server_time": (0, MAX_TIME),
    "expires_at": (0, MAX_TIME), "progress": (0.0, 1.0), "holdout": (0.0, 0.5),  # holdout.MAX_FRACTION
}
# field name -> the whole-string pattern of its value (for a list: of each item)
PATTERNS: dict[str, re.Pattern] = {name: re.compile(pattern) for name, pattern in {
    "msg_id": f"{_PRINTABLE}{{1,128}}", "task_id": f"{_PRINTABLE}{{1,128}}", "ref": f"{_PRINTABLE}{{0,128}}",
    "session": f"{_PRINTABLE}{{1,256}}",
    "device_id": r"[A-Za-z0-9_.-]{1,64}", "username": r"[A-Za-z0-9_.-]{1,64}",
    "fleet": r"[A-Za-z0-9_.-]{1,64}", "name": f"{_PRINTABLE}{{1,64}}", "tier": r"[A-Za-z0-9_.-]{0,64}",
    "runtimes": r"[A-Za-z0-9_.+-]{1,64}", "state": r"[a-z_]{1,32}", "stage": r"[a-z_]{1,32}",
    "code": f"{_PRINTABLE}{{1,64}}", "kind": r"[A-Za-z0-9_.+/-]{1,64}", "format": r"[A-Za-z0-9_.+/-]{1,64}",
    "blob": r"[0-9a-f]{64}", "holdout_model": r"[a-z][a-z0-9_]{0,31}",  # a model name (task_plan.NAME)
    "holdout_members": r"[a-z][a-z0-9_]{0,31}",  # model names too
}.items()}
# field name -> most items in its list (other lists: 1024)
LIST_MAX = {"runtimes": 16, "indices": 64, "blobs": 64, "holdout_members": 8}  # holdout.MAX_MEMBERS
FREE_FORM = {"profile", "metrics", "config", "data", "models", "recipe"}


def check_fields(values: dict[str, Any], where: str) -> None:
    """Check the decoded fields of one message (or a BlobRef) against the table above."""
    for name, value in values.items():
        if isinstance(value, list):
            most = LIST_MAX.get(name, 1024)
            if len(value) > most:
                raise ProtocolError("invalid_field", f"{where}.{name}: at most {most} items")
            for item in value:
                _check_value(name, item, where)
        elif name in FREE_FORM:
            if _depth(value) > MAX_DEPTH:
                raise ProtocolError("invalid_field", f"{where}.{name}: nested deeper than {MAX_DEPTH}")
        else:
            _check_value(name, value, where)


def _check_value(name: str, value: Any, where: str) -> None:
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, int | float) and name in RANGES:
        low, high = RANGES[name]
        if not low <= value <= high:
            raise ProtocolError("invalid_field", f"{where}.{name} must be in {low:g}..{high:g}, "
                                                 f"got {value!r:.40}")
    elif isinstance(value, str) and name in PATTERNS and not PATTERNS[name].fullmatch(value):
        raise ProtocolError("invalid_field", f"{where}.{name}: {value!r:.40} is not a valid {name}")


def _depth(value: Any) -> int:
    """How deeply ``value`` nests objects and lists (a scalar: 0); stops counting past MAX_DEPTH."""
    stack, deepest = [(value, 0)], 0
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list) and depth <= MAX_DEPTH:
            deepest = max(deepest, depth + 1)
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest
