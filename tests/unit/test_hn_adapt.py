"""``fedsdk-server hn adapt``: a new device joins a trained hypernetwork, which stays frozen."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from safetensors.numpy import load_file, save_file

from fedcore.recipe import Recipe
from sdk_device.data.npz import save_npz
from server_toolkit.cli import main
from server_toolkit.cli.hn import adapt_run, load_hypernet_run
from server_toolkit.data.datasets import load_dataset
from server_toolkit.fleet.registry import FleetRegistry
from server_toolkit.methods.base import DeviceInfo
from server_toolkit.methods.fedavg import FedAvg
from server_toolkit.methods.hypernet.mh_pfedhn import MHPFedHN
from server_toolkit.models.architectures import architecture
from server_toolkit.models.zoo import model_spec
from server_toolkit.rounds.checkpoint import save_checkpoint
from server_toolkit.sim.personalized import PersonalDevice, run_personalized

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SPEC = model_spec("lenet", (1, 8, 8), 10)


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", seed=0)


@pytest.fixture
def run_dir(tmp_path, digits):
    """A 2-round mh-pfedhn run of two lenet devices, checkpointed like the orchestrator does."""
    method = MHPFedHN(SPEC, Recipe(), client_lr=0.05, client_batch_size=16, client_epochs=1)
    devices = [PersonalDevice(DeviceInfo(f"d{i}", 100, "lenet"), digits.x_train[i * 100:(i + 1) * 100],
                              digits.y_train[i * 100:(i + 1) * 100], digits.x_test[:20], digits.y_test[:20])
               for i in range(2)]
    captured = {}
    original = method.aggregate_train

    def keep(rnd, weights, updates):
        captured["weights"] = original(rnd, weights, updates)
        return captured["weights"]

    method.aggregate_train = keep
    run_personalized(method, devices, rounds=2)
    state = {"method_state": method.state_dict(), "method": method.name}
    save_checkpoint(tmp_path, 2, captured["weights"], state)
    FleetRegistry(tmp_path / "registry.sqlite").close()
    return tmp_path


def test_a_run_saved_under_the_old_method_id_still_loads(run_dir):
    state = json.loads((run_dir / "state.json").read_text())
    (run_dir / "state.json").write_text(json.dumps(state | {"method": "mh_pfedhn"}))  # before kebab-case ids
    method, rnd, _ = load_hypernet_run(run_dir)
    assert isinstance(method, MHPFedHN) and method.name == "mh-pfedhn" and rnd == 2


def hn_tensors(run_dir):
    state = json.loads((run_dir / "state.json").read_text())
    return state, load_file(str(run_dir / "checkpoints" / state["checkpoint"]))


def test_adapt_from_data_learns_only_the_new_embedding_and_a_new_head(run_dir, digits, tmp_path):
    _, before = hn_tensors(run_dir)
    data = tmp_path / "new.npz"
    save_npz(data, digits.x_train[300:400], digits.y_train[300:400])
    export = tmp_path / "mlp.safetensors"
    result = CliRunner().invoke(main, ["hn", "adapt", "--run-dir", str(run_dir), "--device-id", "newbie",
                                       "--tier", "mlp", "--data", str(data), "--steps", "3",
                                       "--export", str(export)])
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())  # rich wraps long lines
    assert "a new head" in output and "held-out accuracy of its generated model" in output
    state, after = hn_tensors(run_dir)
    assert state["checkpoint"] == "global_r0002_adapt_newbie.safetensors" and state["round"] == 2
    clients = {c["device_id"]: c for c in state["method_state"]["clients"]}
    assert clients["newbie"]["head"] == "tau6" and clients["newbie"]["tier"] == "mlp"
    for name, value in before.items():  # frozen: every tensor of the trained hypernetwork is unchanged
        np.testing.assert_array_equal(after[name], value)
    new = set(after) - set(before)
    embedding = f"hn.embeddings.{clients['newbie']['embedding']}"
    assert new == {embedding, "hn.heads.tau6.weight", "hn.heads.tau6.bias"}
    assert not np.array_equal(after["hn.heads.tau6.bias"], load_fresh_head_bias())  # the new head did learn
    exported = load_file(str(export))
    assert sum(v.size for v in exported.values()) == architecture("mlp", (1, 8, 8), 10).num_params
    registry = FleetRegistry(run_dir / "registry.sqlite")
    assert registry.device("newbie")["tier"] == "mlp"
    registry.close()


def load_fresh_head_bias():
    method = MHPFedHN(SPEC, Recipe())
    method.initial_weights(0)
    method.add_client("x", "mlp")
    return method.hypernet.heads["tau6"].bias.detach().numpy()


def test_adapt_to_trained_weights_of_a_seen_architecture_keeps_the_shared_head(run_dir, tmp_path):
    _, before = hn_tensors(run_dir)
    arch = architecture("lenet", (1, 8, 8), 10)
    target = {name: np.full(shape, 0.01, np.float32) for name, shape in arch.parameters}
    weights = tmp_path / "trained.safetensors"
    save_file(target, str(weights))
    distances = []
    summary = adapt_run(run_dir, "d9", "lenet", weights_path=weights, steps=30, lr=0.01,
                        on_step=lambda step, d: distances.append(d))
    assert summary["new_head"] is False and summary["trained_parameters"] == 9 * 64
    assert distances[-1] < distances[0]
    _, after = hn_tensors(run_dir)
    assert set(after) - set(before) == {"hn.embeddings.e2"}
    assert all(np.array_equal(after[k], v) for k, v in before.items())


def test_adapt_rejects_bad_input_and_loses_nothing(run_dir, tmp_path):
    state_before = (run_dir / "state.json").read_text()
    arch = architecture("lenet", (1, 8, 8), 10)
    wrong = tmp_path / "wrong.safetensors"
    save_file({name: np.zeros((2, 2), np.float32) for name, _ in arch.parameters}, str(wrong))
    cases = [
        (["--device-id", "d0", "--tier", "lenet", "--weights", str(wrong)], "already"),
        (["--device-id", "x1", "--tier", "resnet50", "--weights", str(wrong)], "names no architecture"),
        (["--device-id", "x1", "--tier", "lenet", "--weights", str(wrong)], "does not fit"),
        (["--device-id", "x1", "--tier", "lenet"], "exactly one of"),
        (["--device-id", "bad/id", "--tier", "lenet", "--weights", str(wrong)], "invalid device id"),
    ]
    for args, message in cases:
        result = CliRunner().invoke(main, ["hn", "adapt", "--run-dir", str(run_dir), *args])
        assert result.exit_code != 0 and message in " ".join(result.output.split()), (args, result.output)
    assert (run_dir / "state.json").read_text() == state_before


def test_adapt_refuses_runs_without_a_hypernetwork(tmp_path):
    FedAvg(SPEC, Recipe())
    save_checkpoint(tmp_path, 1, {"w": np.zeros(2, np.float32)}, {"method_state": {}, "method": "fedavg"})
    result = CliRunner().invoke(main, ["hn", "adapt", "--run-dir", str(tmp_path), "--device-id", "x",
                                       "--tier", "lenet", "--weights", str(tmp_path / "state.json")])
    assert result.exit_code != 0 and "has no hypernetwork" in result.output
    empty = tmp_path / "empty"
    empty.mkdir()
    result = CliRunner().invoke(main, ["hn", "adapt", "--run-dir", str(empty), "--device-id", "x",
                                       "--tier", "lenet", "--weights", str(tmp_path / "state.json")])
    assert result.exit_code != 0 and "no checkpoint" in result.output
