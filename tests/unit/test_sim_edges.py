"""How simulate --edges N maps tiers and devices to edges."""

from __future__ import annotations

import pytest

from server_toolkit.sim.edges import plan_edges

DEVICES = {f"dev{i:03d}": ["1.0", "0.75", "0.5", "0.25"][i % 4] for i in range(8)}


def groups(plan):
    return {g.edge_id: (g.tier, list(g.device_ids)) for g in plan[0]}


def test_one_edge_per_tier():
    plan = plan_edges(DEVICES, ["1.0", "0.75", "0.5", "0.25"], 4)
    assert groups(plan) == {"edge-1": ("1.0", ["dev000", "dev004"]), "edge-2": ("0.75", ["dev001", "dev005"]),
                            "edge-3": ("0.5", ["dev002", "dev006"]), "edge-4": ("0.25", ["dev003", "dev007"])}
    assert plan[1] == []


def test_fewer_edges_than_tiers_leaves_direct_devices():
    plan = plan_edges(DEVICES, ["1.0", "0.75", "0.5", "0.25"], 2)
    assert set(groups(plan)) == {"edge-1", "edge-2"}
    assert plan[1] == ["dev002", "dev003", "dev006", "dev007"]  # tiers 0.5 and 0.25 talk to the server


def test_more_edges_than_tiers_split_a_tier():
    tiers = {f"dev{i}": ["a", "b"][i % 2] for i in range(6)}
    plan = plan_edges(tiers, ["a", "b"], 3)
    assert groups(plan) == {"edge-1": ("a", ["dev0", "dev4"]), "edge-2": ("b", ["dev1", "dev3", "dev5"]),
                            "edge-3": ("a", ["dev2"])}


def test_no_tiers_and_no_edges():
    untiered = dict.fromkeys(["d0", "d1", "d2"])
    assert groups(plan_edges(untiered, None, 2)) == {"edge-1": (None, ["d0", "d2"]), "edge-2": (None, ["d1"])}
    assert plan_edges(untiered, None, 0) == ([], ["d0", "d1", "d2"])
    assert groups(plan_edges({"d0": None}, None, 3)) == {"edge-1": (None, ["d0"])}  # empty edges not started
    with pytest.raises(ValueError):
        plan_edges(untiered, None, -1)
