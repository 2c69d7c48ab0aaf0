"""What the MQTT grid checks of a result answering a bundle task (an edge relaying its
members' updates, ``edge/bundle.py``), before pulling its blobs: the task's shape on the wire,
kept here so that the grid's result checks (``rounds/results.py``) need nothing of ``edge/``.
"""

from __future__ import annotations

from sdk_device.protocol.errors import ProtocolError

from ..methods.base import TrainInstruction

UPDATES = "updates"  # profile["aggregates"] of an edge that only forwards, context["edge"] of a bundle


def is_bundle(instruction: TrainInstruction) -> bool:
    return instruction.context.get("edge") == UPDATES


def check_result(instruction: TrainInstruction, arrays: set[str], metrics: dict) -> None:
    """A bundle result's member records and ``metrics.members`` (ProtocolError): it may lack the
    records of members that did not answer; each record it has needs ``metrics.members[m<k>]``
    with ``samples`` > 0, and those add up to ``metrics.samples``."""
    returned = arrays & set(instruction.context["members"])
    if not returned:
        raise ProtocolError("missing_record", "a bundle result carries no member's model")
    per = metrics.get("members")
    if not isinstance(per, dict) or set(per) != returned:
        raise ProtocolError("invalid_field", f"metrics.members must hold an entry for each returned member "
                                             f"model {sorted(returned)}")
    for name, entry in per.items():
        samples = entry.get("samples") if isinstance(entry, dict) else None
        if type(samples) is not int or samples <= 0:
            raise ProtocolError("invalid_field", f"metrics.members.{name}.samples must be > 0")
    if sum(entry["samples"] for entry in per.values()) != metrics.get("samples"):
        raise ProtocolError("invalid_field", "metrics.samples must be the sum of metrics.members' samples")
