"""FedConv over a real mosquitto: ``fedsdk-server simulate --method fedconv --tiers
1.0,0.75,0.5,0.25`` with four device processes completes two rounds, every update is
accepted, each device uploads exactly its tier's compressed model, and the server reports
global accuracy and its time per stage. Fewer server epochs than the defaults keep it fast."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from sdk_device.protocol.blobs import decode_tensors
from sdk_device.transport.blob_store import BlobStore
from server_toolkit.cli import main
from server_toolkit.fleet.registry import FleetRegistry
from server_toolkit.methods.fedconv.conv_compress import tensor_shapes, tier_spec
from server_toolkit.models.zoo import model_spec
from server_toolkit.submodels.width import static_bn

pytestmark = pytest.mark.integration

TIERS = "1.0,0.75,0.5,0.25"
SERVER_EPOCHS = ["pretrain_epochs=2", "compress_epochs=3", "dilate_epochs=3", "aggregate_epochs=2"]


def test_fedconv_simulation_over_mosquitto(mosquitto, tmp_path):
    args = ["simulate", "--method", "fedconv", "--tiers", TIERS, "--devices", "4", "--rounds", "2",
            "--partition", "iid", "--local-epochs", "2", "--broker", mosquitto.url,
            "--runs-dir", str(tmp_path), "--round-timeout", "80"]
    for option in SERVER_EPOCHS:
        args += ["--method-option", option]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (run_dir,) = [p for p in tmp_path.iterdir() if (p / "metrics.jsonl").is_file()]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2]
    assert all(r["accepted"] == 4 and r["rejected"] == 0 for r in rows), rows
    assert all(0.0 <= r["accuracy"] <= 1.0 and math.isfinite(r["loss"]) for r in rows)
    assert "final accuracy" in result.output
    for key in ("server_compress_s", "server_dilate_s", "server_aggregate_s"):
        assert all(r[key] > 0 for r in rows), key
    assert rows[0]["server_pretrain_s"] > 0

    spec = static_bn(model_spec("small_cnn", (1, 8, 8), 10))
    registry, store = FleetRegistry(run_dir / "registry.sqlite"), BlobStore(run_dir / "blobs")
    try:
        seen = set()
        for rnd in (1, 2):
            for update in registry.updates(rnd):
                tier = registry.device(update["device_id"])["tier"]
                seen.add(tier)
                expected = tensor_shapes(tier_spec(spec, float(tier)))
                uploaded = decode_tensors(store.get(update["blob_id"]))
                assert {k: v.shape for k, v in uploaded.items()} == expected, tier
        assert seen == set(TIERS.split(","))
        state = json.loads((run_dir / "state.json").read_text())["method_state"]
        assert sorted(map(float, state["compressors"])) == [0.25, 0.5, 0.75]  # kept for --resume
    finally:
        registry.close()


def test_fedsdk_server_run_serves_fedconv_with_its_options_and_server_data(mosquitto, tmp_path):
    """`fedsdk-server run --method fedconv` builds the method once, with `--method-option` and
    the server data (a second, option-less copy without server data used to crash it)."""
    import subprocess
    import sys
    import time

    cmd = [sys.executable, "-m", "server_toolkit.cli", "run", "--method", "fedconv", "--method-option",
           "pretrain_epochs=1", "--broker", mosquitto.url, "--fleet", "fc",
           "--run-dir", str(tmp_path / "run"), "--round-timeout", "30"]
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = server.stdout.readline()
            if not line:
                break  # the server exited
            output.append(line)
            if "serving fleet fc" in line:
                break
        assert any("serving fleet fc" in line for line in output), "".join(output)[-3000:]
    finally:
        server.terminate()
        server.wait(timeout=30)
