"""A RabbitMQ cluster with the MQTT plugin on loopback ports of this machine (tests, bench).

Debian's ``rabbitmq-server`` (3.10) run as the current user from ``/usr/lib/rabbitmq/bin``,
each node with its own name (``fedsdk<i>-<tag>@localhost``), data and log directories, AMQP,
Erlang distribution and MQTT ports, one shared Erlang cookie (``$HOME/.erlang.cookie`` in the
work directory) and a private epmd port, so clusters of parallel tests never meet.

Decisions: node 1 boots alone; the others boot in parallel with ``classic_config`` peer
discovery naming node 1, so they join its cluster while booting (no ``stop_app`` / ``reset`` /
``join_cluster`` round of CLI calls, each of which starts an Erlang VM: seconds apiece on a
busy machine). A node is up when its MQTT port accepts connections (the plugin's listener
opens last); membership is then checked once with ``rabbitmqctl cluster_status``. The MQTT
sessions' queues are quorum queues (``mqtt.durable_queue_type = quorum``), replicated over the
nodes: with the default classic queues a device whose session queue lived on a killed node is
refused on every other node (``NOT_FOUND - home node … of durable queue
'mqtt-subscription-<client id>qos1' … is down``) until that node returns — measured. Retained
messages are per node in this version (each node's own store): what fedsdk's status request
(docs/protocol.md §3.2) exists for.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from sdk_device.transport.mqtt_link import BrokerAddress

from .mosquitto import free_port

RABBIT_BIN = Path("/usr/lib/rabbitmq/bin")
PLUGIN_DIRS = "/usr/lib/rabbitmq/plugins:/usr/lib/rabbitmq/lib/rabbitmq_server-{version}/plugins"


def rabbitmq_missing() -> str | None:
    """Why a RabbitMQ cluster cannot run here (None when it can)."""
    if not (RABBIT_BIN / "rabbitmq-server").exists():
        return "rabbitmq-server is not installed (make rabbitmq, or apt-get install -y rabbitmq-server)"
    return None


def _version() -> str:
    found = sorted(Path("/usr/lib/rabbitmq/lib").glob("rabbitmq_server-*"))
    return found[-1].name.split("-", 1)[1] if found else ""


@dataclass
class RabbitNode:
    name: str
    amqp_port: int
    dist_port: int
    mqtt_port: int
    directory: Path
    proc: subprocess.Popen | None = None

    @property
    def address(self) -> BrokerAddress:
        return BrokerAddress("127.0.0.1", self.mqtt_port)

    @property
    def url(self) -> str:
        return self.address.url


class RabbitCluster:
    """``size`` RabbitMQ nodes clustered on loopback; ``nodes[i].url`` is node i's MQTT URL."""

    def __init__(self, workdir: Path, size: int = 3) -> None:
        self.workdir = Path(workdir)
        self.home = self.workdir / "home"
        self.epmd_port = free_port()
        tag = secrets.token_hex(3)
        self.nodes = [RabbitNode(f"fedsdk{i + 1}-{tag}@localhost", free_port(), free_port(), free_port(),
                                 self.workdir / f"node{i + 1}") for i in range(size)]
        self.boot_seconds: list[float] = []  # per start(): node 1 alone, then the others

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self, timeout_s: float = 240.0) -> RabbitCluster:
        self.home.mkdir(parents=True, exist_ok=True)
        cookie = self.home / ".erlang.cookie"
        if not cookie.exists():
            cookie.write_text(secrets.token_hex(16))
            cookie.chmod(0o400)
        began = time.monotonic()
        self.start_node(0)
        self.wait_up([0], timeout_s)
        self.boot_seconds.append(time.monotonic() - began)
        began = time.monotonic()
        rest = list(range(1, len(self.nodes)))
        for i in rest:
            self.start_node(i)
        self.wait_up(rest, timeout_s)
        self.boot_seconds.append(time.monotonic() - began)
        running = self.running_nodes()
        if sorted(running) != sorted(n.name for n in self.nodes):
            raise RuntimeError(f"RabbitMQ cluster did not form: running {running}")
        return self

    def start_node(self, i: int) -> None:
        """Start node ``i`` (again, after ``kill``: it rejoins with its data directory)."""
        node = self.nodes[i]
        node.directory.mkdir(parents=True, exist_ok=True)
        conf = [f"listeners.tcp.default = {node.amqp_port}", f"mqtt.listeners.tcp.default = {node.mqtt_port}",
                "loopback_users = none", "mqtt.allow_anonymous = true",
                "mqtt.durable_queue_type = quorum"]  # sessions survive their node (docstring)
        if i > 0:
            conf += ["cluster_formation.peer_discovery_backend = classic_config",
                     f"cluster_formation.classic_config.nodes.1 = {self.nodes[0].name}"]
        (node.directory / "rabbitmq.conf").write_text("\n".join(conf) + "\n")
        (node.directory / "enabled_plugins").write_text("[rabbitmq_mqtt].\n")
        log = open(node.directory / "console.log", "ab")
        node.proc = subprocess.Popen([str(RABBIT_BIN / "rabbitmq-server")], env=self._env(node),
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    def wait_up(self, indices: list[int], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for i in indices:
            node = self.nodes[i]
            while not _accepts(node.mqtt_port):
                if node.proc is not None and node.proc.poll() is not None:
                    raise RuntimeError(f"RabbitMQ node {node.name} exited: see {node.directory}/console.log")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"RabbitMQ node {node.name} not up within {timeout_s:.0f} s")
                time.sleep(0.2)

    def kill(self, i: int) -> None:
        """SIGKILL node ``i`` (its Erlang VM and children): a crashed machine."""
        node = self.nodes[i]
        if node.proc is not None and node.proc.poll() is None:
            os.killpg(node.proc.pid, signal.SIGKILL)
            node.proc.wait(timeout=10)

    def stop(self) -> None:
        for i in range(len(self.nodes)):
            self.kill(i)
        # the epmd the first node started (relaxed: it may be killed while nodes are registered)
        subprocess.run([shutil.which("epmd") or "/usr/bin/epmd", "-port", str(self.epmd_port), "-kill"],
                       env={**os.environ, "ERL_EPMD_RELAXED_COMMAND_CHECK": "1"}, capture_output=True,
                       timeout=10, check=False)

    def __enter__(self) -> RabbitCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- queries ---------------------------------------------------------------------------------
    def running_nodes(self) -> list[str]:
        """The cluster's running nodes as node 1 sees them (one ``rabbitmqctl`` call)."""
        out = subprocess.run([str(RABBIT_BIN / "rabbitmqctl"), "-n", self.nodes[0].name, "cluster_status",
                              "--formatter", "json"], env=self._env(self.nodes[0]), capture_output=True,
                             text=True, timeout=120, check=True).stdout
        return list(json.loads(out).get("running_nodes", []))

    def _env(self, node: RabbitNode) -> dict[str, str]:
        return {**os.environ, "HOME": str(self.home), "RABBITMQ_NODENAME": node.name,
                "RABBITMQ_NODE_PORT": str(node.amqp_port), "RABBITMQ_DIST_PORT": str(node.dist_port),
                "RABBITMQ_MNESIA_BASE": str(node.directory / "mnesia"),
                "RABBITMQ_LOG_BASE": str(node.directory / "log"),
                "RABBITMQ_CONFIG_FILE": str(node.directory / "rabbitmq.conf"),
                "RABBITMQ_ENABLED_PLUGINS_FILE": str(node.directory / "enabled_plugins"),
                "RABBITMQ_PLUGINS_DIR": PLUGIN_DIRS.format(version=_version()),
                "RABBITMQ_PID_FILE": str(node.directory / "pid"), "ERL_EPMD_PORT": str(self.epmd_port),
                "ERL_EPMD_RELAXED_COMMAND_CHECK": "1"}


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False
