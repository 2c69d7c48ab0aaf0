"""One round with one device process in a network namespace (tests/netns_link.py), the broker
and the server in the root namespace: what the test and bench/netns.py measure."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from server_toolkit.broker.mosquitto import MosquittoBroker, free_port
from server_toolkit.sim.simulate import stop_processes

from ..netns_link import NetnsLink
from .harness import Fleet

CHUNK_BYTES = 4096  # the server's pulls: many chunks, so an outage falls mid-pull


def outage_mid_pull(net: NetnsLink, tmp_path: Path, outage_s: float, flaps: int = 1,
                    every_s: float = 0.0) -> Callable[[dict], None]:
    """A disturbance: once the server holds 2+ chunks of the result, the link goes down for
    ``outage_s``; ``flaps`` times, ``every_s`` apart. Records ``chunks_before``."""
    def disturb(outage: dict) -> None:
        partial = tmp_path / "server" / "blobs" / "partial"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not outage.get("stop"):
            have = list(partial.glob("*.have")) if partial.is_dir() else []
            lines = sum(len(p.read_text().splitlines()) for p in have)
            if lines >= 2:
                outage["chunks_before"] = lines
                for _ in range(flaps):
                    net.link(False)
                    time.sleep(outage_s)
                    net.link(True)
                    time.sleep(every_s)
                return
            time.sleep(0.05)
    return disturb


def far_round(net: NetnsLink, tmp_path: Path, disturb: Callable[[dict], None] | None = None,
              round_timeout_s: float = 200.0) -> dict:
    """Run one round with device "far" in ``net``; its figures: accepted, seconds, blob_bytes,
    bytes_pulled (chunk bytes the server received), rejections (retries), log (the device's)."""
    device_port = free_port()
    outage: dict = {}
    with MosquittoBroker(workdir=tmp_path / "mosquitto",
                         extra_config=f"listener {device_port} {net.host_ip}") as broker:
        fleet = Fleet(broker.address, tmp_path)
        fleet.endpoint.chunk_bytes = CHUNK_BYTES
        paths = fleet.write_data(["far"], "iid")
        fleet.registry.add_device("far")
        with open(tmp_path / "far.log", "wb") as log:
            device = subprocess.Popen(
                ["ip", "netns", "exec", net.ns, sys.executable, "-m", "sdk_device.cli", "run", "--insecure",
                 "--broker", f"mqtt://{net.host_ip}:{device_port}", "--fleet", fleet.fleet, "--device-id",
                 "far", "--data", str(paths["far"]), "--work-dir", str(tmp_path / "far" / "work")],
                stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
            try:
                loop = fleet.server(rounds=1, round_timeout_s=round_timeout_s)
                loop.start()
                loop.grid.wait_for_devices(1, timeout_s=120)
                thread = threading.Thread(target=disturb, args=(outage,), daemon=True) if disturb else None
                if thread:
                    thread.start()
                rows = loop.run()
                outage["stop"] = True
                if thread:
                    thread.join(timeout=120)
            finally:
                net.link(True)
                stop_processes([device], timeout_s=20)  # SIGTERM, then SIGKILL
                fleet.close()
    updates = fleet.registry.updates(1)
    blob = tmp_path / "server" / "blobs"
    blob_bytes = sum(p.stat().st_size for u in updates for p in blob.glob(f"**/{u['blob_id']}*"))
    return {"accepted": rows[0]["accepted"], "seconds": rows[0]["seconds"], "blob_bytes": blob_bytes,
            "bytes_pulled": fleet.endpoint.bytes_received, "rejections": len(fleet.registry.rejections()),
            "outage": outage, "log": (tmp_path / "far.log").read_text()[-2000:]}
