"""Torch-free devices behind an edge: the edge exports its group's ``pte/1`` programs.

``simulate --edges 1 --programs pte/1 --device-runtime executorch-native`` (FedAvg, small_cnn on
digits) over a real mosquitto: a real ``fedsdk-server edge --programs pte/1 --pte-kernels fused``
process serves two real ``fedsdk run`` device processes on the native ExecuTorch runtime. The
devices are "old runtimes" (their kernels library path leads nowhere, ``FEDSDK_KERNELS_LIB``), so
each refuses the edge's fused program once with ``unsupported_kernels`` and the edge's grid falls
back to the portable program for it (``rounds/kernel_fallback.py``), in the same group round;
both server rounds complete with the edge's partial and the model learns.
"""

from __future__ import annotations

import pytest

from fedcore.recipe import Recipe
from server_toolkit.fleet.registry import FleetRegistry
from server_toolkit.sim.simulate import Simulation, SimulationConfig

pytestmark = pytest.mark.integration

ACCURACY = 0.3  # digits, 2 devices, 2 rounds of 2 epochs


def test_torch_free_devices_train_behind_an_edge_that_exports_pte_programs_and_falls_back_to_portable(
        mosquitto, tmp_path, monkeypatch):
    monkeypatch.setenv("FEDSDK_KERNELS_LIB", str(tmp_path / "no-such-libfedsdk_kernels.so"))
    config = SimulationConfig(method="fedavg", devices=2, rounds=2, edges=1, partition="iid", seed=0,
                              recipe=Recipe(epochs=2, batch_size=16, lr=0.05, momentum=0.9).to_dict(),
                              round_timeout_s=90.0, broker_url=mosquitto.url, fleet="lab",
                              program_formats=["pte/1"], pte_kernels="fused",
                              device_runtime="executorch-native")
    run_dir = tmp_path / "run"
    rows = Simulation(config, run_dir).run().rows
    assert [r["accepted"] for r in rows] == [1, 1], rows  # the edge's partial, each round
    assert rows[-1]["accuracy"] >= ACCURACY, rows
    registry = FleetRegistry(run_dir / "edges" / "edge-1" / "registry.sqlite")
    try:  # each device refused the fused program once, then trained portable ones
        refusals = sorted((r["device_id"], r["code"]) for r in registry.rejections())
        updates = [registry.updates(rnd) for rnd in (1, 2)]
    finally:
        registry.close()
    assert refusals == [("dev000", "device:unsupported_kernels"), ("dev001", "device:unsupported_kernels")]
    assert [len(u) for u in updates] == [2, 2], updates
    assert {u["metrics"].get("runtime") for rnd in updates for u in rnd} == {"executorch-native"}
