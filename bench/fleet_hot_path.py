"""The server's fleet hot path: registration, hello handling, result latency behind hellos.

* **registration** - ``fedsdk-server devices add --count N`` end to end (a subprocess, so
  Python start-up included) into a fresh registry. Seconds.
* **hello handling** - ``MqttGrid._handle`` of one hello from each of ``--hellos`` registered
  devices, called directly (no broker): what the server's message thread spends per hello.
  Hellos per second.
* **result behind hellos** - a real mosquitto: ``--hellos`` devices' hellos are published,
  then one result; the server's message loop (``grid.poll``) runs meanwhile. Seconds from
  the result reaching the server (paho's network thread) and from publishing it to
  ``_on_result`` being called, how many hellos were still unhandled then, and seconds until
  every hello was handled.

Runs against whatever code is first on ``sys.path`` (this repository), so the same script
measures an older checkout when copied into it. Run from the repository root::

    nice -n 10 .venv/bin/python bench/fleet_hot_path.py [--devices 10000] [--hellos 5000]
"""

from __future__ import annotations

import argparse
import logging
import os
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import paho.mqtt.client as mqtt  # noqa: E402

from sdk_device.protocol import messages as msgs  # noqa: E402
from sdk_device.protocol.topics import FleetTopics  # noqa: E402
from sdk_device.transport.blob_store import BlobStore  # noqa: E402
from sdk_device.transport.endpoint import Endpoint, Incoming  # noqa: E402
from server_toolkit.broker.mosquitto import MosquittoBroker  # noqa: E402
from server_toolkit.fleet.registry import FleetRegistry  # noqa: E402
from server_toolkit.rounds.mqtt_grid import MqttGrid  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROFILE = {"arch": "aarch64", "ram_mb": 4096, "cpu": {"cores": 4}}


def _register(path: Path, ids: list[str]) -> None:
    """Register ``ids`` quickly on any version of the registry (plain SQL when it lacks bulk add)."""
    registry = FleetRegistry(path)
    registry.close()
    db = sqlite3.connect(path)
    db.executemany("INSERT INTO devices (device_id, name, registered_at) VALUES (?,?,?)",
                   [(d, d, time.time()) for d in ids])
    db.commit()
    db.close()


def registration(devices: int, work: Path) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "server_toolkit.cli", "devices", "add", "--run-dir",
                    str(work / "reg"), "--count", str(devices), "--prefix", "swarm-"],
                   check=True, capture_output=True, cwd=ROOT,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    return time.perf_counter() - started


def hello_handling(hellos: int, work: Path) -> float:
    ids = [f"dev-{i:05d}" for i in range(hellos)]
    _register(work / "hello.sqlite", ids)
    registry = FleetRegistry(work / "hello.sqlite")
    grid = MqttGrid(None, registry)
    incoming = [Incoming(d, message=msgs.Hello(device_id=d, runtimes=["torch"], num_samples=100,
                                               profile=PROFILE)) for d in ids]
    started = time.perf_counter()
    for item in incoming:
        grid._handle(item)
    rate = hellos / (time.perf_counter() - started)
    grid.close()
    registry.close()
    return rate


def result_behind_hellos(hellos: int, work: Path) -> dict:
    ids = [f"dev-{i:05d}" for i in range(hellos)]
    _register(work / "result.sqlite", ids)
    registry = FleetRegistry(work / "result.sqlite")
    topics = FleetTopics("bench")
    with MosquittoBroker(workdir=work / "mosquitto") as broker:
        endpoint = Endpoint(broker.address, topics, BlobStore(work / "blobs"),
                            is_known_peer=registry.is_known).start()
        grid = MqttGrid(endpoint, registry)
        seen: dict[str, float] = {}
        on_result = grid._on_result

        def timed_result(dev, result):
            seen["result"] = time.perf_counter()
            seen["unhandled"] = hellos - len(grid.devices)
            on_result(dev, result)

        grid._on_result = timed_result
        receive = endpoint.link._handler  # paho's network thread: when the result reached the server

        def timed_receive(topic: str, payload: bytes) -> None:
            if b'"result"' in payload:
                seen["arrived"] = time.perf_counter()
            receive(topic, payload)

        endpoint.link._handler = timed_receive
        publisher = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="bench-publisher")
        publisher.max_inflight_messages_set(100)
        publisher.connect(broker.address.host, broker.address.port)
        publisher.loop_start()

        def publish() -> None:
            for dev in ids:
                hello = msgs.Hello(device_id=dev, runtimes=["torch"], num_samples=100, profile=PROFILE)
                publisher.publish(topics.up(dev), msgs.encode(hello), qos=1)
            result = msgs.Result(task_id="0" * 32, round=1, arrays={}, metrics={"samples": 1})
            seen["sent"] = time.perf_counter()
            publisher.publish(topics.up(ids[0]), msgs.encode(result), qos=1).wait_for_publish(60)

        started = time.perf_counter()
        thread = threading.Thread(target=publish)
        thread.start()
        while (len(grid.devices) < hellos or "result" not in seen) and time.perf_counter() - started < 300:
            grid.poll(0.05)
        all_hellos = time.perf_counter() - started
        thread.join()
        publisher.loop_stop()
        publisher.disconnect()
        grid.close()
        endpoint.close()
    registry.close()
    nan = float("nan")
    return {"result_handled_after_arrival_s": round(seen.get("result", nan) - seen.get("arrived", nan), 4),
            "result_handled_after_publish_s": round(seen.get("result", nan) - seen.get("sent", nan), 3),
            "hellos_unhandled_at_result": seen.get("unhandled"), "all_hellos_handled_s": round(all_hellos, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=10_000)
    parser.add_argument("--hellos", type=int, default=5_000)
    parser.add_argument("--skip-registration", action="store_true", help="(an old checkout: O(N²))")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if not args.skip_registration:
            print(f"registration of {args.devices} devices (CLI, end to end): "
                  f"{registration(args.devices, work):.2f} s")
        print(f"hello handling: {hello_handling(args.hellos, work):.0f} hellos/s")
        print(f"result behind {args.hellos} hellos (mosquitto): {result_behind_hellos(args.hellos, work)}")


if __name__ == "__main__":
    main()
