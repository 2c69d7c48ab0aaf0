"""Devices training with ONNX Runtime in a real federation over mosquitto.

Four device processes on digits (IID): two run the torch runtime from the main venv, two
run ``--runtime onnxruntime`` from the ORT environment and train the server's
``ort-training/1`` program. After three FedAvg rounds the global model must be in the
same accuracy band as an all-torch run of the same seed and partition.
"""

from __future__ import annotations

import os
import subprocess

import pytest
import torch

from sdk_device.data.npz import load_npz
from server_toolkit.methods.base import DeviceInfo
from server_toolkit.methods.fedavg import FedAvg
from server_toolkit.models.zoo import model_spec
from server_toolkit.rounds.local_device import LocalDevice
from server_toolkit.sim.inprocess import run_rounds

from ..ort_env import ort_python
from .harness import RECIPE, Fleet

pytestmark = pytest.mark.integration

ROUNDS = 3


def _start_ort_device(fleet: Fleet, dev: str, data_path) -> None:
    fleet.registry.add_device(dev)
    cmd = [ort_python(), "-m", "sdk_device.cli", "run", "--broker", fleet.broker.url, "--fleet", fleet.fleet,
           "--device-id", dev, "--data", str(data_path), "--work-dir", str(fleet.root / dev / "work"),
           "--runtime", "onnxruntime"]
    log = open(fleet.root / f"{dev}.log", "wb")  # noqa: SIM115 - lives as long as the process
    fleet.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                        env={**os.environ, "OMP_NUM_THREADS": "1"}))


def _all_torch_accuracy(fleet: Fleet, paths: dict) -> float:
    """The same federation with every device on the torch runtime, in process."""
    spec = model_spec("small_cnn", fleet.data.input_shape, fleet.data.num_classes)
    devices = []
    for dev, path in sorted(paths.items()):
        x, y = load_npz(path)
        devices.append(LocalDevice(DeviceInfo(dev, len(y)), x, y))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # like a device process; two threads on a busy 2-core machine crawl
    try:
        result = run_rounds(FedAvg(spec, RECIPE), devices, ROUNDS, (fleet.data.x_test, fleet.data.y_test),
                            seed=0)
    finally:
        torch.set_num_threads(threads)
    return result.rows[-1]["accuracy"]


def test_onnxruntime_devices_train_in_a_federation(mosquitto, tmp_path):
    fleet = Fleet(mosquitto.address, tmp_path)
    torch_devices, ort_devices = ["dev0", "dev1"], ["ort0", "ort1"]
    try:
        paths = fleet.write_data(torch_devices + ort_devices, "iid")
        for dev in torch_devices:
            fleet.start_process(dev, paths[dev])
        for dev in ort_devices:
            _start_ort_device(fleet, dev, paths[dev])
        loop = fleet.server(rounds=ROUNDS, round_timeout_s=120,
                                          program_formats=["torchspec/1", "ort-training/1"])
        loop.start()
        # export the programs (ORT artifacts: a subprocess) while the devices start up
        loop.grid.programs.programs(loop.method.global_spec, RECIPE)
        assert loop.grid.wait_for_devices(4, timeout_s=120) == 4
        rows = loop.run()
    finally:
        fleet.close()
    assert all(r["accepted"] == 4 and r["rejected"] == 0 for r in rows), rows
    used = {u["device_id"]: u["metrics"]["runtime"] for u in fleet.registry.updates(ROUNDS)}
    assert used == {"dev0": "torch", "dev1": "torch", "ort0": "onnxruntime", "ort1": "onnxruntime"}
    reference = _all_torch_accuracy(fleet, paths)
    assert rows[-1]["accuracy"] >= 0.85, rows
    assert abs(rows[-1]["accuracy"] - reference) <= 0.05, (rows[-1]["accuracy"], reference)
