"""Bundle edges over a real mosquitto: FedDM (similarity tree on) with a generic edge whose
group mixes three widths, beside a device talking to the server directly.

    server ── dev3 (0.5)
          └── edge-a (EdgeAggregator, --method feddm) ── dev0 (1.0), dev1 (0.5), dev2 (0.25)

FedDM is not a sum, so the server plans every member itself and sends edge-a one bundle task;
edge-a relays each member's task and forwards each update. Checked: the round completes with
four updates, each member trained the sub-model the server planned for it, the edge forwarded
the members' weights bit for bit, and the server's model is FedDM's aggregate of the four.
A second test plays an edge (its protocol by hand) that answers for a member with the wrong
shapes: the server refuses that result with the reason, and takes the corrected one. A third
runs ``simulate --edges 2 --method feddm`` (real edge and device processes).
"""

from __future__ import annotations

import dataclasses
import json
import queue
import threading
import time

import numpy as np
import pytest

from fedcore.recipe import Recipe
from sdk_device.agent import DeviceAgent
from sdk_device.protocol import messages as msgs
from sdk_device.protocol.blobs import decode_tensors, encode_tensors
from sdk_device.protocol.topics import FleetTopics
from sdk_device.transport.blob_store import BlobStore
from sdk_device.transport.endpoint import SERVER, Endpoint
from server_toolkit.edge.aggregator import EdgeAggregator, EdgeConfig
from server_toolkit.edge.bundle import unpack
from server_toolkit.fleet.registry import FleetRegistry
from server_toolkit.methods.base import ClientUpdate
from server_toolkit.methods.width.feddm import FedDM
from server_toolkit.models.zoo import model_spec
from server_toolkit.rounds.checkpoint import load_checkpoint
from server_toolkit.rounds.loop import task_seed
from server_toolkit.sim.simulate import Simulation, SimulationConfig

from .harness import Fleet, device_updates

pytestmark = pytest.mark.integration

TIERS = {"dev0": "1.0", "dev1": "0.5", "dev2": "0.25", "dev3": "0.5"}


def test_feddm_rounds_complete_with_a_bundle_edge_of_three_widths(mosquitto, tmp_path):
    fleet = Fleet(mosquitto.address, tmp_path, fleet="lab")
    paths = fleet.write_data(list(TIERS))
    members = ("dev0", "dev1", "dev2")
    registry = FleetRegistry(tmp_path / "edge-a" / "registry.sqlite")
    for dev in members:
        registry.add_device(dev, tier=TIERS[dev])
    registry.close()
    edge = EdgeAggregator(EdgeConfig(mosquitto.url, "lab", "edge-a", tmp_path / "edge-a", method="feddm",
                                     min_devices=3, devices_wait_s=60, heartbeat_s=1.0))
    edge_thread = threading.Thread(target=edge.run, daemon=True)
    try:
        fleet.registry.add_device("edge-a")
        fleet.registry.add_device("dev3", tier="0.5")
        for dev, path in paths.items():  # real agents, as threads (one process: fast to start)
            config = fleet.agent_config(dev, path)
            fleet.start_thread(DeviceAgent(dataclasses.replace(
                config, fleet="lab.edge-a" if dev in members else "lab")), register=False)
        edge_thread.start()
        spec = model_spec("small_cnn", fleet.data.input_shape, fleet.data.num_classes)
        method = FedDM(spec, Recipe(epochs=1, batch_size=16, lr=0.05), reference_size=16)
        loop = fleet.server(rounds=1, method=method, round_timeout_s=120)
        loop.start()
        start = dict(loop.global_weights)
        assert loop.grid.wait_for_devices(2, timeout_s=120) == 2
        rows = loop.run()
        loop.grid.close()
    finally:
        edge.stop()
        edge_thread.join(timeout=10)
        fleet.close()
    assert [(r["accepted"], r["rejected"]) for r in rows] == [(4, 0)], rows
    server_run = tmp_path / "server"
    received = unpack(_server_updates(server_run, 1))
    assert {u.device_id: u.instruction.context["ratio"] for u in received} == {
        "dev0": 1.0, "dev1": 0.5, "dev2": 0.25, "dev3": 0.5}
    at_edge = {u.device_id: u for u in device_updates(tmp_path / "edge-a", 1)}
    assert sorted(at_edge) == ["dev0", "dev1", "dev2"]
    for update in received:
        if update.device_id in at_edge:  # forwarded unchanged, answering the task the server planned
            edge_side = at_edge[update.device_id]
            assert all(np.array_equal(update.weights[k], edge_side.weights[k]) for k in update.weights)
            assert all(np.array_equal(update.instruction.weights[k], edge_side.instruction.weights[k])
                       for k in update.instruction.weights)
            assert isinstance(update.metrics.get("label_counts"), list)
            assert edge_side.instruction.recipe.seed == task_seed(0, 1, update.device_id)  # the flat run's
    state = json.loads((server_run / "state.json").read_text())["method_state"]
    assert sorted(d for devs in state["slots"].values() for d in devs) == sorted(TIERS)
    assert sorted(state["personal"]) == sorted(TIERS)  # the similarity tree saw every device
    _, served, _ = load_checkpoint(server_run)
    assert any(not np.allclose(served[n], start[n]) for n in start)  # the rounds moved the model


def _server_updates(run_dir, rnd: int) -> list[ClientUpdate]:
    """The server's accepted updates of round ``rnd`` with every returned record (as the grid
    loads them: ``metrics["arrays"]`` names the blobs of the records besides ``model``)."""
    store = BlobStore(run_dir / "blobs")
    out = []
    for update in sorted(device_updates(run_dir, rnd), key=lambda u: u.device_id):
        blobs = update.metrics.get("arrays", {})
        others = {name: decode_tensors(store.get(blob)) for name, blob in blobs.items()}
        out.append(dataclasses.replace(update, others=others))
    return out


def _fake_edge(mosquitto, tmp_path) -> Endpoint:
    """An edge speaking the protocol by hand: hello with two members."""
    up = Endpoint(mosquitto.address, FleetTopics("lab"), BlobStore(tmp_path / "fake" / "blobs"),
                  device_id="edge-x").start()
    members = [{"device_id": d, "num_samples": 100, "tier": TIERS[d], "runtimes": ["torch"], "profile": {}}
               for d in ("dev0", "dev1")]
    up.send(SERVER, msgs.Hello(device_id="edge-x", runtimes=["torch"], num_samples=200, profile={
        "role": "edge", "aggregates": "updates", "members": members}))
    return up


def _next(up: Endpoint, kind: type, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            incoming = up.inbox.get(timeout=0.2)
        except queue.Empty:
            continue
        if isinstance(incoming.message, kind):
            return incoming.message
    raise AssertionError(f"no {kind.__name__} within {timeout_s} s")


def test_an_edge_answering_for_a_member_with_wrong_shapes_is_refused_with_the_reason(mosquitto, tmp_path):
    fleet = Fleet(mosquitto.address, tmp_path, fleet="lab")
    fleet.registry.add_device("edge-x")
    up = _fake_edge(mosquitto, tmp_path)
    try:
        spec = model_spec("small_cnn", fleet.data.input_shape, fleet.data.num_classes)
        loop = fleet.server(rounds=1, method=FedDM(spec, Recipe(epochs=1)), round_timeout_s=20)
        loop.start()
        assert loop.grid.wait_for_devices(1, timeout_s=30) == 1
        result: dict = {}

        def answer() -> None:
            task = _next(up, msgs.Task)
            assert set(task.config["members"]) == {"m0", "m1"}
            weights = decode_tensors(up.fetch(SERVER, task.arrays["m0"]))
            bad = {k: np.zeros((v.shape[0] + 1, *v.shape[1:]), v.dtype) for k, v in weights.items()}
            arrays = {"model": up.offer(SERVER, encode_tensors({}), "weights", "safetensors"),
                      "m0": up.offer(SERVER, encode_tensors(bad), "weights", "safetensors")}
            up.send(SERVER, msgs.Result(task_id=task.task_id, round=task.round, arrays=arrays,
                                        metrics={"samples": 100, "members": {"m0": {"samples": 100}}}))
            result["error"] = _next(up, msgs.Error)
            # the same member, right shapes: the task was still open, this one counts
            good = {k: v + 0.01 for k, v in weights.items()}
            arrays["m0"] = up.offer(SERVER, encode_tensors(good), "weights", "safetensors")
            up.send(SERVER, msgs.Result(task_id=task.task_id, round=task.round, arrays=arrays,
                                        metrics={"samples": 100, "members": {"m0": {"samples": 100}}}))
            result["ack"] = _next(up, msgs.Ack)

        helper = threading.Thread(target=answer, daemon=True)
        helper.start()
        (row,) = loop.run()
        helper.join(timeout=30)
        loop.grid.close()
    finally:
        up.close()
        fleet.close()
    error = result["error"]
    assert error.code == "shape_mismatch" or "shape" in error.detail, error
    assert "ack" in result and row["accepted"] == 1 and row["rejected"] == 1, row


def test_simulate_with_edges_runs_feddm_through_bundle_edge_processes(mosquitto, tmp_path):
    """``simulate --edges 2 --method feddm``: real ``fedsdk-server edge`` processes and agents."""
    recipe = Recipe(epochs=1, batch_size=16, lr=0.05).to_dict()
    config = SimulationConfig(method="feddm", devices=4, rounds=1, tiers=["1.0", "0.5"], edges=2, seed=0,
                              recipe=recipe, device_runtime="torch", broker_url=mosquitto.url,
                              round_timeout_s=120, method_options={"reference_size": 16})
    run_dir = tmp_path / "run"
    (row,) = Simulation(config, run_dir).run().rows
    assert row["selected"] == 2 and row["accepted"] == 4 and row["rejected"] == 0, row  # 2 edges, 4 members
    state = json.loads((run_dir / "state.json").read_text())["method_state"]
    assert sorted(state["personal"]) == [f"dev{i:03d}" for i in range(4)]
