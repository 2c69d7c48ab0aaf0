"""Edge aggregators in a simulation (``fedsdk-server simulate --edges N``).

How N edges and the tiers map: the distinct tiers, in the order ``--tiers`` names them
(one tier, ``None``, without ``--tiers``), are given to the edges round-robin: edge-1 gets
the first tier, edge-2 the second, … and edge-(T+1) the first again. Each edge manages the
devices of its tier only (FedConv: "each managing a group of clients with the same SR");
the devices of a tier with several edges are dealt round-robin among them. With fewer
edges than tiers, the devices of the tiers left without an edge talk to the server
directly, so one run mixes both paths. An edge whose tier has no device is not started.

That is for FedConv (``--method fedconv``), whose edges cluster one tier. With any other
method the edges are generic (``edge/sum_relay.py``): ``deal_edges`` deals every device
round-robin over the edges whatever its tier (dev i -> edge-(i mod N + 1)), so one edge
serves several tiers, and each edge runs the server's method (``--method``,
``--method-option``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ..edge.aggregator import default_group_fleet
from ..fleet.registry import FleetRegistry


@dataclass(frozen=True)
class EdgeGroup:
    """One edge: its device id in the server's fleet, its tier and its devices."""

    edge_id: str
    tier: str | None
    device_ids: tuple[str, ...]

    def group_fleet(self, fleet: str) -> str:
        return default_group_fleet(fleet, self.edge_id)


def plan_edges(device_tiers: dict[str, str | None], tier_order: list[str] | None,
               edges: int) -> tuple[list[EdgeGroup], list[str]]:
    """Split devices (id -> tier) over ``edges`` edges (see the module docstring);
    returns (the edges that have devices, the devices that talk to the server directly)."""
    if edges < 0:
        raise ValueError(f"--edges must be >= 0, got {edges}")
    if edges == 0:
        return [], list(device_tiers)
    tiers = list(dict.fromkeys(tier_order)) if tier_order else [None]
    edge_tiers = {f"edge-{k + 1}": tiers[k % len(tiers)] for k in range(edges)}
    members: dict[str, list[str]] = {e: [] for e in edge_tiers}
    direct = []
    dealt: dict[str | None, int] = {}
    for dev, tier in device_tiers.items():
        own = [e for e, t in edge_tiers.items() if t == tier]
        if not own:
            direct.append(dev)
            continue
        members[own[dealt.get(tier, 0) % len(own)]].append(dev)
        dealt[tier] = dealt.get(tier, 0) + 1
    groups = [EdgeGroup(e, edge_tiers[e], tuple(devs)) for e, devs in members.items() if devs]
    return groups, direct


def deal_edges(device_ids: list[str], edges: int) -> tuple[list[EdgeGroup], list[str]]:
    """Generic edges: device i goes to edge-(i mod ``edges`` + 1); no device talks to the
    server directly (``edges`` = 0: all of them do). Edges left without a device are not started."""
    if edges < 0:
        raise ValueError(f"--edges must be >= 0, got {edges}")
    if edges == 0:
        return [], list(device_ids)
    groups = [EdgeGroup(f"edge-{k + 1}", None, tuple(device_ids[k::edges])) for k in range(edges)]
    return [g for g in groups if g.device_ids], []


def register_group(edge_dir: Path, group: EdgeGroup, tiers: dict[str, str | None] | None = None) -> None:
    """Register the group's devices in the edge's own registry, each with its tier from
    ``tiers`` (device id -> tier) or else the edge's."""
    registry = FleetRegistry(edge_dir / "registry.sqlite")
    try:
        for dev in group.device_ids:
            registry.add_device(dev, tier=(tiers or {}).get(dev, group.tier))
    finally:
        registry.close()


def start_edge_process(broker_url: str, fleet: str, group: EdgeGroup, edge_dir: Path, seed: int = 0,
                       python: str | None = None, method: str | None = None,
                       method_options: dict | None = None, secagg: dict | None = None,
                       devices_wait_s: float = 120.0, programs: list[str] | None = None,
                       pte_kernels: str | None = None) -> subprocess.Popen:
    """Start ``fedsdk-server edge`` for ``group``; it waits for all its devices
    (``devices_wait_s`` at most: ``simulate`` passes its ``--fleet-timeout``, since devices that
    import torch on a loaded machine can take minutes) before joining the server's fleet.
    ``method``: a generic edge for it (with ``method_options``); None: FedConv's edge.
    ``secagg``: its group rounds are secure (``SecAggSettings`` as a dict;
    ``edge/secure_group.py``). ``programs`` / ``pte_kernels``: the program formats a generic edge
    exports for its group and their kernel set (``simulate``'s ``--programs`` / ``--pte-kernels``).
    Logs to ``<edge_dir>/edge.log``."""
    cmd = [python or sys.executable, "-m", "server_toolkit.cli", "-v", "edge", "--broker", broker_url,
           "--fleet", fleet, "--edge-id", group.edge_id, "--run-dir", str(edge_dir),
           "--min-devices", str(len(group.device_ids)), "--devices-wait", str(devices_wait_s),
           "--seed", str(seed)]
    if group.tier is not None:
        cmd += ["--tier", group.tier]
    if method is not None:
        cmd += ["--method", method]
        for key, value in (method_options or {}).items():
            cmd += ["--method-option", f"{key}={json.dumps(value)}"]
    if secagg is not None:
        cmd += ["--secagg", "--secagg-threshold", str(secagg["threshold"])]
        if secagg.get("neighbours") is not None:
            cmd += ["--secagg-neighbours", str(secagg["neighbours"])]
    if programs:
        cmd += ["--programs", ",".join(programs)]
    if pte_kernels is not None:
        cmd += ["--pte-kernels", pte_kernels]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    edge_dir.mkdir(parents=True, exist_ok=True)
    with open(edge_dir / "edge.log", "ab") as log_file:
        return subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env)
