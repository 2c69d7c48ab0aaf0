"""HeteroFL (Diao et al., 2021): every tier trains the top-left block of each layer.

A device of ratio r gets the first ``ceil(r * C)`` channels of every hidden channel space
(window offset 0, the same every round); results are averaged per element over the
devices covering it. Static BatchNorm; tiers as in ``width_shared``.
"""

from __future__ import annotations

from ..submodels.offsets import heterofl_offsets
from .base import DeviceInfo
from .width_shared import WidthSharedMethod


class HeteroFL(WidthSharedMethod):
    name = "heterofl"
    family = "width"
    example = "--tiers 1.0,0.75,0.5,0.25"

    def offsets(self, round_number: int, device: DeviceInfo, ratio: float) -> dict[int, int]:
        return heterofl_offsets(self.layout, ratio, round_number)
