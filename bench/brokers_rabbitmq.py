"""Does fedsdk run on a broker that clusters? A two-node RabbitMQ cluster (Debian's
``rabbitmq-server`` with its MQTT plugin) on loopback, checked against what fedsdk relies on.

Starts ``rabbit1@localhost`` (MQTT 1884) and ``rabbit2@localhost`` (MQTT 1885) in a temporary
directory (own cookie, data, logs; epmd and every listener on 127.0.0.1), joins them into one
cluster, then measures with plain paho clients (MQTT 3.1.1, as fedsdk connects):

1. **cross-node QoS 1**: a subscriber on node 1, ``--messages`` publishes on node 2: delivered
   count and median latency (ms);
2. **retained**: a retained message published on node 1, read by a new subscriber on node 1
   and on node 2 (fedsdk's server status and epoch, and the devices' statuses, are retained);
3. **persistent session**: a ``clean_session=false`` subscriber on node 1 goes away; messages
   published meanwhile; it comes back on node 1 and (another run) on node 2: delivered counts;
4. **QoS 1 redelivery**: a subscriber with manual acks receives messages, acks none and
   drops; on reconnect (same node): how many come again, with the DUP flag;
5. **a fedsdk round across nodes**: the server (endpoint, MQTT grid, round loop) on node 1,
   two real device agents on node 2, FedAvg on digits: rounds completed, accepted updates.

Prints one line per check and a markdown table. Needs root (or a writable HOME) and
``apt-get install rabbitmq-server``. Run from the repository root::

    .venv/bin/python bench/brokers_rabbitmq.py [--messages 1000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import paho.mqtt.client as mqtt

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RABBIT = Path("/usr/lib/rabbitmq/bin")
NODES = {1: 1884, 2: 1885}  # node index -> MQTT port


class Cluster:
    """Two RabbitMQ nodes on loopback, joined; ``stop()`` ends the processes it started."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: dict[int, subprocess.Popen] = {}

    def env(self, i: int) -> dict:
        base = self.workdir / f"n{i}"
        return {**os.environ, "HOME": str(self.workdir), "RABBITMQ_NODENAME": f"rabbit{i}@localhost",
                "RABBITMQ_NODE_PORT": str(5671 + i), "RABBITMQ_DIST_PORT": str(25671 + i),
                "RABBITMQ_MNESIA_BASE": str(base / "mnesia"), "RABBITMQ_LOG_BASE": str(base / "log"),
                "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
                "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq"), "RABBITMQ_PID_FILE": str(base / "pid"),
                "ERL_EPMD_ADDRESS": "127.0.0.1",
                "SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}"}

    def start_node(self, i: int) -> None:
        base = self.workdir / f"n{i}"
        base.mkdir(parents=True, exist_ok=True)
        (base / "enabled_plugins").write_text("[rabbitmq_mqtt].\n")
        (base / "rabbitmq.conf").write_text(
            f"listeners.tcp.1 = 127.0.0.1:{5671 + i}\nmqtt.listeners.tcp.1 = 127.0.0.1:{NODES[i]}\n"
            "mqtt.allow_anonymous = true\nloopback_users = none\n")
        with open(base / "server.out", "ab") as out:
            self.procs[i] = subprocess.Popen([str(RABBIT / "rabbitmq-server")], env=self.env(i), stdout=out,
                                             stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 180
        while True:  # await_startup fails until the node has registered with epmd
            try:
                self.ctl(i, "await_startup", timeout_s=120)
                return
            except RuntimeError:
                if time.monotonic() > deadline or self.procs[i].poll() is not None:
                    raise
                time.sleep(2)

    def ctl(self, i: int, *args: str, timeout_s: float = 60) -> str:
        cmd = [str(RABBIT / "rabbitmqctl"), "-n", f"rabbit{i}@localhost", *args]
        done = subprocess.run(cmd, env=self.env(i), capture_output=True, text=True, timeout=timeout_s)
        if done.returncode != 0:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)}: {done.stderr.strip()[-300:]}")
        return done.stdout

    def start(self) -> Cluster:
        self.start_node(1)
        self.start_node(2)
        self.ctl(2, "stop_app")
        self.ctl(2, "join_cluster", "rabbit1@localhost")
        self.ctl(2, "start_app")
        return self

    def stop(self) -> None:
        for i in sorted(self.procs, reverse=True):
            try:
                self.ctl(i, "stop", timeout_s=60)
            except (RuntimeError, subprocess.TimeoutExpired):
                self.procs[i].kill()
            self.procs[i].wait(30)
        # the nodes started epmd (a daemon of its own): stop it too
        subprocess.run(["epmd", "-kill"], env=self.env(1), capture_output=True, timeout=30, check=False)


def client(port: int, client_id: str, clean: bool = True, manual_ack: bool = False) -> mqtt.Client:
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=clean,
                    protocol=mqtt.MQTTv311, manual_ack=manual_ack)
    connected = threading.Event()
    c.on_connect = lambda *a: connected.set()
    c.connect("127.0.0.1", port, keepalive=30)
    c.loop_start()
    if not connected.wait(10):
        raise RuntimeError(f"no CONNACK from port {port}")
    return c


def collect(c: mqtt.Client, topic: str, ack: bool = True) -> list:
    got: list = []
    subscribed = threading.Event()

    def on_message(_c, _u, msg):
        got.append((time.time(), msg.payload, msg.dup, msg.retain, msg.mid))

    c.on_message = on_message
    c.on_subscribe = lambda *a: subscribed.set()
    c.subscribe(topic, qos=1)
    subscribed.wait(10)
    return got


def close(c: mqtt.Client) -> None:
    c.disconnect()
    c.loop_stop()


def drop(c: mqtt.Client) -> None:
    """Go away without DISCONNECT (as a device losing its network)."""
    c.loop_stop()
    c.socket().close()


def wait_count(got: list, n: int, timeout_s: float) -> None:
    end = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < end:
        time.sleep(0.05)


def cross_node(messages: int) -> dict:
    sub = client(NODES[1], "eval-sub")
    got = collect(sub, "eval/x/#")
    pub = client(NODES[2], "eval-pub")
    sent = {}
    for k in range(messages):
        sent[str(k).encode()] = time.time()
        pub.publish(f"eval/x/{k % 10}", str(k).encode(), qos=1).wait_for_publish(10)
    wait_count(got, messages, 30)
    latency = [1000 * (t - sent[p]) for t, p, *_ in got if p in sent]
    close(sub), close(pub)
    median = round(statistics.median(latency), 2) if latency else None
    return {"delivered": f"{len(got)}/{messages}", "median ms": median}


def retained() -> dict:
    """A retained message published on node 1, then a new subscriber per node and per filter
    (the exact topic; a ``+`` wildcard, as fedsdk's server subscribes to ``dev/+/status``)."""
    pub = client(NODES[1], "eval-ret-pub")
    pub.publish("eval/status/server", b"online", qos=1, retain=True).wait_for_publish(10)
    close(pub)
    out = {}
    for i in (1, 2):
        for kind, topic in (("exact", "eval/status/server"), ("wildcard", "eval/status/+")):
            sub = client(NODES[i], f"eval-ret-sub{i}-{kind}")
            got = collect(sub, topic)
            wait_count(got, 1, 3)
            out[f"node {i} {kind}"] = "yes" if got else "no"
            close(sub)
    return out


def persistent(messages: int, back_on: int) -> dict:
    cid = f"eval-persist-{back_on}"
    first = client(NODES[1], cid, clean=False)
    collect(first, f"eval/p{back_on}/#")
    drop(first)
    time.sleep(1.0)
    pub = client(NODES[2], f"eval-ppub-{back_on}")
    for k in range(messages):
        pub.publish(f"eval/p{back_on}/m", str(k).encode(), qos=1).wait_for_publish(10)
    close(pub)
    again = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=cid, clean_session=False,
                        protocol=mqtt.MQTTv311)
    got: list = []
    again.on_message = lambda _c, _u, m: got.append(m.payload)
    again.connect("127.0.0.1", NODES[back_on], keepalive=30)
    again.loop_start()
    wait_count(got, messages, 10)
    close(again)
    return {"delivered": f"{len(got)}/{messages}"}


def redelivery(messages: int) -> dict:
    cid = "eval-redeliver"
    first = client(NODES[1], cid, clean=False, manual_ack=True)
    got = collect(first, "eval/r/#", ack=False)
    pub = client(NODES[2], "eval-rpub")
    for k in range(messages):
        pub.publish("eval/r/m", str(k).encode(), qos=1).wait_for_publish(10)
    wait_count(got, messages, 10)
    received = len(got)
    drop(first)  # acked none
    time.sleep(1.0)
    again = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=cid, clean_session=False,
                        protocol=mqtt.MQTTv311)
    back: list = []
    again.on_message = lambda _c, _u, m: back.append(m.dup)
    again.connect("127.0.0.1", NODES[1], keepalive=30)
    again.loop_start()
    wait_count(back, messages, 20)
    close(again), close(pub)
    return {"received unacked": received, "redelivered": len(back), "with DUP": sum(back)}


def fedsdk_round(workdir: Path) -> dict:
    """The server on node 1, two device agents on node 2, two FedAvg rounds."""
    from fedcore.recipe import Recipe
    from sdk_device.data.npz import save_npz
    from sdk_device.protocol.topics import FleetTopics
    from sdk_device.transport.blob_store import BlobStore
    from sdk_device.transport.endpoint import Endpoint
    from sdk_device.transport.mqtt_link import BrokerAddress
    from server_toolkit.data.datasets import load_dataset
    from server_toolkit.fleet.registry import FleetRegistry
    from server_toolkit.methods.fedavg import FedAvg
    from server_toolkit.models.zoo import model_spec
    from server_toolkit.rounds.loop import LoopConfig, RoundLoop
    from server_toolkit.rounds.mqtt_grid import MqttGrid
    from server_toolkit.sim.partition import partition
    from server_toolkit.sim.simulate import start_device_process, stop_processes

    data = load_dataset("digits", seed=0)
    registry = FleetRegistry(workdir / "server" / "registry.sqlite")
    endpoint = Endpoint(BrokerAddress("127.0.0.1", NODES[1]), FleetTopics("rmq"),
                        BlobStore(workdir / "server" / "blobs"), is_known_peer=registry.is_known).start()
    procs = []
    started = time.monotonic()
    try:
        for dev, idx in zip(["dev0", "dev1"], partition(data.y_train, 2, "iid", seed=0), strict=True):
            registry.add_device(dev)
            save_npz(workdir / dev / "data.npz", data.x_train[idx], data.y_train[idx])
            procs.append(start_device_process(f"mqtt://127.0.0.1:{NODES[2]}", "rmq", dev,
                                              workdir / dev / "data.npz", workdir / dev / "work",
                                              workdir / f"{dev}.log"))
        spec = model_spec("small_cnn", data.input_shape, data.num_classes)
        method = FedAvg(spec, Recipe(epochs=1, batch_size=16, lr=0.05))
        loop = RoundLoop(method, MqttGrid(endpoint, registry), LoopConfig(rounds=2, round_timeout_s=120),
                         run_dir=workdir / "server", test_data=(data.x_test, data.y_test))
        loop.start()
        online = loop.grid.wait_for_devices(2, timeout_s=120)
        rows = loop.run() if online == 2 else []
        loop.grid.close()
        return {"devices online": online, "rounds": len(rows), "accepted": [r["accepted"] for r in rows],
                "accuracy": round(rows[-1]["accuracy"], 3) if rows else None,
                "seconds": round(time.monotonic() - started, 1)}
    except Exception as exc:  # reported as the check's result
        return {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        stop_processes(procs)
        endpoint.close()
        registry.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--keep", type=Path, default=None, help="keep the nodes' data and logs here")
    args = parser.parse_args()
    if not (RABBIT / "rabbitmq-server").exists():
        sys.exit("rabbitmq-server is not installed: apt-get install -y rabbitmq-server")
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="fedsdk-rabbitmq-", dir=args.keep))
    (workdir / ".erlang.cookie").write_text("FEDSDKBENCHCOOKIE")
    (workdir / ".erlang.cookie").chmod(0o400)
    started = time.monotonic()
    cluster = Cluster(workdir)
    results = {}
    try:
        cluster.start()
        print(cluster.ctl(1, "cluster_status", "--formatter", "json")[:300])
        checks = [("cross-node QoS 1", lambda: cross_node(args.messages)),
                  ("retained, read on", retained),
                  ("persistent session, back on node 1", lambda: persistent(100, 1)),
                  ("persistent session, back on node 2", lambda: persistent(100, 2)),
                  ("QoS 1 redelivery (same node)", lambda: redelivery(100)),
                  ("fedsdk FedAvg, server node 1, devices node 2", lambda: fedsdk_round(workdir / "fedsdk"))]
        for name, check in checks:
            try:
                results[name] = check()
            except Exception as exc:  # one failed check must not hide the others
                results[name] = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"{name}: {results[name]}", flush=True)
    finally:
        cluster.stop()
        if args.keep is None:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"\nwall time {time.monotonic() - started:.0f} s\n\n| check | result |\n|---|---|")
    for name, result in results.items():
        print(f"| {name} | " + ", ".join(f"{k}: {v}" for k, v in result.items()) + " |")


if __name__ == "__main__":
    main()
