"""A generic edge exports its group's programs in its own formats and kernel set
(``fedsdk-server edge --programs … --pte-kernels …``), and ``simulate --edges`` passes its own
on to the edges it starts; FedConv's edge forwards the server's programs and refuses them."""

from __future__ import annotations

import pytest

from server_toolkit.edge.aggregator import EdgeAggregator, EdgeConfig
from server_toolkit.fleet.registry import FleetRegistry
from server_toolkit.secagg.mqtt_grid import SecAggMqttGrid
from server_toolkit.sim import edges as sim_edges
from server_toolkit.sim.edges import EdgeGroup
from server_toolkit.sim.simulate import Simulation, SimulationConfig

SECAGG = {"threshold": 0.5, "neighbours": None, "stage_timeout_s": 30.0}


def _edge(tmp_path, **options) -> EdgeAggregator:
    registry = FleetRegistry(tmp_path / "registry.sqlite")
    for dev in ("d0", "d1", "d2"):
        registry.add_device(dev)
    registry.close()
    edge = EdgeAggregator(EdgeConfig("mqtt://127.0.0.1:1", "f", "edge-1", tmp_path, method="fedavg",
                                     min_devices=3, **options))
    edge.registry.close()
    return edge


@pytest.mark.parametrize("secagg", [None, SECAGG], ids=["plain group", "secure group"])
def test_a_generic_edges_group_grid_exports_the_edges_program_formats_with_its_kernel_set(secagg, tmp_path):
    edge = _edge(tmp_path, program_formats=["pte/1"], pte_kernels="portable", secagg=secagg)
    assert edge.grid.programs.formats == ["pte/1"]
    assert edge.grid.programs.kernels == "portable"
    assert isinstance(edge.grid, SecAggMqttGrid) == (secagg is not None)


def test_a_generic_edge_offers_torchspec_programs_with_fused_pte_kernels_by_default(tmp_path):
    edge = _edge(tmp_path)
    assert edge.grid.programs.formats == ["torchspec/1"]
    assert edge.grid.programs.kernels == "fused"


def test_fedconvs_edge_refuses_program_formats_of_its_own_in_one_line(tmp_path):
    with pytest.raises(ValueError, match="FedConv's edge forwards the server's programs as received"):
        EdgeConfig("mqtt://127.0.0.1:1", "f", "edge-1", tmp_path, program_formats=["pte/1"])


def test_simulate_starts_its_edges_with_its_own_programs_and_kernel_set(tmp_path, monkeypatch):
    commands = []
    monkeypatch.setattr(sim_edges.subprocess, "Popen", lambda cmd, **kwargs: commands.append(cmd))
    config = SimulationConfig(method="fedavg", devices=6, edges=2, program_formats=["pte/1"],
                              pte_kernels="portable", fleet_timeout_s=900.0)
    simulation = Simulation(config, tmp_path)
    simulation.edges = [EdgeGroup("edge-1", None, ("dev000", "dev002")),
                        EdgeGroup("edge-2", None, ("dev001",))]
    simulation.generic_edges, simulation.edge_procs = True, []
    simulation.start_edges(type("Address", (), {"url": "mqtt://127.0.0.1:1"})())
    assert len(commands) == 2
    for cmd in commands:
        flags = dict(zip(cmd, cmd[1:], strict=False))
        assert flags["--programs"] == "pte/1" and flags["--pte-kernels"] == "portable"
        assert flags["--devices-wait"] == "900.0" and flags["--method"] == "fedavg"
