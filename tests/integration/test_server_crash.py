"""A server that dies mid-round resumes from its checkpoint and its persisted updates."""

from __future__ import annotations

import numpy as np
import pytest

from sdk_device.protocol.topics import FleetTopics
from sdk_device.transport.blob_store import BlobStore
from sdk_device.transport.endpoint import Endpoint
from server_toolkit.rounds.checkpoint import load_checkpoint

from .harness import Fleet

pytestmark = pytest.mark.integration


class Crash(Exception):
    pass


def test_resume_uses_updates_accepted_before_the_crash(mosquitto, tmp_path):
    fleet = Fleet(mosquitto.address, tmp_path)
    devices = ["a", "b", "c"]
    run_dir = tmp_path / "server"
    try:
        for dev, path in fleet.write_data(devices, "iid").items():
            fleet.start_process(dev, path)
        first = fleet.server(rounds=2, run_dir=run_dir)
        first.start()
        assert first.grid.wait_for_devices(3, timeout_s=120) == 3
        first.run_round(1)

        def crash(*args):
            raise Crash("server died after accepting every update of round 2")

        first.method.aggregate_train = crash
        with pytest.raises(Crash):
            first.run_round(2)
        first.grid.close()
        fleet.endpoint.close()
        accepted_before = {u["task_id"] for u in fleet.registry.updates(2)}
        assert len(accepted_before) == 3  # persisted (and acknowledged) before the crash
        round1_weights = load_checkpoint(run_dir)[1]

        # A new server process: same run directory, same registry, a new connection.
        fleet.endpoint = Endpoint(fleet.broker, FleetTopics(fleet.fleet), BlobStore(run_dir / "blobs"),
                                  is_known_peer=fleet.registry.is_known).start()
        second = fleet.server(rounds=2, run_dir=run_dir)
        second.start(resume=True)
        assert second.completed_round == 1
        rows = second.run()
    finally:
        fleet.close()
    assert [r["round"] for r in rows] == [2]
    assert rows[0]["accepted"] == 3
    assert {u["task_id"] for u in fleet.registry.updates(2)} == accepted_before  # no task re-sent
    round2 = load_checkpoint(run_dir)
    assert round2[0] == 2
    assert any(not np.array_equal(round2[1][k], round1_weights[k]) for k in round1_weights)
    assert rows[0]["accuracy"] > 0.8
