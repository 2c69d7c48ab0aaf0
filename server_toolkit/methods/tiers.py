"""A device's tier as a ratio in (0, 1]: width ratio (width methods) or shrinkage ratio (FedConv).

A device's ratio comes from, in order: the ``tier_map`` option (device id -> tier), the
device's fleet tier (``--tiers`` in simulate, ``devices add --tier``), the ``tier`` key of
its profile; none of these: 1 (the full model). A tier is a ratio written as a string
("0.5"), or a name listed in ``tier_ratios`` ({"phone": 0.75}).
"""

from __future__ import annotations

from .base import DeviceInfo


def device_tier(device: DeviceInfo, tier_map: dict[str, str] | None = None) -> str | None:
    """``device``'s tier: ``tier_map[device id]``, else its registered tier, else the one in
    its profile; None when it has none."""
    tier = (tier_map or {}).get(device.device_id, device.tier)
    if tier is None:
        tier = (device.profile or {}).get("tier")
    return None if tier is None else str(tier)


def tier_ratio(device: DeviceInfo, tier_map: dict[str, str], tier_ratios: dict[str, float]) -> float:
    """The ratio of ``device`` (see the module docstring); ValueError if its tier is unknown."""
    tier = device_tier(device, tier_map)
    if tier is None:
        return 1.0
    if tier in tier_ratios:
        ratio = tier_ratios[tier]
    else:
        try:
            ratio = float(tier)
        except ValueError:
            raise ValueError(f"tier {tier!r} of {device.device_id} is neither a ratio nor in "
                             f"tier_ratios {sorted(tier_ratios)}") from None
    if not 0 < ratio <= 1:
        raise ValueError(f"tier {tier!r} of {device.device_id}: ratio {ratio} is not in (0, 1]")
    return ratio
