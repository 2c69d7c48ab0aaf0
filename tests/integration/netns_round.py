"""One round with one device process in a network namespace (tests/netns_link.py), the broker
and the server in the root namespace: what the test and bench/netns.py measure."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

from server_toolkit.broker.mosquitto import MosquittoBroker, free_port
from server_toolkit.sim.simulate import stop_processes

from ..delay_relay import DelayRelay
from ..netns_link import NetnsLink
from .harness import Fleet

CHUNK_BYTES = 4096  # the server's pulls: many chunks, so an outage falls mid-pull


def outage_mid_pull(net: NetnsLink, tmp_path: Path, outage_s: float) -> Callable[[dict], None]:
    """A disturbance: once the server holds 2+ chunks of the result, the link goes down for
    ``outage_s``. Records ``chunks_before``."""
    def disturb(outage: dict) -> None:
        if _wait_mid_pull(tmp_path, outage):
            net.link(False)
            time.sleep(outage_s)
            net.link(True)
    return disturb


def outage_at_start(net: NetnsLink, outage_s: float) -> Callable[[dict], None]:
    """A disturbance: the link down for ``outage_s`` from the round's start (its task waits)."""
    def disturb(outage: dict) -> None:
        net.link(False)
        _sleep_unless_stopped(outage, outage_s)
        net.link(True)
    return disturb


def flapping(net: NetnsLink, down_s: float, up_s: float,
             mid_pull: Path | None = None) -> Callable[[dict], None]:
    """A disturbance: the link down ``down_s``, up ``up_s``, over and over until the round ends;
    from the round's start, or with ``mid_pull`` (the test's tmp_path) from when the server holds
    2+ chunks of the result. Records ``flaps`` (times it went down) and ``chunks_before``."""
    def disturb(outage: dict) -> None:
        outage["flaps"] = 0
        if mid_pull is not None and not _wait_mid_pull(mid_pull, outage):
            return
        while not outage.get("stop"):
            net.link(False)
            outage["flaps"] += 1
            _sleep_unless_stopped(outage, down_s)
            net.link(True)
            _sleep_unless_stopped(outage, up_s)
    return disturb


def _wait_mid_pull(tmp_path: Path, outage: dict) -> bool:
    """Wait until the server holds 2+ chunks of a pull in progress (True; ``chunks_before``
    recorded) or the round ended (False)."""
    partial = tmp_path / "server" / "blobs" / "partial"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not outage.get("stop"):
        have = list(partial.glob("*.have")) if partial.is_dir() else []
        lines = sum(len(p.read_text().splitlines()) for p in have)
        if lines >= 2:
            outage["chunks_before"] = lines
            return True
        time.sleep(0.05)
    return False


def _sleep_unless_stopped(outage: dict, seconds: float) -> None:
    end = time.monotonic() + seconds
    while not outage.get("stop") and time.monotonic() < end:
        time.sleep(0.05)


def far_round(net: NetnsLink, tmp_path: Path, disturb: Callable[[dict], None] | None = None,
              round_timeout_s: float = 200.0, latency_s: float = 0.0, near: bool = False) -> dict:
    """Run one round with device "far" in ``net``; its figures: accepted, seconds, blob_bytes,
    bytes_pulled (chunk bytes the server received), rejections (retries), log (the device's),
    far_accepted (bool). ``latency_s`` > 0: the device reaches the broker through a DelayRelay
    adding that much each way. ``near``: a second device "near", on the root namespace's
    loopback, in the same round (the round may close without "far" once "near" is in)."""
    device_port = free_port()
    outage: dict = {}
    relay = DelayRelay(net.host_ip, (net.host_ip, device_port), latency_s) if latency_s else nullcontext()
    with MosquittoBroker(workdir=tmp_path / "mosquitto",
                         extra_config=f"listener {device_port} {net.host_ip}") as broker, relay:
        device_url = f"mqtt://{net.host_ip}:{relay.port if latency_s else device_port}"
        fleet = Fleet(broker.address, tmp_path)
        fleet.endpoint.chunk_bytes = CHUNK_BYTES
        paths = fleet.write_data(["far", "near"] if near else ["far"], "iid")
        fleet.registry.add_device("far")
        if near:
            fleet.start_process("near", paths["near"])
        with open(tmp_path / "far.log", "wb") as log:
            device = subprocess.Popen(
                ["ip", "netns", "exec", net.ns, sys.executable, "-m", "sdk_device.cli", "run", "--insecure",
                 "--broker", device_url, "--fleet", fleet.fleet, "--device-id",
                 "far", "--data", str(paths["far"]), "--work-dir", str(tmp_path / "far" / "work")],
                stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
            try:
                loop = fleet.server(rounds=1, round_timeout_s=round_timeout_s)
                loop.start()
                loop.grid.wait_for_devices(1 + near, timeout_s=120)
                thread = threading.Thread(target=disturb, args=(outage,), daemon=True) if disturb else None
                if thread:
                    thread.start()
                rows = loop.run()
                outage["stop"] = True
                if thread:
                    thread.join(timeout=120)
            finally:
                outage["stop"] = True  # a flapping thread ends with the link up
                net.link(True)
                stop_processes([device], timeout_s=20)  # SIGTERM, then SIGKILL
                fleet.close()
    updates = fleet.registry.updates(1)
    blob = tmp_path / "server" / "blobs"
    blob_bytes = sum(p.stat().st_size for u in updates for p in blob.glob(f"**/{u['blob_id']}*"))
    return {"accepted": rows[0]["accepted"], "seconds": rows[0]["seconds"], "blob_bytes": blob_bytes,
            "bytes_pulled": fleet.endpoint.bytes_received, "rejections": len(fleet.registry.rejections()),
            "far_accepted": any(u["device_id"] == "far" for u in updates), "outage": outage,
            "log": (tmp_path / "far.log").read_text()[-2000:]}
