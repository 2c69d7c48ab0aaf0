"""A small fleet for integration tests: server endpoint, MQTT grid and round loop in this
process, device agents as real processes (or threads, for misbehaving test devices)."""

from __future__ import annotations

import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

from fedcore.recipe import Recipe
from sdk_device.agent import AgentConfig, DeviceAgent
from sdk_device.data.npz import save_npz
from sdk_device.protocol.blobs import decode_tensors
from sdk_device.protocol.topics import FleetTopics
from sdk_device.transport.blob_store import BlobStore
from sdk_device.transport.endpoint import Endpoint
from sdk_device.transport.mqtt_link import BrokerAddress
from server_toolkit.data.datasets import load_dataset
from server_toolkit.edge.layer import edge_stack
from server_toolkit.fleet.registry import FleetRegistry
from server_toolkit.methods.base import ClientUpdate, Method
from server_toolkit.methods.fedavg import FedAvg
from server_toolkit.models.zoo import model_spec
from server_toolkit.rounds.loop import LoopConfig, RoundLoop
from server_toolkit.rounds.mqtt_grid import MqttGrid
from server_toolkit.rounds.task_records import instruction_from_record
from server_toolkit.sim.partition import partition
from server_toolkit.sim.simulate import start_device_process, stop_processes

RECIPE = Recipe(epochs=5, batch_size=16, lr=0.05)


@dataclass
class Fleet:
    broker: BrokerAddress
    root: Path
    fleet: str = "test"
    registry: FleetRegistry = field(init=False)
    endpoint: Endpoint = field(init=False)
    procs: list[subprocess.Popen] = field(default_factory=list)
    threads: list[tuple[DeviceAgent, threading.Thread]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.data = load_dataset("digits", seed=0)
        self.registry = FleetRegistry(self.root / "server" / "registry.sqlite")
        self.endpoint = Endpoint(
            self.broker,
            FleetTopics(self.fleet),
            BlobStore(self.root / "server" / "blobs"),
            is_known_peer=self.registry.is_known,
        ).start()

    def write_data(self, device_ids: list[str], scheme: str = "iid") -> dict[str, Path]:
        parts = partition(self.data.y_train, len(device_ids), scheme, seed=0)
        paths = {}
        for dev, idx in zip(device_ids, parts, strict=True):
            paths[dev] = self.root / dev / "data.npz"
            save_npz(paths[dev], self.data.x_train[idx], self.data.y_train[idx])
        return paths

    def agent_config(self, dev: str, data_path: Path) -> AgentConfig:
        return AgentConfig(
            broker_url=self.broker.url,
            fleet=self.fleet,
            device_id=dev,
            data_path=data_path,
            work_dir=self.root / dev / "work",
            heartbeat_s=1.0,
        )

    def start_process(self, dev: str, data_path: Path, register: bool = True) -> None:
        if register:
            self.registry.add_device(dev)
        self.procs.append(start_device_process(
            self.broker.url, self.fleet, dev, data_path, self.root / dev / "work", self.root / f"{dev}.log"))

    def start_thread(self, agent: DeviceAgent, register: bool = True) -> DeviceAgent:
        if register:
            self.registry.add_device(agent.config.device_id)
        thread = threading.Thread(target=agent.run, daemon=True)
        thread.start()
        self.threads.append((agent, thread))
        return agent

    def server(self, rounds: int, run_dir: Path | None = None, method: Method | None = None,
               program_formats: list[str] | None = None, **config) -> RoundLoop:
        """The round loop of ``method`` (default: FedAvg of small_cnn) over this fleet's MQTT grid
        (``loop.grid``)."""
        spec = model_spec("small_cnn", self.data.input_shape, self.data.num_classes)
        grid = MqttGrid(self.endpoint, self.registry, program_formats=program_formats)
        method = method or FedAvg(spec, RECIPE)
        config = LoopConfig(rounds=rounds, **config)
        return RoundLoop(method, grid, config, run_dir=run_dir or self.root / "server",
                         test_data=(self.data.x_test, self.data.y_test),
                         aggregator=edge_stack(method, config.norm_bound))  # edges say hello themselves

    def run_method(self, method: Method, rounds: int, devices: int, **config) -> list[dict]:
        """Run ``rounds`` rounds of ``method`` once ``devices`` devices are online; the rows."""
        loop = self.server(rounds, method=method, **config)
        loop.start()
        assert loop.grid.wait_for_devices(devices, timeout_s=120) == devices
        try:
            return loop.run()
        finally:
            loop.grid.close()

    def close(self) -> None:
        for agent, _ in self.threads:
            agent.stop()
        stop_processes(self.procs)
        for _, thread in self.threads:
            thread.join(timeout=10)
        self.endpoint.close()  # the registry stays open for the test's assertions


def device_updates(edge_dir, rnd: int) -> list[ClientUpdate]:
    """The updates a run directory (a server's or an edge's) accepted in round ``rnd``, with the
    instructions they answered (registry rows, blobs and persisted task records)."""
    registry, store = FleetRegistry(edge_dir / "registry.sqlite"), BlobStore(edge_dir / "blobs")
    try:
        return [ClientUpdate(row["device_id"], row["num_samples"], decode_tensors(store.get(row["blob_id"])),
                             row["metrics"], instruction_from_record(registry.task(row["task_id"]), store))
                for row in registry.updates(rnd)]
    finally:
        registry.close()
