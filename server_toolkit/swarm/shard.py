"""One swarm process: a slice of the devices, their connections and one event loop."""

from __future__ import annotations

import logging
import resource
import time
from dataclasses import dataclass

from sdk_device.protocol.topics import FleetTopics
from sdk_device.transport.mqtt_link import BrokerAddress

from .counters import Counters
from .device import SwarmDevice, device_seed
from .link import EventLoop, SwarmLink

log = logging.getLogger(__name__)

TICK_S = 1.0  # seconds between keepalive/heartbeat passes and counter reports
CLOSE_S = 3.0  # seconds to flush the "offline" statuses on shutdown (the reference waits 3 s)
# Devices of one process waiting for their first CONNACK at most: a process short of CPU (or a
# slow broker) connects more slowly instead of opening sockets it cannot serve, whose sessions
# the broker would then drop for a missed keepalive (measured: a swarm starved at load 100
# connected 1,076 of 20,000, mosquitto logging "exceeded timeout" for the rest).
MAX_CONNECTING = 100
# New devices started per pass of the loop at most: each start is a TCP connect that may hold the
# loop up to link.CONNECT_TIMEOUT_S, so a pass starting the whole connect window (100) could
# freeze every other device's keepalive for seconds.
STARTS_PER_PASS = 10


@dataclass(frozen=True)
class ShardConfig:
    """What one swarm process needs (picklable: sent to a spawned process)."""

    broker_url: str
    fleet: str
    device_ids: tuple[str, ...]
    connect_rate: float  # devices per second this process connects
    heartbeat_s: float = 10.0
    fail_fraction: float = 0.0  # share of devices that vanish on their first task
    pull_programs: bool = True
    username: str | None = None
    password: str | None = None
    ca_file: str | None = None
    insecure: bool = False


def raise_fd_limit() -> int:
    """Raise this process's open-file limit to its hard limit (one socket per device); the new limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def _doomed(device_id: str, fraction: float) -> bool:
    """Whether the fault hook picks ``device_id`` (stable: the same devices on every run)."""
    return fraction > 0 and device_seed(device_id, salt=1) % 10_000 < fraction * 10_000


class Shard:
    """The devices of one process. ``run(stop)`` until ``stop()`` is true, then close cleanly."""

    def __init__(self, config: ShardConfig) -> None:
        self.config = config
        self.counters = Counters()
        self.loop = EventLoop()
        self.topics = FleetTopics(config.fleet)
        self.broker = BrokerAddress.parse(config.broker_url)
        self.devices: list[SwarmDevice] = []
        self.links: list[SwarmLink] = []
        self.connecting = 0  # devices made that have not had their first CONNACK yet

    def _make(self, device_id: str) -> None:
        doomed = _doomed(device_id, self.config.fail_fraction)
        device = SwarmDevice(device_id, self.topics, self.counters, heartbeat_s=self.config.heartbeat_s,
                             pull_programs=self.config.pull_programs,
                             on_task=self._vanish if doomed else None, schedule=self.loop.call_later)
        def on_connected(first: bool) -> None:
            if first:
                self.connecting -= 1
            device.on_connected(first)

        link = SwarmLink(
            self.loop, on_connected, device.on_disconnected,
            self.broker, f"fedsdk-dev-{self.config.fleet}-{device_id}", device.on_message,
            status_topic=self.topics.device_status(device_id),
            subscriptions=self.topics.device_subscriptions(device_id),
            username=self.config.username, password=self.config.password, ca_file=self.config.ca_file,
            insecure=self.config.insecure, pass_retain=True,  # the announcer tells retained from live
        )
        device.publish = link.publish
        device.link = link
        self.devices.append(device)
        self.links.append(link)
        self.connecting += 1
        link.start()

    def _vanish(self, device: SwarmDevice) -> bool:
        """The fault hook: the device dies on its task (its will tells the server)."""
        device.dead = True
        device.link.vanish()
        self.counters.vanished += 1
        return False

    def run(self, stop, report=None) -> None:
        """Connect at the configured rate and serve until ``stop()``; ``report(values)`` each tick."""
        raise_fd_limit()
        pending = list(self.config.device_ids)
        started = time.monotonic()
        next_tick = started
        while not stop():
            self.loop.run_once(0.02)
            now = time.monotonic()
            due = len(self.config.device_ids) if self.config.connect_rate <= 0 else \
                int((now - started) * self.config.connect_rate) + 1
            starts = 0
            while (pending and len(self.devices) < due and self.connecting < MAX_CONNECTING
                   and starts < STARTS_PER_PASS):
                self._make(pending.pop(0))
                starts += 1
            if now >= next_tick:
                next_tick = now + TICK_S
                for link, device in zip(self.links, self.devices, strict=True):
                    link.misc()
                    device.tick(now)
                self.counters.connected = sum(1 for d in self.devices if d.connected and not d.dead)
                if report is not None:
                    report(self.counters.values())
        self.close()
        if report is not None:
            self.counters.connected = 0
            report(self.counters.values())

    def close(self) -> None:
        """Every live device says ``offline`` and disconnects (so no last will fires)."""
        for device in self.devices:
            device.announcer.close()
        for link in self.links:
            link.begin_close()
        deadline = time.monotonic() + CLOSE_S
        while time.monotonic() < deadline and any(link.client.socket() is not None and not link.dead
                                                   for link in self.links):
            self.loop.run_once(0.05)
        for link in self.links:
            if link.client.socket() is not None and not link.dead:
                link.vanish()


def run_shard(config: ShardConfig, values, row: int, stop_event) -> None:
    """Entry point of a swarm process: report counters into row ``row`` of the shared ``values``."""
    logging.getLogger("paho").setLevel(logging.WARNING)
    width = Counters.width()

    def report(counts: tuple[int, ...]) -> None:
        values[row * width:(row + 1) * width] = list(counts)

    try:
        Shard(config).run(stop_event.is_set, report)
    except KeyboardInterrupt:  # the parent handles Ctrl-C and sets stop_event
        pass
