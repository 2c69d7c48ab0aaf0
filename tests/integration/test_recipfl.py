"""`fedsdk-server simulate --method recipfl` over a real mosquitto: 1 strong + 5 weak devices."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sdk_device.protocol.blobs import decode_tensors
from sdk_device.transport.blob_store import BlobStore
from server_toolkit.fleet.registry import FleetRegistry

pytestmark = pytest.mark.integration


def test_recipfl_with_one_strong_and_five_weak_devices(mosquitto, tmp_path):
    cmd = [sys.executable, "-m", "server_toolkit.cli", "simulate", "--method", "recipfl", "--model", "lenet5",
           "--devices", "6", "--rounds", "2", "--local-epochs", "1", "--partition", "quantity-skew",
           "--num-strong", "1", "--strong-share", "0.5", "--tiers", "strong,weak,weak,weak,weak,weak",
           "--method-option", "small_model=width:0.3", "--broker", mosquitto.url,
           "--runs-dir", str(tmp_path / "runs")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # the GHN update is ~7x slower on 2 busy threads
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run_dir,) = list((tmp_path / "runs").iterdir())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2]
    for row in rows:
        assert row["accepted"] == 6 and row["rejected"] == 0
        assert row["hn_models"] == 7  # the strong device's large and small model, 5 weak small models
        assert row["hn_gap_rms"] > 0 and 0 <= row["accuracy_large"] <= 1 and 0 <= row["accuracy_small"] <= 1

    registry = FleetRegistry(run_dir / "registry.sqlite")
    store = BlobStore(run_dir / "blobs")
    for rnd in (1, 2):
        for update in registry.updates(rnd):
            student = decode_tensors(store.get(update["blob_id"]))
            others = update["metrics"]["arrays"]  # the other array records' blob ids
            assert student["layers.0.weight"].shape == (2, 1, 5, 5)  # the small model (width 0.3)
            if update["device_id"] == "dev000":  # the strong device also returns its large model
                teacher = decode_tensors(store.get(others["teacher"]))
                assert teacher["layers.0.weight"].shape == (6, 1, 5, 5)
            else:
                assert not others
            assert update["metrics"]["label_counts"]
    registry.close()
    state = json.loads((run_dir / "state.json").read_text())
    assert state["method"] == "recipfl"
    assert set(state["method_state"]["pooled"]) == {f"dev{i:03d}" for i in range(6)}
    assert set(state["method_state"]["pooled"]["dev000"]) == {"large", "small"}
