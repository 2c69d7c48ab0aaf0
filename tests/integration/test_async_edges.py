"""``--mode async`` behind generic edges over a real mosquitto, with device agent processes.

* Two levels beside direct devices (FedAvg on digits; the server's async loop and MQTT grid
  and the two ``EdgeAggregator``s in this process):

      server ── dev3, dev4
            └── edge-a ── dev0
                       └── edge-b ── dev1, dev2

  Versions complete; every metrics.jsonl row carries its version and staleness; edge-a's
  partials (three device updates each, two of them through edge-b) are folded and counted
  as three device updates; the accuracy rises.
* A bundle edge in async mode (FedAvgM, not a sum; agents and the edge as threads): its answer
  joins the buffer as its members' updates, each of the edge's base.
* ``simulate --edges 2 --mode async`` (edge processes, every device behind an edge): an
  edge killed with SIGKILL mid-run costs only its group: the other edge keeps making
  versions, long before the killed edge's task would have expired.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import threading
import time

import numpy as np
import pytest

from fedcore.recipe import Recipe
from sdk_device.agent import DeviceAgent
from server_toolkit.assembly import aggregation_stack
from server_toolkit.edge.aggregator import EdgeAggregator, EdgeConfig
from server_toolkit.fleet.registry import FleetRegistry
from server_toolkit.methods.fedavg import FedAvg
from server_toolkit.methods.fedavgm import FedAvgM
from server_toolkit.models.zoo import model_spec
from server_toolkit.report.run_report import RunReport
from server_toolkit.rounds.async_loop import AsyncConfig, AsyncLoop
from server_toolkit.rounds.loop import LoopConfig
from server_toolkit.rounds.mqtt_async import AsyncMqttGrid
from server_toolkit.sim.edges import EdgeGroup, register_group
from server_toolkit.sim.simulate import Simulation, SimulationConfig, start_device_process, stop_processes

from .harness import Fleet

pytestmark = pytest.mark.integration

RECIPE = Recipe(epochs=1, batch_size=16, lr=0.05, momentum=0.9)


def _start(fleet: Fleet, tmp_path, edges: dict[str, tuple[str, EdgeGroup]], direct: list[str],
           direct_slowdown: float = 1.0) -> list:
    """Edge aggregator threads (edge id -> (the fleet it joins, its group)) and every device's
    process, the direct ones ``direct_slowdown`` times slower; returns the processes and the edges."""
    where = {dev: fleet.fleet for dev in direct}
    aggregators = []
    for upper, group in edges.values():
        if upper == fleet.fleet:
            fleet.registry.add_device(group.edge_id)
        register_group(tmp_path / group.edge_id, group)
        config = EdgeConfig(fleet.broker.url, upper, group.edge_id, tmp_path / group.edge_id,
                            min_devices=len(group.device_ids), method="fedavg")
        aggregators.append(EdgeAggregator(config))
        threading.Thread(target=aggregators[-1].run, daemon=True).start()
        where.update({dev: group.group_fleet(upper) for dev in group.device_ids if dev not in edges})
    for dev in direct:
        fleet.registry.add_device(dev)
    paths = fleet.write_data(sorted(where))
    procs = [start_device_process(fleet.broker.url, where[dev], dev, path, tmp_path / dev / "work",
                                  tmp_path / f"{dev}.log", slowdown=direct_slowdown if dev in direct else 1.0)
             for dev, path in paths.items()]
    return procs, aggregators


def _loop(fleet: Fleet, tmp_path, versions: int, on_round) -> AsyncLoop:
    spec = model_spec("small_cnn", fleet.data.input_shape, fleet.data.num_classes)
    grid = AsyncMqttGrid(fleet.endpoint, fleet.registry)
    method, settings = FedAvg(spec, RECIPE), AsyncConfig(buffer=3, max_staleness=4)
    loop = AsyncLoop(method, grid, LoopConfig(rounds=versions, round_timeout_s=60, seed=0), settings,
                     run_dir=tmp_path / "server", test_data=(fleet.data.x_test, fleet.data.y_test),
                     on_round=on_round, aggregator=aggregation_stack(method, async_settings=settings))
    loop.start()
    return loop


def test_async_versions_fold_the_partials_of_two_levels_of_edges_beside_direct_devices(mosquitto, tmp_path):
    fleet = Fleet(mosquitto.address, tmp_path, fleet="lab")
    edges = {"edge-a": ("lab", EdgeGroup("edge-a", None, ("dev0", "edge-b"))),
             "edge-b": ("lab.edge-a", EdgeGroup("edge-b", None, ("dev1", "dev2")))}
    # the direct devices 5x slower, so that on a busy machine too edge-a (a group round through
    # two levels) answers several times before the direct devices alone make the 12 versions
    procs, aggregators = _start(fleet, tmp_path, edges, direct=["dev3", "dev4"], direct_slowdown=5.0)
    report = RunReport(tmp_path / "server")
    try:
        loop = _loop(fleet, tmp_path, versions=12, on_round=report.add_round)
        before = loop.evaluate_global(0)["accuracy"]
        assert loop.grid.wait_for_devices(3, timeout_s=60) == 3
        loop.run()
        loop.grid.close()
    finally:
        for aggregator in aggregators:
            aggregator.stop()
        stop_processes(procs)
        fleet.close()
    rows = [json.loads(line) for line in (tmp_path / "server" / "metrics.jsonl").read_text().splitlines()]
    assert [r["version"] for r in rows] == list(range(1, 13)) == [r["round"] for r in rows]
    for row in rows:  # counted in device updates: an edge-a partial is three
        assert row["accepted"] == row["folded"] + row["dropped_stale"] and row["folded"] >= 3, row
        assert 0 <= row["staleness_mean"] <= row["staleness_max"] <= 4, row
    assert sum(r["edge_results"] for r in rows) >= 2  # edge-a answered, more than once
    edge_updates = [u for rnd in range(1, 14) for u in fleet.registry.updates(rnd)
                    if u["device_id"] == "edge-a"]
    assert edge_updates and all(u["metrics"]["edge_devices"] == 3 for u in edge_updates)  # through edge-b
    assert all(u["num_samples"] > 600 for u in edge_updates)  # three devices' samples (5 x ~290 in all)
    assert rows[-1]["accuracy"] > max(before + 0.3, rows[0]["accuracy"]), (before, rows)


def test_a_bundle_edges_members_are_folded_in_async_mode(mosquitto, tmp_path):
    fleet = Fleet(mosquitto.address, tmp_path, fleet="lab")
    paths = fleet.write_data(["dev0", "dev1", "dev2"])
    register_group(tmp_path / "edge-a", EdgeGroup("edge-a", None, ("dev0", "dev1")))
    edge = EdgeAggregator(EdgeConfig(mosquitto.url, "lab", "edge-a", tmp_path / "edge-a", method="fedavgm",
                                     min_devices=2, devices_wait_s=60, heartbeat_s=1.0))
    fleet.registry.add_device("edge-a")
    fleet.registry.add_device("dev2")
    try:
        for dev, path in paths.items():  # real agents, as threads (one process: fast to start)
            where = "lab" if dev == "dev2" else "lab.edge-a"
            fleet.start_thread(DeviceAgent(dataclasses.replace(fleet.agent_config(dev, path), fleet=where)),
                               register=False)
        threading.Thread(target=edge.run, daemon=True).start()
        spec = model_spec("small_cnn", fleet.data.input_shape, fleet.data.num_classes)
        grid = AsyncMqttGrid(fleet.endpoint, fleet.registry)
        method, settings = FedAvgM(spec, RECIPE), AsyncConfig(buffer=2, max_staleness=4)
        loop = AsyncLoop(method, grid, LoopConfig(rounds=4, round_timeout_s=60, seed=0), settings,
                         run_dir=tmp_path / "server", test_data=(fleet.data.x_test, fleet.data.y_test),
                         aggregator=aggregation_stack(method, async_settings=settings))
        loop.start()
        start = dict(loop.global_weights)
        assert loop.grid.wait_for_devices(2, timeout_s=60) == 2
        rows = loop.run()
        loop.grid.close()
    finally:
        edge.stop()
        fleet.close()
    assert [r["version"] for r in rows] == [1, 2, 3, 4]
    assert all(r["accepted"] == r["folded"] + r["dropped_stale"] and r["edge_results"] == 0 for r in rows)
    accepted = sorted((u for rnd in range(1, 6) for u in fleet.registry.updates(rnd)), key=lambda u: u["id"])
    taken = [u["device_id"] for u in accepted[:loop.consumed]]  # what the loop took, in order
    assert taken.count("edge-a") >= 1  # a bundle was taken ...
    for update in (u for u in accepted if u["device_id"] == "edge-a"):
        assert set(update["metrics"]["members"]) == {"m0", "m1"}
    # ... and counted as its two members' updates
    assert sum(r["accepted"] for r in rows) == taken.count("dev2") + 2 * taken.count("edge-a")
    assert any(not np.allclose(loop.global_weights[k], start[k]) for k in start)


def test_a_killed_edge_costs_only_its_group_in_simulate_async_with_edges(mosquitto, tmp_path):
    """``simulate --edges 2 --mode async``: edge-1 is killed once a partial of it is folded;
    edge-2's group keeps making versions, not held for edge-1's task (time limit 60 s)."""
    config = SimulationConfig(method="fedavg", devices=3, rounds=6, edges=2, partition="iid",
                              recipe=RECIPE.to_dict(), round_timeout_s=60.0, broker_url=mosquitto.url,
                              fleet="lab", mode="async", buffer=2, max_staleness=4)
    sim = Simulation(config, tmp_path / "run")
    killed: list[tuple[int, float]] = []  # (version, when)

    def on_event(kind: str, row: dict) -> None:
        if kind == "round" and row["edge_results"] and not killed:
            sim.edge_procs[0].send_signal(signal.SIGKILL)  # edge-1
            sim.edge_procs[0].wait(timeout=10)
            killed.append((row["version"], time.monotonic()))

    sim.on_event = on_event
    rows = sim.run().rows
    ended = time.monotonic()
    assert killed, f"no edge partial was folded: {rows}"
    assert [r["version"] for r in rows] == list(range(1, 7))
    after = [r for r in rows if r["version"] > killed[0][0]]
    assert after and all(r["edge_results"] >= 2 and r["folded"] >= 2 for r in after), rows  # edge-2: 1 device
    assert ended - killed[0][1] < 30  # not held for the killed edge's task (60 s)
    registry = FleetRegistry(tmp_path / "run" / "registry.sqlite")
    try:
        late = [u["device_id"] for rnd in range(killed[0][0] + 2, 8) for u in registry.updates(rnd)]
    finally:
        registry.close()
    assert late and set(late) == {"edge-2"}  # tasks made after the kill: answered by edge-2 only
