"""`fedsdk run --only-when charging` over a real mosquitto: a device on battery refuses its
round-1 task with the code `policy` (the server counts it), and trains in round 2 once its
(fake) power supply is online again."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from .harness import Fleet

pytestmark = pytest.mark.integration


def power_supply(root, ac_online: bool) -> None:
    """A fake laptop power supply tree under ``root``: mains adapter and a discharging battery."""
    for name, files in {"AC": {"type": "Mains", "online": "1" if ac_online else "0"},
                        "BAT0": {"type": "Battery", "status": "Discharging"}}.items():
        folder = root / "sys/class/power_supply" / name
        folder.mkdir(parents=True, exist_ok=True)
        for file, text in files.items():
            (folder / file).write_text(text + "\n")


def test_a_device_refused_by_policy_in_round_one_is_asked_again_and_trains_in_round_two(mosquitto, tmp_path):
    fleet = Fleet(mosquitto.address, tmp_path)
    sysfs = tmp_path / "fake-root"
    power_supply(sysfs, ac_online=False)
    paths = fleet.write_data(["always", "charger"], "iid")
    fleet.start_process("always", paths["always"])
    fleet.registry.add_device("charger")
    with open(tmp_path / "charger.log", "ab") as log:
        fleet.procs.append(subprocess.Popen(
            [sys.executable, "-m", "sdk_device.cli", "run", "--broker", mosquitto.address.url, "--fleet",
             fleet.fleet, "--device-id", "charger", "--data", str(paths["charger"]), "--work-dir",
             str(tmp_path / "charger" / "work"), "--only-when", "charging", "--policy-root", str(sysfs)],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"}))

    def plug_in(row: dict) -> None:
        if row["round"] == 1:
            power_supply(sysfs, ac_online=True)

    try:
        loop = fleet.server(rounds=2, round_timeout_s=120)
        loop.on_round = plug_in
        loop.start()
        assert loop.grid.wait_for_devices(2, timeout_s=120) == 2
        rows = loop.run()
    finally:
        fleet.close()
    assert [(r["selected"], r["accepted"], r["refused_policy"]) for r in rows] == [(2, 1, 1), (2, 2, 0)], rows
    refusal, = fleet.registry.rejections(1)
    assert refusal["device_id"] == "charger" and refusal["code"] == "device:policy"
    assert "not charging (BAT0: Discharging)" in refusal["detail"]
    assert sorted(u["device_id"] for u in fleet.registry.updates(1)) == ["always"]
    assert sorted(u["device_id"] for u in fleet.registry.updates(2)) == ["always", "charger"]
