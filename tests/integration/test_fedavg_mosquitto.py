"""Five device processes and the server over a real mosquitto: FedAvg on digits."""

from __future__ import annotations

import pytest

from .harness import Fleet

pytestmark = pytest.mark.integration


def test_five_devices_three_rounds_reach_90_percent(mosquitto, tmp_path):
    fleet = Fleet(mosquitto.address, tmp_path)
    devices = [f"dev{i}" for i in range(5)]
    try:
        for dev, path in fleet.write_data(devices, "iid").items():
            fleet.start_process(dev, path)
        loop = fleet.server(rounds=3, round_timeout_s=120)
        loop.start()
        assert loop.grid.wait_for_devices(5, timeout_s=120) == 5
        rows = loop.run()
    finally:
        fleet.close()
    assert [r["round"] for r in rows] == [1, 2, 3]
    assert all(r["accepted"] == 5 and r["rejected"] == 0 for r in rows)
    assert fleet.registry.count_updates() == 15  # every update persisted, one per device per round
    assert rows[-1]["accuracy"] >= 0.90, rows
    assert rows[-1]["accuracy"] > rows[0]["accuracy"] or rows[0]["accuracy"] >= 0.9
    # the devices reported real training metrics
    update = fleet.registry.updates(3)[0]
    assert update["metrics"]["runtime"] == "torch"
    assert update["metrics"]["peak_rss_mb"] > 10 and update["metrics"]["wall_time_s"] > 0
    # a checkpoint closes every round
    assert (tmp_path / "server" / "checkpoints" / "global_r0003.safetensors").is_file()
