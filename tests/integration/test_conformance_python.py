"""The Python device agent (``fedsdk run``) passes every check of the conformance kit
(``fedsdk-server conformance``) over a real mosquitto, offered torchspec/1 programs."""

from __future__ import annotations

import pytest

from sdk_device.data.npz import save_npz
from server_toolkit.conformance import check_names, run_checks
from server_toolkit.data.datasets import load_dataset
from server_toolkit.sim.simulate import start_device_process, stop_processes

pytestmark = pytest.mark.integration


def test_python_agent_passes_every_conformance_check(mosquitto, tmp_path):
    data = load_dataset("digits", seed=0)
    data_path = tmp_path / "data.npz"
    save_npz(data_path, data.x_train[:200], data.y_train[:200])
    procs = []

    def start_device() -> None:
        procs.append(
            start_device_process(
                mosquitto.url, "conf", "py-dev", data_path, tmp_path / "work", tmp_path / "device.log"
            )
        )

    try:
        outcomes = run_checks(mosquitto.url, "conf", "py-dev", ["torchspec/1"], ready=start_device)
    finally:
        stop_processes(procs)
    failed = {o.name: o.reason for o in outcomes if not o.passed}
    assert [o.name for o in outcomes] == check_names()
    assert not failed, (failed, (tmp_path / "device.log").read_text(errors="replace")[-3000:])
