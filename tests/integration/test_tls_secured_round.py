"""One federated round over mqtts:// to a secured mosquitto, as a user runs it.

The broker speaks only TLS with the CA and certificate of ``certs.init_certs`` and enforces
the fleet's accounts and ACL. The server is ``fedsdk-server run --broker-security DIR`` (it
logs in as ``fedsdk-server``); the device is ``fedsdk run`` with its own account. The device
account is granted through ``BrokerSecurity`` directly: pairing (which issues it in real
use) is built on another branch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from sdk_device.data.npz import save_npz
from sdk_device.protocol.topics import FleetTopics
from sdk_device.transport.blob_store import BlobStore
from sdk_device.transport.endpoint import Endpoint
from sdk_device.transport.mqtt_link import probe_login
from server_toolkit.broker.certs import init_certs
from server_toolkit.data.datasets import load_dataset

pytestmark = pytest.mark.integration

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _device_cmd(url: str, tmp_path, data, ca_file, *extra: str) -> list[str]:
    return [sys.executable, "-m", "sdk_device.cli", "run", "--broker", url, "--fleet", "sec",
            "--device-id", "pi-1", "--data", str(data), "--work-dir", str(tmp_path / "work"),
            "--ca-file", str(ca_file), *extra]


def test_device_trains_a_round_over_mqtts_and_a_foreign_ca_is_refused(secured_mosquitto_tls, tmp_path):
    secured = secured_mosquitto_tls
    security_dir = secured.security.directory
    secured.security.grant_device("pi-1", "pi-1 secret")
    data = load_dataset("digits", seed=0)
    data_path = tmp_path / "pi-1.npz"
    save_npz(data_path, data.x_train[:300], data.y_train[:300])
    run_dir = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "server_toolkit.cli", "devices", "add", "--run-dir", str(run_dir),
                    "pi-1"], check=True, capture_output=True, env=ENV)

    server = subprocess.Popen(
        [sys.executable, "-m", "server_toolkit.cli", "run", "--broker-security", str(security_dir),
         "--fleet", "sec", "--run-dir", str(run_dir), "--rounds", "1", "--min-devices", "1",
         "--local-epochs", "1", "--round-timeout", "120"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=ENV, text=True)
    device_env = {**ENV, "FEDSDK_MQTT_USERNAME": "pi-1", "FEDSDK_MQTT_PASSWORD": "pi-1 secret"}
    device_cmd = _device_cmd(secured.url, tmp_path, data_path, secured.ca_file, "--max-tasks", "1")
    device = subprocess.Popen(device_cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=device_env,
                              text=True)
    try:
        server_out, _ = server.communicate(timeout=240)
        device_out, _ = device.communicate(timeout=60)
    finally:
        for proc in (server, device):
            if proc.poll() is None:
                proc.kill()
    assert server.returncode == 0, server_out
    assert device.returncode == 0, device_out
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1]
    assert rows[0]["accepted"] == 1 and rows[0]["rejected"] == 0
    assert np.isfinite(rows[0]["accuracy"]) and rows[0]["accuracy"] > 0.1

    # A device that trusts another CA does not get past the TLS handshake (CLI and library).
    other_ca = init_certs(tmp_path / "other-ca", ["127.0.0.1"]).ca_pem
    stranger = subprocess.run(_device_cmd(secured.url, tmp_path / "x", data_path, other_ca),
                              capture_output=True, text=True, env=device_env, timeout=60)
    assert stranger.returncode != 0
    assert "certificate verify failed" in stranger.stdout + stranger.stderr
    endpoint = Endpoint(secured.address, FleetTopics("sec"), BlobStore(tmp_path / "y"), device_id="pi-1",
                        username="pi-1", password="pi-1 secret", ca_file=str(other_ca))
    with pytest.raises(ConnectionError, match="certificate verify failed"):
        endpoint.start(timeout_s=10)
    # Right CA, wrong password: TLS passes, the broker refuses.
    assert probe_login(secured.address, "pi-1", "guess", ca_file=secured.ca_file) == "Not authorized"


def test_plain_mqtt_to_another_machine_needs_insecure(tmp_path):
    """The device refuses before opening any socket (10.255.255.1 is never contacted)."""
    data_path = tmp_path / "d.npz"
    save_npz(data_path, np.zeros((4, 1, 8, 8), np.float32), np.zeros(4, np.int64))
    out = subprocess.run(
        [sys.executable, "-m", "sdk_device.cli", "run", "--broker", "mqtt://10.255.255.1:1883",
         "--fleet", "f", "--device-id", "d", "--data", str(data_path), "--work-dir", str(tmp_path / "w")],
        capture_output=True, text=True, env=ENV, timeout=60)
    assert out.returncode != 0
    assert "refusing plain mqtt:// to 10.255.255.1" in out.stderr and "--insecure" in out.stderr


def test_server_refuses_plain_mqtt_to_another_machine_and_a_secured_embedded_broker(tmp_path):
    from click.testing import CliRunner

    from server_toolkit.broker.mosquitto_auth import MosquittoAuthFiles
    from server_toolkit.cli import main

    runner = CliRunner()
    assert runner.invoke(main, ["devices", "add", "--run-dir", str(tmp_path / "run"), "d1"]).exit_code == 0
    plain = runner.invoke(main, ["run", "--broker", "mqtt://10.255.255.1:1883", "--fleet", "f",
                                 "--run-dir", str(tmp_path / "run"), "--rounds", "1"])
    assert plain.exit_code != 0 and "refusing plain mqtt:// to 10.255.255.1" in plain.output, plain.output

    MosquittoAuthFiles.create(tmp_path / "sec", "f")
    amqtt = runner.invoke(main, ["broker", "--security", str(tmp_path / "sec")])
    assert amqtt.exit_code != 0 and "embedded broker (amqtt 0.12) cannot run a secured fleet" in amqtt.output
    anonymous = runner.invoke(main, ["broker", "--mosquitto", "--host", "0.0.0.0"])
    assert anonymous.exit_code != 0 and "would let anyone in" in anonymous.output
