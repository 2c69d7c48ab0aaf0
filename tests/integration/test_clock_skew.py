"""Devices whose clocks are an hour off (fast and slow) train normally and their updates are
accepted: the server stamps each task with its time (``server_time``) and a device reads the
deadline as a duration from it (docs/protocol.md §9.6). The offset is injected with the
``FEDSDK_CLOCK_OFFSET_S`` test hook (sdk_device/protocol/clock.py)."""

from __future__ import annotations

import pytest

from sdk_device.protocol.clock import OFFSET_ENV

from .harness import Fleet

pytestmark = pytest.mark.integration


def test_devices_an_hour_fast_and_an_hour_slow_train_and_are_accepted(mosquitto, tmp_path, monkeypatch):
    fleet = Fleet(mosquitto.address, tmp_path)
    offsets = {"fast-clock": "3600", "slow-clock": "-3600"}
    try:
        for dev, path in fleet.write_data(list(offsets), "iid").items():
            monkeypatch.setenv(OFFSET_ENV, offsets[dev])  # read by the process started now
            fleet.start_process(dev, path)
        monkeypatch.delenv(OFFSET_ENV)
        loop = fleet.server(rounds=2, round_timeout_s=120)
        loop.start()
        assert loop.grid.wait_for_devices(2, timeout_s=120) == 2
        rows = loop.run()
    finally:
        fleet.close()
    assert [(r["accepted"], r["rejected"]) for r in rows] == [(2, 0), (2, 0)], rows
    assert {u["device_id"] for u in fleet.registry.updates(2)} == set(offsets)
    for dev in offsets:
        log = (tmp_path / f"{dev}.log").read_text()
        assert "deadline_passed" not in log and "after its deadline" not in log
