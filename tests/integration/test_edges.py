"""Edge aggregators over a real mosquitto: the server talks to two edge processes, each
the server of the device processes of one tier.

* ``fedsdk-server simulate --method fedconv --edges 2`` completes rounds; each edge
  clusters its group after a warm-up, collects smashed data and answers with one update of
  its tier's shape, which FedConv dilates (tier 0.5) and aggregates like any device's.
* An edge killed with SIGKILL in the middle of a round: its MQTT will tells the server,
  which closes the round with the other edge's update instead of waiting for the deadline,
  and goes on with the survivor.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from fedcore.recipe import Recipe
from sdk_device.protocol.blobs import decode_tensors
from sdk_device.transport.blob_store import BlobStore
from server_toolkit.fleet.registry import FleetRegistry
from server_toolkit.sim.simulate import Simulation, SimulationConfig

pytestmark = pytest.mark.integration

METHOD = "fedconv"
# fewer server epochs than FedConv's defaults (5 / 20 / 20 / 10) keep the test short
SERVER_EPOCHS = {"pretrain_epochs": 2, "compress_epochs": 3, "dilate_epochs": 3, "aggregate_epochs": 2}
TIERS = ["1.0", "0.5"]


def read_rows(db: Path, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
    """Read another process's registry without writing to it."""
    if not db.exists():
        return []
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute(sql, args).fetchall()
    except sqlite3.OperationalError:  # the tables do not exist yet
        return []
    finally:
        conn.close()


def first_conv(store: BlobStore, update: dict) -> tuple[int, ...]:
    return decode_tensors(store.get(update["blob_id"]))["layers.0.weight"].shape


def test_simulate_with_two_edges_completes_rounds(mosquitto, tmp_path):
    cmd = [sys.executable, "-m", "server_toolkit.cli", "simulate", "--method", METHOD, "--edges", "2",
           "--devices", "6", "--tiers", ",".join(TIERS), "--rounds", "2", "--local-epochs", "2",
           "--broker", mosquitto.url, "--runs-dir", str(tmp_path / "runs"), "--round-timeout", "90",
           "--device-runtime", "torch"]
    for key, value in SERVER_EPOCHS.items():
        cmd += ["--method-option", f"{key}={value}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2]
    assert all(r["accepted"] == 2 and r["rejected"] == 0 for r in rows), rows

    registry, store = FleetRegistry(run_dir / "registry.sqlite"), BlobStore(run_dir / "blobs")
    try:
        assert {d["device_id"] for d in registry.devices()} == {"edge-1", "edge-2"}  # devices sit behind them
        for update in registry.updates(2):
            edge = update["device_id"]
            tier = registry.device(edge)["tier"]
            members = [f"dev{i:03d}" for i in range(6) if TIERS[i % 2] == tier]
            edge_db = run_dir / "edges" / edge / "registry.sqlite"
            group = read_rows(edge_db, "SELECT device_id, num_samples FROM devices")
            assert sorted(r["device_id"] for r in group) == members
            assert update["num_samples"] == sum(r["num_samples"] for r in group)  # all three trained
            assert update["metrics"]["edge_devices"] == 3 and update["metrics"]["runtime"] == "edge"
            assert update["metrics"]["edge_clusters"] >= 1
            # group rounds: warm-up (1 epoch) and training for server round 1, training for round 2
            group_rounds = read_rows(edge_db, "SELECT round, status FROM rounds ORDER BY round")
            assert [(r["round"], r["status"]) for r in group_rounds] == [(1, "closed"), (2, "closed"),
                                                                         (3, "closed")]
            state = json.loads((run_dir / "edges" / edge / "state.json").read_text())
            assert set(state["method_state"]["clusters"]) == set(members)
            # what the edge sent is a model of its tier's shape, finite
            weights = decode_tensors(store.get(update["blob_id"]))
            assert all(np.isfinite(v).all() for v in weights.values())
            # the devices sent smashed data (the features output) with their training results, not with
            # the warm-up
            device_updates = read_rows(edge_db, "SELECT round, metrics FROM updates")
            for row in device_updates:
                has_smashed = "features" in json.loads(row["metrics"]).get("arrays", {})
                assert has_smashed == (row["round"] != 1), (edge, row["round"])
        shapes = {registry.device(u["device_id"])["tier"]: first_conv(store, u) for u in registry.updates(1)}
        assert shapes["0.5"][0] < shapes["1.0"][0]  # each edge trains its own tier's sub-model
        # FedConv dilates edge-2's (tier 0.5) result like a device's, every round
        assert all(row["server_dilate_s"] > 0 and 0.0 <= row["dilate_acc"] <= 1.0 for row in rows)
    finally:
        registry.close()


def test_killed_edge_does_not_hold_the_round(mosquitto, tmp_path, one_torch_thread):
    """SIGKILL edge-1 while its devices train for server round 2: the round closes with
    edge-2's update, long before the deadline; round 3 goes on with edge-2 alone."""
    timeout_s = 240.0
    config = SimulationConfig(method=METHOD, devices=4, rounds=3, tiers=TIERS, edges=2, seed=0,
                              method_options=SERVER_EPOCHS,
                              recipe=Recipe(epochs=5, batch_size=16, lr=0.05).to_dict(),
                              device_runtime="torch", broker_url=mosquitto.url, round_timeout_s=timeout_s)
    run_dir = tmp_path / "run"
    sim = Simulation(config, run_dir)
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["rows"] = sim.run().rows
        except Exception as exc:  # reported by the assertions below
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    edge_db = run_dir / "edges" / "edge-1" / "registry.sqlite"
    killed_in = None
    deadline = time.monotonic() + 200
    while killed_in is None and time.monotonic() < deadline and thread.is_alive():
        open_round = read_rows(run_dir / "registry.sqlite", "SELECT round FROM rounds WHERE status = 'open'")
        if open_round and open_round[0]["round"] == 2 and read_rows(
                edge_db, "SELECT round FROM rounds WHERE round > 2 AND status = 'open'"):  # its devices train
            sim.edge_procs[0].send_signal(signal.SIGKILL)
            killed_in = 2
        time.sleep(0.05)
    assert killed_in == 2, f"edge-1 never reached its training round for server round 2: {outcome}"
    thread.join(timeout=300)
    assert not thread.is_alive() and "error" not in outcome, outcome.get("error")
    rows = outcome["rows"]
    assert [r["round"] for r in rows] == [1, 2, 3]
    assert rows[0]["accepted"] == 2
    assert rows[1]["selected"] == 2 and rows[1]["accepted"] == 1  # closed with edge-2's update
    assert rows[1]["seconds"] < timeout_s / 2  # did not wait for the deadline
    assert rows[2]["selected"] == 1 and rows[2]["accepted"] == 1
    registry = FleetRegistry(run_dir / "registry.sqlite")
    try:
        assert [u["device_id"] for u in registry.updates(2)] == ["edge-2"]
        assert registry.device("edge-1")["status"] == "offline"  # its last will
        assert all(np.isfinite(r["accuracy"]) for r in rows)
    finally:
        registry.close()
