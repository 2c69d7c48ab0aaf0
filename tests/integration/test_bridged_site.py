"""An edge site: devices on a site mosquitto bridged to the central mosquitto, the server on
the central one (two real brokers, real device agents).

Rounds complete with the site's devices (tasks, blob pulls and results cross the bridge
both ways); the server's retained status reached the site; a device killed at the site is
reported offline to the server by its will, which the site broker publishes and the bridge
forwards.
"""

from __future__ import annotations

import signal
import time

import pytest

from fedcore.recipe import Recipe
from server_toolkit.broker.bridge import bridge_config
from server_toolkit.broker.mosquitto import MosquittoBroker
from server_toolkit.methods.fedavg import FedAvg
from server_toolkit.models.zoo import model_spec
from server_toolkit.sim.simulate import start_device_process

from .harness import Fleet

pytestmark = pytest.mark.integration


def test_devices_on_a_bridged_site_broker_complete_rounds_and_their_wills_cross(mosquitto, tmp_path):
    fleet = Fleet(mosquitto.address, tmp_path)  # the server, on the central broker
    site = MosquittoBroker(workdir=tmp_path / "site",
                           extra_config=bridge_config("site-1", mosquitto.url, [fleet.fleet])).start()
    devices = ["dev0", "dev1"]
    try:
        for dev, path in fleet.write_data(devices, "iid").items():
            fleet.registry.add_device(dev)
            fleet.procs.append(start_device_process(site.url, fleet.fleet, dev, path, tmp_path / dev / "work",
                                                    tmp_path / f"{dev}.log"))
        spec = model_spec("small_cnn", fleet.data.input_shape, fleet.data.num_classes)
        method = FedAvg(spec, Recipe(epochs=1, batch_size=16, lr=0.05))
        loop = fleet.server(rounds=2, method=method, round_timeout_s=120)
        loop.start()
        assert loop.grid.wait_for_devices(2, timeout_s=120) == 2
        rows = loop.run()
        assert [(r["round"], r["accepted"], r["rejected"]) for r in rows] == [(1, 2, 0), (2, 2, 0)]
        assert rows[-1]["accuracy"] > 0.5
        log = (tmp_path / "dev0.log").read_text()
        assert "server is online" in log or "server epoch" in log  # the retained status crossed
        fleet.procs[0].send_signal(signal.SIGKILL)  # dev0 dies at the site
        deadline = time.monotonic() + 30
        while "dev0" in loop.grid.devices and time.monotonic() < deadline:
            loop.grid.poll(0.2)
        assert "dev0" not in loop.grid.devices and "dev1" in loop.grid.devices
        assert fleet.registry.device("dev0")["status"] == "offline"
    finally:
        fleet.close()
        site.stop()
