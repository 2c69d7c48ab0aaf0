"""The C++ device client passes every check of the conformance kit (``fedsdk-server
conformance``) over a real mosquitto, offered pte/1 programs."""

from __future__ import annotations

import pytest

from server_toolkit.conformance import check_names, run_checks
from server_toolkit.data.datasets import load_dataset
from server_toolkit.sim.simulate import stop_processes

from .cpp_client import start_client, write_data

pytestmark = pytest.mark.integration


def test_cpp_client_passes_every_conformance_check(cpp_device, mosquitto, tmp_path):
    data = load_dataset("digits", seed=0)
    data_dir = write_data(tmp_path / "data", data.x_train[:200], data.y_train[:200])
    procs = []

    def start_device() -> None:
        procs.append(
            start_client(
                cpp_device,
                mosquitto.url,
                "conf",
                "cpp-dev",
                data_dir,
                tmp_path / "work",
                tmp_path / "device.log",
                "--heartbeat",
                "1",
            )
        )

    try:
        outcomes = run_checks(mosquitto.url, "conf", "cpp-dev", ["pte/1"], ready=start_device)
    finally:
        stop_processes(procs)
    failed = {o.name: o.reason for o in outcomes if not o.passed}
    assert [o.name for o in outcomes] == check_names()
    assert not failed, (failed, (tmp_path / "device.log").read_text(errors="replace")[-3000:])
