"""A fedsdk fleet on a three-node RabbitMQ cluster, end to end (issue 31).

``RabbitCluster`` (server_toolkit/broker/rabbitmq.py) starts three nodes on loopback. The server
(endpoint, MQTT grid, round loop) connects to node 1 (then 2, 3: failover); ``--devices`` real
device processes (``fedsdk run``) are spread round-robin over the nodes, each with a broker URL
listing every node starting with its own (``mqtt://127.0.0.1:A,127.0.0.1:B,127.0.0.1:C``: failover). Then:

1. the devices join (seconds until all are online) and say hello once each;
2. ``--rounds`` FedAvg rounds on digits; in round 2, once the first update is accepted, node 3 is
   SIGKILLed: its devices reconnect to another node (the next in their list) and their tasks are
   sent again (docs/protocol.md §10.1), so the round still ends with every device;
3. a server restart: a new endpoint and grid (a new epoch); the seconds until every device said
   hello again (those that moved nodes included: live epoch, or their status request, §3.2);
4. acknowledged updates lost: the task ids the devices' logs say were acknowledged, minus the
   updates the registry holds (must be 0).

Prints one line per figure and a markdown table. Needs ``rabbitmq-server`` (``make rabbitmq``).
Run from the repository root::

    PYTHONPATH=$PWD .venv/bin/python bench/rabbitmq_cluster.py [--devices 6] [--rounds 3]
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fedcore.recipe import Recipe  # noqa: E402
from sdk_device.data.npz import save_npz  # noqa: E402
from sdk_device.protocol.topics import FleetTopics  # noqa: E402
from sdk_device.transport.blob_store import BlobStore  # noqa: E402
from sdk_device.transport.broker_address import BrokerAddress  # noqa: E402
from sdk_device.transport.endpoint import Endpoint  # noqa: E402
from server_toolkit.broker.rabbitmq import RabbitCluster, rabbitmq_missing  # noqa: E402
from server_toolkit.data.datasets import load_dataset  # noqa: E402
from server_toolkit.fleet.registry import FleetRegistry  # noqa: E402
from server_toolkit.methods.fedavg import FedAvg  # noqa: E402
from server_toolkit.models.zoo import model_spec  # noqa: E402
from server_toolkit.rounds.loop import LoopConfig, RoundLoop  # noqa: E402
from server_toolkit.rounds.mqtt_grid import MqttGrid  # noqa: E402
from server_toolkit.sim.partition import partition  # noqa: E402
from server_toolkit.sim.simulate import start_device_process, stop_processes  # noqa: E402

ACKED = re.compile(r"server accepted the result of task ([0-9a-f]{8})")
FLEET = "bench"


class HelloCounter(MqttGrid):
    """The grid, counting hellos per device."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.hellos: dict[str, int] = {}

    def _on_hello(self, dev, hello):
        self.hellos[dev] = self.hellos.get(dev, 0) + 1
        super()._on_hello(dev, hello)


def device_url(cluster: RabbitCluster, first: int) -> str:
    ports = [n.mqtt_port for n in cluster.nodes]
    order = ports[first:] + ports[:first]
    return "mqtt://" + ",".join(f"127.0.0.1:{p}" for p in order)


def pump_until(grid: MqttGrid, condition, timeout_s: float) -> float:
    began = time.monotonic()
    while not condition() and time.monotonic() - began < timeout_s:
        grid.poll(0.05)
    return time.monotonic() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=6, help="device processes, spread over the 3 nodes")
    parser.add_argument("--rounds", type=int, default=3, help="FedAvg rounds (node 3 dies in round 2)")
    args = parser.parse_args()
    missing = rabbitmq_missing()
    if missing:
        print(f"cannot run: {missing}")
        return 2
    work = Path(tempfile.mkdtemp(prefix="fedsdk-rabbit-"))
    figures: list[tuple[str, str]] = []
    began = time.monotonic()
    cluster = RabbitCluster(work / "rabbit", size=3).start()
    boots = " + ".join(f"{s:.1f}" for s in cluster.boot_seconds)
    figures.append(("cluster up (node 1 alone, then nodes 2-3 in parallel)",
                    f"{sum(cluster.boot_seconds):.1f} s ({boots})"))
    procs, devices = [], [f"d{i}" for i in range(args.devices)]
    try:
        data = load_dataset("digits", seed=0)
        registry = FleetRegistry(work / "server" / "registry.sqlite")
        server_broker = BrokerAddress.parse(device_url(cluster, 0))  # node 1 first, then the others
        endpoint = Endpoint(server_broker, FleetTopics(FLEET),
                            BlobStore(work / "server" / "blobs"), is_known_peer=registry.is_known).start()
        grid = HelloCounter(endpoint, registry)
        node_of = {dev: i % 3 for i, dev in enumerate(devices)}
        for dev, idx in zip(devices, partition(data.y_train, len(devices), "iid", seed=0), strict=True):
            registry.add_device(dev)
            save_npz(work / dev / "data.npz", data.x_train[idx], data.y_train[idx])
            home = work / dev
            url = device_url(cluster, node_of[dev])
            log = work / f"{dev}.log"
            procs.append(start_device_process(url, FLEET, dev, home / "data.npz", home / "work", log))
        t0 = time.monotonic()
        online = grid.wait_for_devices(len(devices), timeout_s=300)
        figures.append(("devices online", f"{online}/{len(devices)} in {time.monotonic() - t0:.1f} s"))
        pump_until(grid, lambda: False, 2.0)
        figures.append(("hellos per device at join", str(sorted(set(grid.hellos.values())))))

        spec = model_spec("small_cnn", data.input_shape, data.num_classes)
        loop = RoundLoop(FedAvg(spec, Recipe(epochs=1, batch_size=16, lr=0.05)), grid,
                         LoopConfig(rounds=args.rounds, round_timeout_s=120.0, min_devices=len(devices)),
                         run_dir=work / "server", test_data=(data.x_test, data.y_test))
        killed = threading.Event()

        def kill_node_3_in_round_2() -> None:
            while not killed.is_set():
                if loop.grid._open_round == 2 and loop.grid._accepted:
                    cluster.kill(2)
                    killed.set()
                    print(f"node 3 killed in round 2 (devices {[d for d in devices if node_of[d] == 2]})",
                          flush=True)
                time.sleep(0.05)

        threading.Thread(target=kill_node_3_in_round_2, daemon=True).start()
        loop.start()
        rows = loop.run()
        killed.set()
        for row in rows:
            figures.append((f"round {row['round']}", f"{row['accepted']}/{len(devices)} accepted in "
                                                     f"{row['seconds']:.1f} s"))
        grid.close()
        endpoint.close()

        endpoint = Endpoint(server_broker, FleetTopics(FLEET), BlobStore(work / "server2"),
                            is_known_peer=registry.is_known).start()
        second = HelloCounter(endpoint, registry)
        took = pump_until(second, lambda: len(second.hellos) == len(devices), 120)
        figures.append(("server restart: devices that said hello again",
                        f"{len(second.hellos)}/{len(devices)} in {took:.1f} s"))
        second.close()
        endpoint.close()
        stored = {u["task_id"][:8] for r in range(1, args.rounds + 1) for u in registry.updates(r)}
        acked = {m for dev in devices for m in ACKED.findall((work / f"{dev}.log").read_text())}
        figures.append(("acknowledged updates lost", f"{len(acked - stored)} of {len(acked)}"))
    finally:
        stop_processes(procs)
        cluster.stop()
    figures.append(("wall time", f"{time.monotonic() - began:.0f} s"))
    print("\n| figure | value |\n|---|---|")
    for name, value in figures:
        print(f"| {name} | {value} |")
    print(f"(work directory {work})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
