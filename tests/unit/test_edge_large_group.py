"""A generic edge with a site's worth of devices (bench/sites.py: 12,500 per edge): its hello
still fits in a control message, and its group rounds ask only --clients-per-round devices."""

from __future__ import annotations

import pytest

from sdk_device.protocol import messages as msgs
from sdk_device.protocol.errors import ProtocolError
from server_toolkit.edge.aggregator import EdgeAggregator, EdgeConfig
from server_toolkit.edge.bundle_relay import fit_members, hello_members
from server_toolkit.edge.fold import SUMS
from server_toolkit.fleet.registry import FleetRegistry
from server_toolkit.methods.base import DeviceInfo


def edge_hello(members: int) -> msgs.Hello:
    online = [DeviceInfo(f"swarm-{i:05d}", 100 + i, None) for i in range(members)]
    profile = {"role": "edge", "devices": members, "group_fleet": "scale.edge-1", "aggregates": SUMS,
               "method": "fedavg", "members": hello_members(online)}
    return msgs.Hello(device_id="edge-1", runtimes=["torch"], num_samples=sum(d.num_samples for d in online),
                      profile=profile)


def test_a_hello_whose_member_list_is_too_large_is_sent_without_it_and_fits():
    large = edge_hello(2_000)
    with pytest.raises(ProtocolError) as raised:  # as built, it could not be sent
        msgs.encode(large)
    assert raised.value.code == "too_large"
    sent = fit_members(large)
    assert "members" not in sent.profile
    assert sent.profile["devices"] == 2_000 and sent.profile["aggregates"] == SUMS
    assert sent.num_samples == large.num_samples
    assert len(msgs.encode(sent)) <= msgs.MAX_CONTROL_BYTES
    assert msgs.decode(msgs.encode(sent)).profile == sent.profile


def test_a_hello_whose_member_list_fits_keeps_it():
    small = edge_hello(3)
    assert fit_members(small) == small
    assert [m["device_id"] for m in fit_members(small).profile["members"]] == ["swarm-00000", "swarm-00001",
                                                                               "swarm-00002"]


def test_an_edge_group_round_asks_clients_per_round_of_its_online_devices(tmp_path):
    registry = FleetRegistry(tmp_path / "registry.sqlite")
    registry.add_device("d0")
    registry.close()
    edge = EdgeAggregator(EdgeConfig("mqtt://127.0.0.1:1", "f", "edge-1", tmp_path, method="fedavg",
                                     clients_per_round=3))
    edge.registry.close()
    online = [DeviceInfo(f"d{i}", 10, None) for i in range(10)]
    wanted = edge.group._wanted(len(online))
    chosen = edge.group._select(online, wanted, set())
    assert wanted == 3 and len(chosen) == 3 and len({d.device_id for d in chosen}) == 3
    every = EdgeAggregator(EdgeConfig("mqtt://127.0.0.1:1", "f", "edge-1", tmp_path, method="fedavg"))
    every.registry.close()
    assert every.group._wanted(len(online)) is None  # the default: every online device

