"""The C++ client over TLS with a pinned CA and a broker account (mosquitto with fedsdk's
accounts and ACL, ``mqtts://`` only): it passes the hello and task checks of the conformance
kit, and with another CA pinned it never gets past the TLS handshake."""

from __future__ import annotations

import subprocess
from urllib.parse import quote

import pytest

from server_toolkit.broker.certs import init_certs
from server_toolkit.conformance import run_checks
from server_toolkit.data.datasets import load_dataset
from server_toolkit.sim.simulate import stop_processes

from .cpp_client import start_client, write_data

pytestmark = pytest.mark.integration


def test_cpp_client_trains_over_mqtts_with_a_pinned_ca_and_refuses_a_foreign_one(
    cpp_device, secured_mosquitto_tls, tmp_path
):
    secured = secured_mosquitto_tls
    secured.security.grant_device("cpp-tls", "cpp secret")
    host_port = secured.url.split("://", 1)[1]
    device_url = f"mqtts://cpp-tls:{quote('cpp secret')}@{host_port}"
    user, password = secured.security.server_credentials()
    server_url = f"mqtts://{quote(user)}:{quote(password)}@{host_port}"
    data = load_dataset("digits", seed=0)
    data_dir = write_data(tmp_path / "data", data.x_train[:100], data.y_train[:100])
    procs = []

    def start_device() -> None:
        procs.append(
            start_client(
                cpp_device,
                device_url,
                "sec",
                "cpp-tls",
                data_dir,
                tmp_path / "work",
                tmp_path / "device.log",
                "--ca-file",
                str(secured.ca_file),
            )
        )

    try:
        outcomes = run_checks(
            server_url,
            "sec",
            "cpp-tls",
            ["pte/1"],
            ca_file=str(secured.ca_file),
            ready=start_device,
            only=["hello", "task_round_trip"],
        )
    finally:
        stop_processes(procs)
    assert [(o.name, o.passed) for o in outcomes] == [("hello", True), ("task_round_trip", True)], (
        outcomes,
        (tmp_path / "device.log").read_text(errors="replace")[-2000:],
    )

    other_ca = init_certs(tmp_path / "other-ca", ["127.0.0.1"]).ca_pem
    stranger = subprocess.run(
        [
            str(cpp_device),
            "run",
            "--broker",
            device_url,
            "--fleet",
            "sec",
            "--device-id",
            "cpp-tls",
            "--data",
            str(data_dir),
            "--work-dir",
            str(tmp_path / "w2"),
            "--ca-file",
            str(other_ca),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert stranger.returncode != 0
    # libmosquitto reports the failed handshake either at connect or as a CONNACK that never comes
    assert "TLS error" in stranger.stderr or "no CONNACK" in stranger.stderr, stranger.stderr[-2000:]
