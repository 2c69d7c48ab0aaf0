"""A device's tier, resolved once, and what width-like methods make of it.

A device's tier is resolved once, where its ``DeviceInfo`` is made, and methods read only
``DeviceInfo.tier``:

* the grid (``rounds/mqtt_grid.py``, the simulation's devices) takes the fleet's tier
  (``--tiers`` in simulate, ``devices add --tier`` / ``retier``, the tier chosen at pairing),
  else the ``tier`` key of the device's hello profile (``resolve_tier``);
* the round loop then applies the run's ``tier_map`` overrides {device id: tier}
  (``--method-option tier_map=…``, taken off the method's options by the assembly) as it
  selects devices (``with_tier_overrides``).

A width or FedConv tier is a ratio in (0, 1] written as a string ("0.5"), or a name listed
in the method's ``tier_ratios`` option ({"phone": 0.75}); no tier: 1 (the full model).
"""

from __future__ import annotations

import dataclasses

from .base import DeviceInfo


def resolve_tier(registered: str | None, profile: dict | None) -> str | None:
    """A device's tier: its fleet (registered) tier, else its profile's ``tier``; None when neither."""
    tier = registered if registered is not None else (profile or {}).get("tier")
    return None if tier is None else str(tier)


def with_tier_overrides(devices: list[DeviceInfo], tier_map: dict[str, str]) -> list[DeviceInfo]:
    """``devices`` with the tiers ``tier_map`` names for them ({device id: tier}); the others as they are."""
    if not tier_map:
        return devices
    return [dataclasses.replace(d, tier=str(tier_map[d.device_id])) if d.device_id in tier_map else d
            for d in devices]


def tier_ratio(device: DeviceInfo, tier_ratios: dict[str, float]) -> float:
    """The ratio of ``device``'s tier (see the module docstring); ValueError if its tier is unknown."""
    tier = device.tier
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
