"""Unit tests of the server side of pairing without a broker: registry additions, device ids,
fleet description, and the `pair-code` / `devices show|revoke|retier` commands."""

from __future__ import annotations

import os
import re
import time

import pytest
from click.testing import CliRunner

from fedcore.recipe import Recipe
from sdk_device.transport.tls import certificate_fingerprint
from server_toolkit.cli import main
from server_toolkit.fleet import membership as registry_module
from server_toolkit.fleet.fleet_info import FleetInfo
from server_toolkit.fleet.pair_codes import LockoutPolicy, PairCodes
from server_toolkit.fleet.pairing_service import device_id_for
from server_toolkit.fleet.pairing_setup import describe_fleet, device_url_for
from server_toolkit.fleet.registry import FleetRegistry
from server_toolkit.methods.width.heterofl import HeteroFL
from server_toolkit.models.zoo import model_spec

TIERS = ["1.0", "0.5", "0.25"]
PROFILE = {
    "arch": "aarch64",
    "board": "Raspberry Pi 4 Model B",
    "cpu_count": 4,
    "memory_mb": 3800.0,
    "memory_available_mb": 3000.0,
    "num_samples": 500,
    "os": "Debian 12",
    "python": "3.11",
    "bench": {
        "tiers": {"1.0": {"runtimes": [{"runtime": "torch", "format": "torchspec/1", "ms_per_step": 400.0}]}},
        "base_rss_mb": 300.0,
        "batch_size": 16,
    },
}


def _fleet_info(ca_file=None, url="mqtts://server.lan:8883") -> FleetInfo:
    method = HeteroFL(model_spec("small_cnn", (1, 8, 8), 10), Recipe(epochs=5, batch_size=16))
    return describe_fleet(
        method,
        "lab",
        url,
        TIERS,
        60.0,
        method_name="heterofl",
        model="small_cnn",
        ca_file=ca_file,
        security_dir=None,
        insecure=False,
        lockout=LockoutPolicy(),
    )


def test_device_ids_are_safe_unique_and_never_service_names():
    taken = {"pi", "pi-2"}
    assert device_id_for("pi", taken.__contains__) == "pi-3"
    assert device_id_for("Kitchen Pi (old)!", taken.__contains__) == "Kitchen-Pi-old"
    assert device_id_for("fedsdk-server", taken.__contains__) == "dev-fedsdk-server"
    assert device_id_for("///", taken.__contains__) == "device"
    assert len(device_id_for("x" * 200, taken.__contains__)) == 48


def test_registry_keeps_paired_devices_and_sees_other_processes_revocations(tmp_path, monkeypatch):
    path = tmp_path / "registry.sqlite"
    server = FleetRegistry(path)
    server.register_paired("pi", "pi", "0.5", PROFILE, {"mode": "auto"}, "hash-of-password")
    device = server.device("pi")
    assert "password_hash" not in device and device["pair_profile"]["board"] == "Raspberry Pi 4 Model B"
    assert server.password_hash("pi") == "hash-of-password" and server.tier_of("pi") == "0.5"
    assert server.is_known("pi")
    cli = FleetRegistry(path)  # `fedsdk-server devices revoke` is another process
    assert cli.revoke("pi") and not cli.revoke("ghost")
    assert server.is_known("pi")  # until the cached set is refreshed
    monkeypatch.setattr(registry_module, "KNOWN_REFRESH_S", 0.0)
    assert not server.is_known("pi") and server.password_hash("pi") is None
    server.set_status("pi", "online")  # a late status does not un-revoke it
    server.add_device("pi")  # nor does adding it by hand again
    assert server.device("pi")["status"] == "revoked" and not server.is_known("pi")


def test_old_registries_gain_the_pairing_columns(tmp_path):
    import sqlite3

    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.execute(
        "CREATE TABLE devices (device_id TEXT PRIMARY KEY, name TEXT, tier TEXT, profile TEXT, "
        "runtimes TEXT, num_samples INTEGER, registered_at REAL, last_seen REAL, "
        "status TEXT DEFAULT 'registered', revoked INTEGER DEFAULT 0)"
    )
    db.execute("INSERT INTO devices (device_id) VALUES ('old')")
    db.commit()
    db.close()
    registry = FleetRegistry(path)
    assert registry.device("old")["pair_profile"] is None and registry.is_known("old")


def test_fleet_description_costs_every_tier_and_refuses_unknown_ones():
    info = _fleet_info()
    assert list(info.tier_costs) == TIERS and info.full_cost == info.tier_costs["1.0"]
    assert info.recipe["batch_size"] == 16 and info.server_pid == os.getpid()
    method = HeteroFL(model_spec("small_cnn", (1, 8, 8), 10), Recipe())
    with pytest.raises(ValueError):
        describe_fleet(
            method,
            "lab",
            "mqtt://127.0.0.1:1883",
            ["big"],
            60.0,
            method_name="heterofl",
            model="small_cnn",
            ca_file=None,
            security_dir=None,
            insecure=False,
            lockout=LockoutPolicy(),
        )


def test_devices_are_told_a_name_their_tls_check_accepts(tmp_path):
    from sdk_device.transport.mqtt_link import BrokerAddress
    from server_toolkit.broker.certs import init_certs

    files = init_certs(tmp_path / "certs", ["server.lan", "localhost", "127.0.0.1"])
    local = BrokerAddress("127.0.0.1", 8883, tls=True)
    assert device_url_for(local, str(files.ca_pem)) == "mqtts://server.lan:8883"
    assert device_url_for(local, str(files.ca_pem), "mqtts://10.0.0.2:8883") == "mqtts://10.0.0.2:8883"
    assert device_url_for(BrokerAddress("127.0.0.1", 1883), None) == "mqtt://127.0.0.1:1883"


def test_pair_code_prints_the_exact_device_command(tmp_path):
    from server_toolkit.broker.certs import init_certs

    files = init_certs(tmp_path / "certs", ["server.lan", "127.0.0.1"])
    run_dir = tmp_path / "run"
    _fleet_info(ca_file=str(files.ca_pem)).save(run_dir)
    runner = CliRunner()
    result = runner.invoke(main, ["pair-code", "--run-dir", str(run_dir), "--ttl", "90s", "--tier", "0.5"])
    assert result.exit_code == 0, result.output
    fingerprint = certificate_fingerprint(files.ca_pem.read_text())
    match = re.search(
        r"fedsdk pair --server mqtts://server.lan:8883 --ca-fingerprint (\S+) --code (\S+)", result.output
    )
    assert match and match.group(1) == fingerprint
    claim = PairCodes(FleetRegistry(run_dir / "registry.sqlite"), run_dir).claim(match.group(2), "c")
    assert claim.tier == "0.5"
    result = runner.invoke(main, ["pair-code", "--run-dir", str(run_dir), "--tier", "huge"])
    assert result.exit_code == 1 and "not one of the fleet's tiers: 1.0, 0.5, 0.25" in result.output
    result = runner.invoke(main, ["pair-code", "--run-dir", str(run_dir), "--ttl", "soon"])
    assert result.exit_code == 2 and "not a duration" in result.output
    result = runner.invoke(main, ["pair-code", "--run-dir", str(tmp_path / "never-served")])
    assert result.exit_code == 1 and "has not served yet" in result.output
    plain = runner.invoke(main, ["pair-code", "--run-dir", str(run_dir), "--server", "mqtt://10.1.1.1:1883"])
    assert plain.exit_code == 0 and "--insecure" in plain.output


def test_pair_code_warns_when_the_server_is_not_running(tmp_path):
    run_dir = tmp_path / "run"
    info = _fleet_info(url="mqtt://127.0.0.1:1883")
    info.server_pid = 2**22 + 12345  # no such process
    info.save(run_dir)
    result = CliRunner().invoke(main, ["pair-code", "--run-dir", str(run_dir)])
    assert result.exit_code == 0
    assert "is not running" in result.output and "127.0.0.1 is this machine" in result.output


def test_devices_show_retier_and_revoke(tmp_path, monkeypatch):
    monkeypatch.setattr(registry_module, "KNOWN_REFRESH_S", 0.0)  # see other processes' writes at once
    run_dir = tmp_path / "run"
    _fleet_info().save(run_dir)
    registry = FleetRegistry(run_dir / "registry.sqlite")
    registry.register_paired(
        "pi", "pi", "0.25", PROFILE, {"mode": "manual", "tier": "0.25", "note": "test"}, "h"
    )
    runner = CliRunner()
    result = runner.invoke(main, ["devices", "retier", "--run-dir", str(run_dir), "pi", "auto"])
    assert result.exit_code == 0, result.output
    # 500 samples, 5 epochs, batch 16 = 160 steps; 400 ms on the full model -> 64 s > 30 s budget
    assert registry.tier_of("pi") == "0.5" and "tier 1.0 would not fit (time)" in result.output
    shown = runner.invoke(main, ["devices", "show", "--run-dir", str(run_dir), "pi"])
    assert shown.exit_code == 0
    for text in ("Raspberry Pi 4 Model B", "tier decision (auto)", "400.0", "no: time", "0.5 ←",
                 "scaled from tier 1.0"):
        assert text in shown.output, text
    result = runner.invoke(main, ["devices", "retier", "--run-dir", str(run_dir), "pi", "0.3"])
    assert result.exit_code == 1 and "not one of the fleet's tiers" in result.output
    assert runner.invoke(main, ["devices", "retier", "--run-dir", str(run_dir), "pi", "1.0"]).exit_code == 0
    assert registry.tier_of("pi") == "1.0"
    result = runner.invoke(main, ["devices", "revoke", "--run-dir", str(run_dir), "pi"])
    assert result.exit_code == 0 and "no broker security directory" in result.output
    time.sleep(0.01)
    assert FleetRegistry(run_dir / "registry.sqlite").device("pi")["revoked"] == 1
    assert runner.invoke(main, ["devices", "show", "--run-dir", str(run_dir), "ghost"]).exit_code == 1


def test_the_running_server_takes_tiers_and_revocations_from_the_registry(tmp_path, monkeypatch):
    from server_toolkit.methods.base import DeviceInfo
    from server_toolkit.rounds.mqtt_grid import MqttGrid

    monkeypatch.setattr(registry_module, "KNOWN_REFRESH_S", 0.0)
    registry = FleetRegistry(tmp_path / "registry.sqlite")
    for dev in ("a", "b"):
        registry.add_device(dev, tier="1.0")
    grid = MqttGrid(None, registry)
    grid.devices = {dev: DeviceInfo(dev, 10, "1.0") for dev in ("a", "b")}  # as at their hello
    other_process = FleetRegistry(tmp_path / "registry.sqlite")  # `fedsdk-server devices …`
    other_process.set_tier("a", "0.25", {"mode": "manual"})
    other_process.revoke("b")
    assert grid.online() == [DeviceInfo("a", 10, "0.25")]
    grid.close()
