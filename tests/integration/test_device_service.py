"""`fedsdk run` as a service: started before its broker it waits (backoff) and joins once the
broker is up; it rejoins after losing the broker mid-run; a refused login or an untrusted
certificate ends it at once with a one-line error and exit codes 5 / 4 (the systemd unit
does not restart on those). Real `fedsdk run` processes, real mosquitto."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from sdk_device.data.npz import save_npz
from sdk_device.protocol.topics import FleetTopics
from server_toolkit.broker.mosquitto import MosquittoBroker, free_port
from server_toolkit.data.datasets import load_dataset

pytestmark = pytest.mark.integration

FEDSDK = Path(sys.executable).parent / "fedsdk"


def _data(tmp_path: Path) -> Path:
    data = load_dataset("digits", seed=0)
    save_npz(tmp_path / "data.npz", data.x_train[:64], data.y_train[:64])
    return tmp_path / "data.npz"


def _agent(tmp_path: Path, broker_url: str, fleet: str, device: str, *extra: str) -> subprocess.Popen:
    log = open(tmp_path / f"{device}.log", "wb")  # noqa: SIM115 (closed with the process)
    return subprocess.Popen(
        [str(FEDSDK), "-v", "run", "--broker", broker_url, "--fleet", fleet, "--device-id", device,
         "--data", str(_data(tmp_path)), "--work-dir", str(tmp_path / device), *extra],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})


def _log(tmp_path: Path, device: str) -> str:
    return (tmp_path / f"{device}.log").read_text(errors="replace")


def _wait(predicate, timeout_s: float, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert proc is None or proc.poll() is None, f"the agent exited early ({proc.returncode})"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


class StatusWatch:
    """Subscribes to one device's status topic (``wait_for`` a payload)."""

    def __init__(self, port: int, topic: str, username: str | None = None, password: str | None = None):
        self.seen: queue.Queue = queue.Queue()
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, clean_session=True)
        if username:
            self.client.username_pw_set(username, password)
        self.client.on_connect = lambda c, *_: c.subscribe(topic, qos=1)
        self.client.on_message = lambda c, u, m: self.seen.put((m.payload.decode(), m.retain))
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()

    def wait_for(self, payload: str, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                got, _ = self.seen.get(timeout=left)
            except queue.Empty:
                return False
            if got == payload:
                return True
        return False

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def test_an_agent_started_before_its_broker_joins_once_the_broker_is_up(tmp_path):
    port = free_port()
    agent = _agent(tmp_path, f"mqtt://127.0.0.1:{port}", "svc", "early-pi")
    broker = watch = None
    try:
        _wait(lambda: _log(tmp_path, "early-pi").count("next attempt in") >= 3, 120,
              "three connection attempts", agent)
        log = _log(tmp_path, "early-pi")
        assert "Connection refused (attempt 1); next attempt in" in log  # one line per attempt
        broker = MosquittoBroker(port=port, workdir=tmp_path / "mosquitto").start()
        watch = StatusWatch(port, FleetTopics("svc").device_status("early-pi"))
        assert watch.wait_for("online", 90), _log(tmp_path, "early-pi")[-2000:]
        assert agent.poll() is None
        agent.send_signal(signal.SIGTERM)  # stops cleanly: exit 0, retained status "offline"
        assert agent.wait(timeout=30) == 0
        assert watch.wait_for("offline", 10)
    finally:
        if agent.poll() is None:
            agent.kill()
        if watch is not None:
            watch.close()
        if broker is not None:
            broker.stop()


def test_a_connect_timeout_gives_up_with_exit_code_3(tmp_path):
    agent = _agent(tmp_path, f"mqtt://127.0.0.1:{free_port()}", "svc", "late", "--connect-timeout", "3")
    assert agent.wait(timeout=120) == 3
    lines = _log(tmp_path, "late").strip().splitlines()
    assert lines[-1].startswith("Error: cannot reach MQTT broker") and "gave up after" in lines[-1]


def test_an_agent_rejoins_after_losing_its_broker_and_stops_when_its_account_is_revoked(
        secured_mosquitto, tmp_path):
    secured = secured_mosquitto
    secured.security.grant_device("pi-1", "right-password")
    user, password = secured.security.server_credentials()
    agent = _agent(tmp_path, secured.url, secured.fleet, "pi-1", "--username", "pi-1",
                   "--password", "right-password")
    topic = FleetTopics(secured.fleet).device_status("pi-1")
    watch = StatusWatch(secured.address.port, topic, user, password)
    try:
        assert watch.wait_for("online", 120), _log(tmp_path, "pi-1")[-2000:]
        watch.close()
        secured.broker.stop()  # the broker goes away mid-run ...
        for saved in secured.broker.workdir.glob("*.db"):  # (forget its retained "online")
            saved.unlink()
        time.sleep(3)
        secured.broker.start()  # ... and comes back: paho reconnects and says "online" again
        watch = StatusWatch(secured.address.port, topic, user, password)
        assert watch.wait_for("online", 60), _log(tmp_path, "pi-1")[-2000:]
        assert agent.poll() is None
        secured.security.revoke_device("pi-1")
        secured.broker.stop()
        secured.broker.start()  # the reconnect is refused: permanent, the agent ends (exit 5)
        assert agent.wait(timeout=90) == 5
        last = _log(tmp_path, "pi-1").strip().splitlines()[-1]
        assert last.startswith("Error: MQTT broker at") and "refused us" in last and "revoked" in last
    finally:
        if agent.poll() is None:
            agent.kill()
        watch.close()


def test_a_wrong_password_ends_the_agent_at_once_with_exit_code_5(secured_mosquitto, tmp_path):
    secured = secured_mosquitto
    secured.security.grant_device("pi-2", "right-password")
    agent = _agent(tmp_path, secured.url, secured.fleet, "pi-2", "--username", "pi-2", "--password", "wrong")
    assert agent.wait(timeout=120) == 5
    log = _log(tmp_path, "pi-2")
    assert "next attempt in" not in log  # a bad password is not retried
    last = log.strip().splitlines()[-1]
    assert last.startswith("Error: MQTT broker at") and "refused us" in last and "credentials" in last


def test_an_untrusted_broker_certificate_ends_the_agent_with_exit_code_4(secured_mosquitto_tls, tmp_path):
    secured = secured_mosquitto_tls
    secured.security.grant_device("pi-3", "right-password")
    other_ca = "/etc/ssl/certs/ca-certificates.crt"  # public CAs: not the fleet's own CA
    agent = _agent(tmp_path, secured.url, secured.fleet, "pi-3", "--username", "pi-3", "--password",
                   "right-password", "--ca-file", other_ca)
    assert agent.wait(timeout=120) == 4
    log = _log(tmp_path, "pi-3")
    assert "next attempt in" not in log
    last = log.strip().splitlines()[-1]
    assert "certificate verify failed" in last and "not the CA this device trusts" in last
