"""The run's configuration as one typed object, shared by ``fedsdk-server run`` and ``simulate``.

Grouped by concern, each group a dataclass: ``TaskSettings`` (what is trained: method, model,
dataset, device recipe), ``RoundSettings`` (rounds and device selection), ``FeatureSettings``
(the aggregation features: norm bound, secure aggregation, privacy, async mode),
``FleetSettings`` (broker, fleet, tiers, program formats). ``ServerConfig`` is all four and
builds what both commands hand the round loop (``loop_config``, ``async_settings``,
``aggregation``, ``mqtt_grid``). ``RunConfig`` adds what only a real fleet has (the run
directory, broker security, pairing); ``sim/simulate.py:SimulationConfig`` adds the simulated
devices. ``ObserveSettings`` (dashboard, tracking) watch a run and are not part of it.

Decision: the groups are combined by inheritance, so a configuration stays flat (``config.rounds``,
``SimulationConfig(rounds=3)``) and ``config.json`` keeps its flat keys; the CLI builds it once
from flags and config files (``cli/config_build.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from fedcore.recipe import DEFAULT_LR, DEFAULT_MAX_STEPS, Recipe

# Chosen on digits with small_cnn, IID, 5 devices, 3 rounds: final accuracy 0.947-0.964
# over seeds 0-3 (adam lr 3e-3 gave 0.894-0.922; sgd lr 0.1 x 3 epochs 0.763-0.900).
# lr and max_steps: fedcore.recipe.DEFAULT_LR (0.02, chosen over the issue-26 convergence grid)
# and DEFAULT_MAX_STEPS (a device with much data stops part-way).
DEFAULT_RECIPE = Recipe(epochs=5, batch_size=16, optimizer="sgd", lr=DEFAULT_LR, momentum=0.9,
                        max_steps=DEFAULT_MAX_STEPS)


@dataclass
class TaskSettings:
    """What is trained: the method (and its options), the global model, the dataset (its test
    split evaluates the global model) and the devices' recipe (``Recipe.to_dict()``)."""

    method: str = "fedavg"
    dataset: str = "digits"
    data_dir: str | None = None
    model: str = "small_cnn"
    method_options: dict = field(default_factory=dict)  # extra keyword arguments of the method
    recipe: dict = field(default_factory=lambda: DEFAULT_RECIPE.to_dict())

    def device_recipe(self) -> Recipe:
        return Recipe.from_dict(self.recipe)


@dataclass
class RoundSettings:
    """Rounds and device selection: quorum (``clients_per_round`` or ``fraction`` of the online
    devices, plus ``over_select``), time limits in seconds, the seed of sampling and models."""

    rounds: int = 20
    clients_per_round: int | None = None
    fraction: float | None = None
    over_select: float = 0.0
    seed: int = 0
    round_timeout_s: float = 120.0
    min_devices: int = 1  # devices online before a round starts
    fleet_timeout_s: float = 180.0  # how long a round waits for min_devices before the run fails
    on_divergence: str = "rollback"  # --on-divergence: rollback, stop or continue (rounds/quality_guard.py)
    holdout: float = 0.0  # --holdout: share of each device's samples held back (sdk_device/holdout.py)


@dataclass
class FeatureSettings:
    """The aggregation features a run asks for (the layers of ``assembly.aggregation_stack``)."""

    norm_bound: float | None = 10.0  # clip update changes to this x the round's median (None: off)
    secagg: dict | None = None  # secure aggregation settings (cli/secagg_options.py); None: off
    privacy: dict | None = None  # PrivacySettings as a dict (--dp-*, --label-noise-epsilon, --robust)
    mode: str = "sync"  # "async": buffered asynchronous aggregation (rounds/async_loop.py)
    buffer: int | None = None  # async: K, updates per version
    max_staleness: int | None = None  # async: S, versions an update may lag
    concurrency: int | None = None  # async: devices training at once (None: all)
    server_lr: float | None = None  # async: step on the folded delta (None: 1.0)
    eval_every: int | None = None  # async: evaluate every N-th version and the last (None: 1)


@dataclass
class FleetSettings:
    """Where the fleet meets: the broker (None: the embedded one), the fleet's name, its tiers
    and the program formats offered with each task."""

    broker_url: str | None = None
    fleet: str = ""
    tiers: list[str] | None = None  # tier names (simulate: given to devices round-robin)
    program_formats: list[str] = field(default_factory=lambda: ["torchspec/1"])  # offered per task
    pte_kernels: str = "fused"  # kernel set of pte/1 programs (refusing devices get portable ones)


@dataclass
class ServerConfig(FleetSettings, FeatureSettings, RoundSettings, TaskSettings):
    """Everything ``run`` and ``simulate`` share, and what the server builds from it."""

    def async_settings(self):
        """``AsyncConfig`` for ``mode`` "async", None for "sync"."""
        from .rounds.modes import async_config

        return async_config(self.mode, self.buffer, self.max_staleness, self.concurrency, self.server_lr,
                            self.eval_every)

    def privacy_settings(self):
        from .privacy.settings import PrivacySettings

        return PrivacySettings.from_dict(self.privacy)

    def loop_config(self, tier_map: dict[str, str]):
        """The round loop's ``LoopConfig`` ({device id: tier} overrides from the assembly)."""
        from .rounds.loop import LoopConfig

        return LoopConfig(rounds=self.rounds, clients_per_round=self.clients_per_round,
                          fraction=self.fraction, over_select=self.over_select,
                          round_timeout_s=self.round_timeout_s, seed=self.seed, tier_map=tier_map,
                          min_devices=self.min_devices, fleet_timeout_s=self.fleet_timeout_s,
                          norm_bound=None if self.secagg else self.norm_bound,  # secagg: none in the clear
                          on_divergence=self.on_divergence, holdout=self.holdout)

    def aggregation(self, method, async_settings=None):
        """The run's aggregation stack over ``method`` (``assembly.py:aggregation_stack``)."""
        from .assembly import aggregation_stack

        return aggregation_stack(method, self.norm_bound, self.privacy_settings(), bool(self.secagg),
                                 async_settings)

    def mqtt_grid(self, endpoint, registry, method, async_settings=None):
        """The server's MQTT grid of the mode (secure aggregation's when ``secagg``)."""
        from .secagg.mqtt_grid import secagg_grid

        return secagg_grid(endpoint, registry, method, self.secagg, self.seed, async_settings,
                           program_formats=self.program_formats, pte_kernels=self.pte_kernels,
                           fetch_timeout_s=self.round_timeout_s)


@dataclass
class BrokerSettings:
    """``run``'s broker: ``host``/``port`` of the embedded one, or the security directory
    (``security init``) that logs the server in; TLS trust and plain-TCP consent."""

    host: str = "127.0.0.1"
    port: int = 1883
    insecure_embedded_broker: bool = False
    security_dir: Path | None = None
    ca_file: str | None = None
    insecure: bool = False


@dataclass
class PairingSettings:
    """``run``'s pairing: the broker URL devices are told, and the wrong-code lockout (seconds)."""

    device_url: str | None = None
    pair_max_failures: int = 5
    pair_lockout: float = 300.0


@dataclass
class RunConfig(PairingSettings, BrokerSettings, ServerConfig):
    """A real fleet's run: ``run_dir`` holds its rounds (``resume``: continue from its last
    checkpoint); ``server_data``: an npz the server keeps for methods that tune on data."""

    run_dir: Path = Path("run")
    resume: bool = False
    server_data: Path | None = None

    def summary(self) -> dict:
        """What ``config.json`` in the run directory records."""
        return {"method": self.method, "model": self.model, "dataset": self.dataset, "fleet": self.fleet,
                "rounds": self.rounds, "clients_per_round": self.clients_per_round, "fraction": self.fraction,
                "round_timeout_s": self.round_timeout_s, "seed": self.seed, "recipe": self.recipe,
                "method_options": self.method_options, "mode": self.mode, "buffer": self.buffer,
                "max_staleness": self.max_staleness, "concurrency": self.concurrency,
                "server_lr": self.server_lr, "eval_every": self.eval_every,
                "on_divergence": self.on_divergence, "holdout": self.holdout}


@dataclass
class ObserveSettings:
    """Who watches a run: ``dashboard`` HOST:PORT (and its token, kept ``dashboard_hold`` s after
    the end), trackers ``log_to`` (``tensorboard:DIR``, ``mlflow:URI``)."""

    dashboard: str | None = None
    dashboard_token: str | None = None
    dashboard_hold: float = 0.0
    log_to: tuple[str, ...] = ()
