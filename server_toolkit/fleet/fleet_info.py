"""``<run dir>/fleet.json``: what ``fedsdk-server run`` tells the other server commands.

``run`` writes it when it starts serving; ``pair-code`` reads it to print the exact device
command (broker URL, CA fingerprint) and to check ``--tier``; ``devices show``/``retier``
read the tier costs and the recipe to explain or redo a tier decision without the model.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .tiers import SpecCost, TierChoice, choose_tier

FILE_NAME = "fleet.json"


@dataclass
class FleetInfo:
    """The serving fleet. ``broker_url``: what devices connect to (may differ from the
    server's own address); ``tier_costs``: tier -> SpecCost dict; ``full_cost``: the model the
    devices benchmark; ``recipe``: the devices' recipe (dict); ``ca_file``: the CA that signed
    the broker's certificate (mqtts), handed to paired devices; ``security_dir``: the broker
    security directory (``--security-dir``), None when the broker enforces no accounts."""

    fleet: str
    broker_url: str
    method: str = "fedavg"
    model: str = "small_cnn"
    ca_file: str | None = None
    tiers: list[str] = field(default_factory=list)
    tier_costs: dict[str, dict] = field(default_factory=dict)
    full_cost: dict = field(default_factory=dict)
    recipe: dict = field(default_factory=dict)
    round_timeout_s: float = 300.0
    memory_share: float = 0.5
    time_share: float = 0.5
    lockout: dict = field(default_factory=dict)  # LockoutPolicy fields
    security_dir: str | None = None
    insecure: bool = False  # plain mqtt:// to a non-loopback broker allowed
    server_pid: int = 0  # the `fedsdk-server run` process serving this run directory
    server_host: str = ""

    def save(self, run_dir: Path) -> None:
        path = Path(run_dir) / FILE_NAME
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(path)

    @classmethod
    def load(cls, run_dir: Path) -> FleetInfo | None:
        """The run directory's fleet info, or None when ``run`` never served from it."""
        path = Path(run_dir) / FILE_NAME
        if not path.is_file():
            return None
        data = json.loads(path.read_text())
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})

    def costs(self) -> dict[str, SpecCost]:
        return {name: SpecCost(**c) for name, c in self.tier_costs.items()}

    def full(self) -> SpecCost:
        return SpecCost(**self.full_cost)

    def choose_tier(self, profile: dict) -> TierChoice:
        """The tier of this fleet for a device of pairing ``profile`` (``tiers.choose_tier``)."""
        return choose_tier(profile, self.costs(), self.full(), self.recipe, self.round_timeout_s,
                           self.memory_share, self.time_share)
