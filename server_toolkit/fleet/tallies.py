"""What the registry file says about each device's results (and why it has its tier), read on a
connection of its own.

A dashboard polls this while the round loop writes: its own read-only connection (the registry
is in WAL mode) never waits for the registry's lock, and one GROUP BY per table serves any fleet
size.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Tallies:
    """Per device: updates accepted, results rejected, the last rejection (``code: detail``), the
    summary of the reason stored with its tier (pairing, ``retier``) and the arch it reported when
    pairing; and the rejections of the whole run by reason code."""

    accepted: dict[str, int] = field(default_factory=dict)
    rejected: dict[str, int] = field(default_factory=dict)
    last_error: dict[str, str] = field(default_factory=dict)
    by_reason: dict[str, int] = field(default_factory=dict)
    tier_reason: dict[str, str] = field(default_factory=dict)
    pair_arch: dict[str, str] = field(default_factory=dict)


def read_tallies(registry_path: Path, fleet_path: Path | None = None) -> Tallies:
    """The tallies of the registry at ``registry_path``, its devices' tier reasons from
    ``fleet_path`` when the fleet has a file of its own (empty when a file does not exist yet)."""
    out = Tallies()
    if not Path(registry_path).exists():
        return out
    db = sqlite3.connect(f"{Path(registry_path).resolve().as_uri()}?mode=ro", uri=True, timeout=5)
    try:
        for device, count in db.execute("SELECT device_id, COUNT(*) FROM updates GROUP BY device_id"):
            out.accepted[device] = count
        # SQLite takes the bare columns of an aggregate query from the row holding MAX(id): the last one
        for device, count, code, detail, _ in db.execute(
                "SELECT device_id, COUNT(*), code, detail, MAX(id) FROM rejections GROUP BY device_id"):
            out.rejected[device], out.last_error[device] = count, f"{code}: {detail}"
        for code, count in db.execute("SELECT code, COUNT(*) FROM rejections GROUP BY code"):
            out.by_reason[code] = count
    finally:
        db.close()
    fleet = Path(fleet_path or registry_path)
    if not fleet.exists():
        return out
    db = sqlite3.connect(f"{fleet.resolve().as_uri()}?mode=ro", uri=True, timeout=5)
    try:
        for device, reason, profile in db.execute(
                "SELECT device_id, tier_reason, pair_profile FROM devices "
                "WHERE tier_reason IS NOT NULL OR pair_profile IS NOT NULL"):
            reason, profile = json.loads(reason or "{}") or {}, json.loads(profile or "{}") or {}
            if reason.get("summary") or reason.get("note"):  # as pairing logs it
                out.tier_reason[device] = str(reason.get("summary") or reason.get("note"))
            if profile.get("arch"):
                out.pair_arch[device] = str(profile["arch"])
    finally:
        db.close()
    return out
