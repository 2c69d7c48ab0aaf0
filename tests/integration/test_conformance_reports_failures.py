"""The conformance kit fails a device that breaks the protocol, and its command exits 1.

A stand-in device over a real mosquitto says ``hello`` naming another device (§5.4: the id
must equal the topic's); ``fedsdk-server conformance --only hello`` must print FAIL with the
reason and exit with status 1.
"""

from __future__ import annotations

import json
import threading
import time

import paho.mqtt.client as mqtt
import pytest
from click.testing import CliRunner

from server_toolkit.cli import main

pytestmark = pytest.mark.integration


def _bad_hello(host: str, port: int, stop: threading.Event) -> None:
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="bad-device", protocol=mqtt.MQTTv311)
    client.connect(host, port)
    client.loop_start()
    body = {
        "schema": 2,
        "type": "hello",
        "msg_id": "0" * 32,
        "sent_at": time.time(),
        "device_id": "someone-else",
        "runtimes": ["torch"],
        "num_samples": 10,
        "profile": {},
    }
    while not stop.wait(0.5):  # until the kit has connected and seen one
        client.publish("fedsdk/v1/conf/dev/bad-dev/up", json.dumps(body), qos=1)
    client.loop_stop()
    client.disconnect()


def test_conformance_command_fails_a_device_whose_hello_names_another_device(mosquitto):
    stop = threading.Event()
    device = threading.Thread(target=_bad_hello, args=(mosquitto.host, mosquitto.port, stop), daemon=True)
    device.start()
    try:
        result = CliRunner().invoke(
            main,
            [
                "conformance",
                "--broker",
                mosquitto.url,
                "--fleet",
                "conf",
                "--device-id",
                "bad-dev",
                "--format",
                "torchspec/1",
                "--only",
                "hello",
            ],
        )
    finally:
        stop.set()
        device.join(5)
    assert result.exit_code == 1, result.output
    assert "FAIL  hello" in result.output and "bad hello" in result.output, result.output
    assert "0 passed, 1 failed" in result.output
