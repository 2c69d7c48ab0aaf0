"""FedRolex (Alam et al., 2022): the sub-model window rolls over the channels.

In round t every device's window starts at channel ``(t - 1) mod C`` of each hidden
channel space and wraps around, so over C rounds every channel is trained by every tier
equally often. All devices of a round share the start (as in the paper); per-element
averaging over the devices covering each element, static BatchNorm, tiers as in
``width_shared``.
"""

from __future__ import annotations

from ...submodels.offsets import rolling_offsets
from ..base import DeviceInfo
from .width_shared import WidthSharedMethod


class FedRolex(WidthSharedMethod):
    name = "fedrolex"
    family = "width"
    example = "--tiers 1.0,0.75,0.5,0.25"

    def offsets(self, round_number: int, device: DeviceInfo, ratio: float) -> dict[int, int]:
        return rolling_offsets(self.layout, ratio, round_number)
