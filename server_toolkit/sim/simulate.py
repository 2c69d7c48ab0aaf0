"""The main job: a real federation on one machine.

Starts a broker (the embedded one unless ``broker_url`` is given), the server, and N
device agent *processes* (the same ``sdk_device`` code a Raspberry Pi runs) that talk
over MQTT; each device gets its own partition of the dataset as a local npz file.
``grid="inprocess"`` runs the same partition, method, round loop and seeds with the
devices trained in this process instead (no broker, no processes): the benchmarks' way.
Writes ``runs/<id>/config.json``, ``metrics.jsonl``, ``metrics.csv``, ``accuracy.png``,
``summary.json``.
"""

from __future__ import annotations

import json
import logging
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from sdk_device.data.npz import save_npz
from sdk_device.protocol.topics import FleetTopics
from sdk_device.transport.blob_store import BlobStore
from sdk_device.transport.endpoint import Endpoint
from sdk_device.transport.mqtt_link import BrokerAddress

from ..assembly import assemble
from ..broker.embedded import EmbeddedBroker
from ..data.datasets import Dataset
from ..data.server_slice import take_server_slice
from ..fleet.registry import FleetRegistry
from ..methods import method_class
from ..methods.abilities import wants_server_data
from ..methods.base import DeviceInfo
from ..observe.observers import RunObservers
from ..privacy.round_privacy import privacy_summary
from ..report.run_report import RunReport
from ..rounds.grid import Grid
from ..rounds.inprocess_grid import InProcessGrid
from ..rounds.local_device import LocalDevice
from ..rounds.loop import LoopConfig, RoundLoop
from ..rounds.modes import make_loop
from ..rounds.quality_guard import guard_summary
from ..secagg.aggregate import refusal as secagg_refusal
from ..server_config import DEFAULT_RECIPE, ServerConfig  # noqa: F401 - DEFAULT_RECIPE: still importable here
from ..torch_utils import one_torch_thread
from .edges import deal_edges, plan_edges, register_group, start_edge_process
from .partition import partition

log = logging.getLogger(__name__)

GRIDS = ("mqtt", "inprocess")

@dataclass
class SimulationConfig(ServerConfig):
    """Everything that defines a simulated run (saved as ``config.json``): the server's
    configuration (``server_config.py``: task, rounds, features, fleet) and the simulated devices."""

    train_samples: int | None = None  # a stratified subset of the training split (None: all of it)
    test_samples: int | None = None  # a stratified subset of the test split (None: all of it)
    devices: int = 8
    partition: str = "dirichlet"
    alpha: float = 0.5
    min_size: int = 10
    classes_per_client: int = 2
    num_strong: int = 1
    strong_share: float = 0.5
    device_runtime: str | None = None  # make every device use this runtime (default: its best)
    device_python: str | None = None  # interpreter of the device processes (e.g. .venv-ort/bin/python)
    edges: int = 0  # edge aggregator processes between the server and the devices (see sim/edges.py)
    grid: str = "mqtt"  # "mqtt": device processes over a broker; "inprocess": devices trained here
    label: str | None = None  # a name for this run in reports (benchmarks set it, e.g. "FedAvg-S")
    setting: str | None = None  # what runs compare within, in reports (benchmarks set it)
    slow_devices: float = 0.0  # simulation knob: this share of the devices are stragglers (by seed)
    slowdown: float = 10.0  # ... each sleeping (slowdown - 1) x its training time after training

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def start_device_process(broker_url: str, fleet: str, device_id: str, data_path: Path, work_dir: Path,
                         log_path: Path, runtime: str | None = None,
                         python: str | None = None, slowdown: float = 1.0) -> subprocess.Popen:
    """Start one device agent process (``fedsdk run``), logging to ``log_path``."""
    cmd = [python or sys.executable, "-m", "sdk_device.cli", "run", "--broker", broker_url,
           "--fleet", fleet, "--device-id", device_id, "--data", str(data_path),
           "--work-dir", str(work_dir)]
    if runtime:
        cmd += ["--runtime", runtime]
    if slowdown > 1.0:
        cmd += ["--slowdown", str(slowdown)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log_file:
        return subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env)


def stop_processes(procs: list[subprocess.Popen], timeout_s: float = 10.0) -> None:
    """SIGTERM every process (agents stop cleanly on it), then kill what is still alive."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()


def new_run_dir(root: Path = Path("runs")) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = root / stamp
    n = 1
    while run_dir.exists():
        n += 1
        run_dir = root / f"{stamp}-{n}"
    return run_dir


class Simulation:
    """One simulated federation; use ``run()``. ``on_event`` receives progress events;
    ``observers`` the config, the fleet and every round (dashboard, tracking)."""

    def __init__(
        self,
        config: SimulationConfig,
        run_dir: Path,
        resume: bool = False,
        on_event: Callable[[str, dict], None] | None = None,
        observers: RunObservers | None = None,
    ) -> None:
        self.config = config
        self.observers = observers or RunObservers()
        self.run_dir = Path(run_dir)
        self.resume = resume
        self.on_event = on_event or (lambda kind, data: None)
        self.loop: RoundLoop | None = None  # the run's loop, once made (summary.json: privacy spent)
        self.report: RunReport | None = None  # the rounds so far, once run() has begun them
        self.device_procs: list[subprocess.Popen] = []
        self.edge_procs: list[subprocess.Popen] = []
        if not config.fleet:
            config.fleet = "sim-" + self.run_dir.name
        tiers = {dev: self.device_tier(i) for i, dev in enumerate(self.device_ids())}
        self.generic_edges = method_class(config.method).family != "conv"  # sim/edges.py
        if self.generic_edges:
            self.edges, self.direct_devices = deal_edges(list(tiers), config.edges)
        else:
            self.edges, self.direct_devices = plan_edges(tiers, config.tiers, config.edges)

    def device_ids(self) -> list[str]:
        return [f"dev{i:03d}" for i in range(self.config.devices)]

    def device_tier(self, index: int) -> str | None:
        """Tier of the ``index``-th device: the tiers list, assigned round-robin."""
        tiers = self.config.tiers
        return tiers[index % len(tiers)] if tiers else None

    def prepare_data(self, data: Dataset,
                     server_fraction: float = 0.0) -> tuple[list[LocalDevice], tuple | None]:
        """Keep ``server_fraction`` of the training set for the server (if > 0; seeded, so a
        resumed run keeps the same slice), partition the rest, write each device's npz.
        Returns the devices (id, tier, samples and their data) and the server's (x, y) or None."""
        c = self.config
        x, y, server = data.x_train, data.y_train, None
        if server_fraction > 0:
            cut = take_server_slice(x, y, server_fraction, seed=c.seed)
            server, (x, y) = cut.server, cut.rest
        parts = partition(y, c.devices, c.partition, seed=c.seed, alpha=c.alpha, min_size=c.min_size,
                          classes_per_client=c.classes_per_client, num_strong=c.num_strong,
                          strong_share=c.strong_share)
        devices = []
        for i, (dev, idx) in enumerate(zip(self.device_ids(), parts, strict=True)):
            if c.grid == "mqtt":
                save_npz(self.run_dir / "devices" / dev / "data.npz", x[idx], y[idx])
            devices.append(LocalDevice(DeviceInfo(dev, len(idx), self.device_tier(i)), x[idx], y[idx]))
        return devices, server

    def fleet_of(self, device_id: str) -> str:
        """The fleet a device joins: its edge's group fleet, or the server's."""
        edge = next((e for e in self.edges if device_id in e.device_ids), None)
        return edge.group_fleet(self.config.fleet) if edge else self.config.fleet

    def start_edges(self, broker: BrokerAddress) -> None:
        for edge in self.edges:
            edge_dir = self.run_dir / "edges" / edge.edge_id
            generic = {"method": self.config.method, "method_options": self.config.method_options,
                       "secagg": self.config.secagg, "programs": self.config.program_formats,
                       "pte_kernels": self.config.pte_kernels} if self.generic_edges else {}
            self.edge_procs.append(start_edge_process(broker.url, self.config.fleet, edge, edge_dir,
                                                      seed=self.config.seed,
                                                      devices_wait_s=self.config.fleet_timeout_s, **generic))

    def slow_device_ids(self) -> set[str]:
        """The stragglers: ``round(slow_devices x devices)`` of them, drawn by the seed."""
        count = round(self.config.slow_devices * self.config.devices)
        return set(random.Random(self.config.seed).sample(self.device_ids(), count))

    def start_devices(self, broker: BrokerAddress) -> None:
        slow = self.slow_device_ids()
        for dev in self.device_ids():
            dev_dir = self.run_dir / "devices" / dev
            self.device_procs.append(start_device_process(
                broker.url, self.fleet_of(dev), dev, dev_dir / "data.npz", dev_dir / "work",
                dev_dir / "agent.log", runtime=self.config.device_runtime,
                python=self.config.device_python, slowdown=self.config.slowdown if dev in slow else 1.0))

    def wait_for_fleet(self, grid: Grid, expected: int, timeout_s: float) -> int:
        """Wait until ``expected`` devices and edges said hello; fail early if an edge died."""
        deadline = time.monotonic() + timeout_s
        online = 0
        while time.monotonic() < deadline:
            online = grid.wait_for_devices(expected, timeout_s=2.0)
            if online >= expected:
                break
            for edge, proc in zip(self.edges, self.edge_procs, strict=True):
                if proc.poll() is not None:
                    log_path = self.run_dir / "edges" / edge.edge_id / "edge.log"
                    raise RuntimeError(f"edge aggregator {edge.edge_id} exited; see {log_path}")
        return online

    def stop_devices(self) -> None:
        stop_processes(self.device_procs)
        stop_processes(self.edge_procs)
        self.device_procs, self.edge_procs = [], []

    def loop_config(self, tier_map: dict[str, str]) -> LoopConfig:
        """The shared ``LoopConfig``; ``min_devices`` 1 until the whole fleet is online (below)."""
        return replace(self.config.loop_config(tier_map), min_devices=1)

    def run(self) -> RunReport:
        c = self.config
        if c.grid not in GRIDS:
            raise ValueError(f"unknown grid {c.grid!r}; choose one of {', '.join(GRIDS)}")
        if c.grid == "inprocess" and (c.edges or c.mode == "async"):
            raise ValueError("edge aggregators and --mode async need device processes: --grid mqtt")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.json").write_text(c.to_json())
        setup = assemble(c.method, c.model, c.dataset, c.data_dir, c.device_recipe(),
                         c.method_options, c.seed, c.train_samples, c.test_samples)
        data, method = setup.data, setup.method
        if c.edges and not method.bundles:
            raise ValueError(f"--edges does not support {method.name}: {method.not_a_sum}")
        if c.secagg is not None and (why := secagg_refusal(method)):  # the instance: its options count
            raise ValueError(why)
        share = method.server_fraction if wants_server_data(method) else 0.0
        devices, server_data = self.prepare_data(data, share)
        if server_data is not None:
            method.attach_server_data(*server_data)
        report = self.report = RunReport.load(self.run_dir) if self.resume else RunReport(self.run_dir)
        self.observers.begin(asdict(c), report.rows)
        try:
            self._run_rounds(setup, method, devices, report)
        finally:  # also when stopped (Ctrl-C) or failed: the rounds that finished are kept
            if report.rows:
                report.write_plot()
            report.write_summary({"method": c.method, "dataset": c.dataset, "devices": c.devices,
                                  "edges": c.edges, "grid": c.grid, "mode": c.mode,
                                  **(privacy_summary(self.loop) if self.loop else {}),
                                  **(guard_summary(self.loop) if self.loop else {})})
        return report

    def _run_rounds(self, setup, method, devices: list[LocalDevice], report: RunReport) -> None:
        c, data = self.config, setup.data

        def on_round(row: dict) -> None:
            report.add_round(row)
            self.observers.add_round(row)
            self.on_event("round", row)

        test_data = (data.x_test, data.y_test)
        if c.grid == "inprocess":
            grid = InProcessGrid(devices)
            self.observers.watch_inprocess(grid)
            loop = self.loop = RoundLoop(method, grid, self.loop_config(setup.tier_map),
                             run_dir=self.run_dir, test_data=test_data, on_round=on_round,
                             aggregator=c.aggregation(method))
            loop.start(resume=self.resume)
            self.on_event("devices", {"online": len(devices), "expected": len(devices)})
            loop.run()
        else:  # the device processes take the cores: the server's torch work (evaluation) in one
            with one_torch_thread():  # thread (two were 6x slower under load: docs/async.md)
                self.loop = self._run_over_mqtt(method, self.loop_config(setup.tier_map), test_data, on_round)

    def _run_over_mqtt(self, method, loop_config: LoopConfig, test_data: tuple, on_round) -> RoundLoop:
        """Broker, device (and edge) processes, the server's MQTT grid and the round loop."""
        c = self.config
        registry = FleetRegistry(self.run_dir / "registry.sqlite")
        for i, dev in enumerate(self.device_ids()):
            if dev in self.direct_devices:
                registry.add_device(dev, tier=self.device_tier(i))
        for edge in self.edges:  # an edge is a device of the server's fleet
            registry.add_device(edge.edge_id, tier=edge.tier)
            register_group(self.run_dir / "edges" / edge.edge_id, edge,
                           {dev: self.device_tier(i) for i, dev in enumerate(self.device_ids())})
        broker = None
        if c.broker_url:
            address = BrokerAddress.parse(c.broker_url)
        else:
            broker = EmbeddedBroker().start()
            address = broker.address
        self.on_event("broker", {"url": address.url, "embedded": broker is not None})
        endpoint = Endpoint(address, FleetTopics(c.fleet), BlobStore(self.run_dir / "blobs"),
                            is_known_peer=registry.is_known)
        settings = c.async_settings()
        grid = c.mqtt_grid(endpoint, registry, method, settings)
        self.observers.watch_registry(registry, self.run_dir / "registry.sqlite", grid, "--tiers")
        try:
            endpoint.start()
            self.start_edges(address)
            self.start_devices(address)
            loop = self.loop = make_loop(method, grid, loop_config, settings, run_dir=self.run_dir,
                                         test_data=test_data, on_round=on_round,
                                         aggregator=c.aggregation(method, settings))
            loop.start(resume=self.resume)
            expected = len(self.direct_devices) + len(self.edges)
            # the start waits for the whole fleet; a round then goes on with whoever is online
            # (a killed device or edge must not hold the run) as long as min_devices are
            loop.config.min_devices = min(max(1, c.min_devices), expected)
            online = self.wait_for_fleet(grid, expected, timeout_s=c.fleet_timeout_s)  # edges wait as long
            self.on_event("devices", {"online": online, "expected": expected})
            if online == 0:
                raise RuntimeError(f"no device came online; see {self.run_dir}/devices/*/agent.log "
                                   f"(and edges/*/edge.log)")
            loop.run()
            return loop
        finally:
            grid.close()
            self.stop_devices()
            endpoint.close()
            registry.close()
            if broker:
                broker.stop()
