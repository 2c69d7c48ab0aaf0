"""Measuring instruments of ``bench/scale.py``: process RSS/CPU, the broker's $SYS counters and
the server's status, the registry's hello count, the run's round rows."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import psutil

DROPPED = "$SYS/broker/publish/messages/dropped"


class ProcessSampler:
    """Samples one process every ``every_s`` seconds: peak RSS (MiB) and CPU seconds (user+system)."""

    def __init__(self, pid: int, every_s: float = 0.5) -> None:
        self.proc = psutil.Process(pid)
        self.peak_rss_mb = 0.0
        self.cpu_s = 0.0
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def sample(self) -> None:
        try:
            with self.proc.oneshot():
                self.peak_rss_mb = max(self.peak_rss_mb, self.proc.memory_info().rss / 2**20)
                times = self.proc.cpu_times()
                self.cpu_s = times.user + times.system
        except psutil.Error:  # it exited (or was killed): keep the last sample
            pass

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()

    def stop(self) -> None:
        self.sample()
        self._stop.set()
        self._thread.join(2)


def rss_mb(pids: list[int]) -> float:
    """The summed resident memory of ``pids`` now, in MiB."""
    total = 0
    for pid in pids:
        try:
            total += psutil.Process(pid).memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20


class BrokerWatch:
    """A plain MQTT client that follows the broker's dropped-publish count ($SYS, with
    ``sys_interval 1``) and the server's retained status, with the time of each "online"."""

    def __init__(self, host: str, port: int, fleet: str) -> None:
        self.dropped = 0
        self.server_online_at: list[float] = []  # monotonic seconds of each "online"
        self._status_topic = f"fedsdk/v1/{fleet}/server/status"
        self._client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="fedsdk-scale-bench",
                                   clean_session=True, protocol=mqtt.MQTTv311)
        self._client.on_connect = lambda c, u, f, rc, p: c.subscribe([(DROPPED, 0), (self._status_topic, 1)])
        self._client.on_message = self._on_message
        self._client.connect(host, port, keepalive=30)
        self._client.loop_start()

    def _on_message(self, client, userdata, message) -> None:
        if message.topic == DROPPED:
            self.dropped = int(message.payload or b"0")
        elif message.payload == b"online":
            self.server_online_at.append(time.monotonic())

    def wait_server_online(self, since: float, timeout_s: float) -> bool:
        """True once the server said "online" after monotonic time ``since``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(t >= since for t in self.server_online_at):
                return True
            time.sleep(0.1)
        return False

    def close(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()


def hellos_recorded(registry: Path, since: float = 0.0) -> int:
    """Devices whose hello the server recorded (``last_seen`` after Unix time ``since``)."""
    try:
        with sqlite3.connect(f"file:{registry}?mode=ro", uri=True, timeout=5) as db:
            return db.execute("SELECT count(*) FROM devices WHERE num_samples IS NOT NULL AND last_seen >= ?",
                              (since,)).fetchone()[0]
    except sqlite3.Error:
        return 0


def round_rows(run_dir: Path) -> dict[int, dict]:
    """The rows of ``metrics.jsonl`` written so far, by round."""
    path = run_dir / "metrics.jsonl"
    rows = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue  # a line being written
            rows[row["round"]] = row
    return rows


def hellos_logged(log: Path) -> int:
    """Distinct devices whose hello a server logged (``device <id> online: …``) in ``log``."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return 0
    return len({line.split("device ", 1)[1].split(" ", 1)[0] for line in text.splitlines()
                if "device " in line and " online: " in line})
