"""A device without torch trains a FedAvg round over a real mosquitto on executorch-native.

The device is a real ``fedsdk run`` process started under ``tests.torchless.run``, which
makes ``import torch`` fail in it (as on a device where torch is not installed) and, when the
agent exits after its task, reports the modules and shared libraries the process loaded.
The server offers the task as ``torchspec/1`` and ``pte/1`` programs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedcore.recipe import Recipe
from server_toolkit.models.zoo import model_spec

from ..unit.pte_cache import cached_programs  # noqa: F401 - provides the program_for fixture
from .harness import RECIPE, Fleet

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DEVICE = "dev000"


def test_a_device_without_torch_trains_a_round_with_no_libtorch_loaded(mosquitto, tmp_path, program_for):
    fleet = Fleet(mosquitto.address, tmp_path)
    data_path = fleet.write_data([DEVICE])[DEVICE]
    fleet.registry.add_device(DEVICE)
    report_path, log_path = tmp_path / "device-report.json", tmp_path / "device.log"
    command = [sys.executable, "-m", "tests.torchless.run", str(report_path),
               "sdk_device.cli", "run", "--broker", mosquitto.url, "--fleet", fleet.fleet,
               "--device-id", DEVICE, "--data", str(data_path), "--work-dir", str(tmp_path / "work"),
               "--runtime", "executorch-native", "--max-tasks", "1"]
    with open(log_path, "wb") as log:
        device = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    loop = fleet.server(rounds=1, program_formats=["torchspec/1", "pte/1"], round_timeout_s=120)
    spec = model_spec("small_cnn", fleet.data.input_shape, fleet.data.num_classes)
    recipe: Recipe = RECIPE
    loop.grid.programs.put(spec, recipe, "pte/1", program_for(spec, recipe.loss_dict(), recipe.batch_size))
    loop.start()
    try:
        assert loop.grid.wait_for_devices(1, timeout_s=60) == 1, log_path.read_text()[-2000:]
        row = loop.run_round(1)
        assert device.wait(timeout=60) == 0, log_path.read_text()[-2000:]
    finally:
        if device.poll() is None:
            device.kill()
        loop.grid.close()
        fleet.close()
    assert row["accepted"] == 1 and not row["rejected"], row
    (update,) = fleet.registry.updates(1)
    assert update["metrics"]["runtime"] == "executorch-native"
    assert np.isfinite(update["metrics"]["loss"])
    assert row["accuracy"] >= 0.8, row  # 5 epochs on all of digits' training set

    report = json.loads(report_path.read_text())
    assert report["exit_code"] == 0
    assert report["torch_modules"] == [], report
    assert report["libtorch"] == [], report
    assert {"libexecutorch.so", "libexecutorch_backend_xnnpack.so"} <= set(report["executorch_libraries"])
