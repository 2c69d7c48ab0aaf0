"""pFedHN / MH-pFedHN hypernetworks: sizes, loading, the update's sign, head sharing, state."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedcore.recipe import Recipe
from fedcore.torch_model import build_model
from server_toolkit.methods.base import ClientUpdate, DeviceInfo
from server_toolkit.methods.hypernet.mh_pfedhn import MHPFedHN
from server_toolkit.methods.hypernet.personal_hypernet import PersonalHypernet
from server_toolkit.methods.hypernet.pfedhn import PFedHN
from server_toolkit.models.zoo import model_spec

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SPEC = model_spec("lenet", (1, 8, 8), 10)
TIERS = ["lenet", "vgg8", "resnet10", "resnet12", "resnet18", "mlp"]


def method(cls=MHPFedHN, **options):
    m = cls(SPEC, Recipe(), **options)
    weights = m.initial_weights(0)
    return m, weights


def devices(tiers):
    return [DeviceInfo(f"d{i}", 50, tier) for i, tier in enumerate(tiers)]


@pytest.mark.parametrize("cls", [MHPFedHN, PFedHN])
def test_generated_vector_has_exactly_k_entries_and_loads_into_the_client_model(cls):
    m, weights = method(cls)
    for instruction in m.configure_train(1, weights, devices(TIERS)):
        client = m.clients[instruction.device_id]
        assert m.generate(client).shape == (client.num_params,)
        assert sum(v.size for v in instruction.weights.values()) == client.num_params
        model = build_model(instruction.spec, seed=0)
        missing, unexpected = model.load_state_dict(
            {k: torch.from_numpy(v) for k, v in instruction.weights.items()}, strict=False)
        assert unexpected == []
        assert all("running" in name or name.endswith("num_batches_tracked") for name in missing)
        for name, value in model.named_parameters():
            np.testing.assert_array_equal(value.detach().numpy(), instruction.weights[name])
        assert np.isfinite(model(torch.zeros(1, 1, 8, 8))[-1].detach().numpy()).all()


def test_generation_truncates_the_chunks_to_k():
    net = PersonalHypernet(seed=0)
    net.add_chunk_head("h", tau=3, chunk=10)
    net.add_embedding("e", 3)
    assert net.generate("e", "h", 25).shape == (25,)
    with pytest.raises(ValueError, match="30 values"):
        net.generate("e", "h", 31)


@pytest.mark.parametrize("cls", [MHPFedHN, PFedHN])
def test_one_vjp_step_moves_generated_weights_toward_trained_and_the_printed_sign_away(cls):
    distances = {}
    # +1: grad_outputs = generated - trained; -1: the paper's printed sign, trained - generated
    for sign in (1.0, -1.0):
        m, weights = method(cls)
        instruction = m.configure_train(1, weights, devices(["lenet"]))[0]
        client = m.clients["d0"]
        start = m.generate(client).detach().numpy()
        trained = start + np.random.default_rng(0).normal(0, 0.05, start.shape).astype(np.float32)
        before = np.linalg.norm(start - trained)
        m.step_toward(client, trained, weight=sign)
        distances[sign] = (before, np.linalg.norm(m.generate(client).detach().numpy() - trained))
        assert set(instruction.weights)  # the step used the real method machinery
    assert distances[1.0][1] < distances[1.0][0]
    assert distances[-1.0][1] > distances[-1.0][0]


@pytest.mark.parametrize(("optimizer", "ratio"), [("sgd", (9.0, 11.0)), ("adam", (0.5, 2.0))])
def test_sgd_moves_the_generated_weights_in_proportion_to_the_update_and_adam_does_not(optimizer, ratio):
    # issue 32: a 2-step device update is tiny; Adam still moves every element by ~hn_lr
    moved = []
    for scale in (1e-4, 1e-3):
        m, weights = method(PFedHN, hn_optimizer=optimizer)
        m.configure_train(1, weights, devices(["lenet"]))
        client = m.clients["d0"]
        start = m.generate(client).detach().numpy()
        trained = start + scale * np.random.default_rng(0).standard_normal(start.shape).astype(np.float32)
        m.step_toward(client, trained)
        moved.append(np.linalg.norm(m.generate(client).detach().numpy() - start))
    assert ratio[0] < moved[1] / moved[0] < ratio[1]


def test_aggregate_train_pulls_every_client_toward_its_trained_weights():
    m, weights = method()
    instructions = m.configure_train(1, weights, devices(["lenet", "vgg8", "mlp"]))
    rng = np.random.default_rng(1)
    updates = [ClientUpdate(i.device_id, 50, {k: v + rng.normal(0, 0.05, v.shape).astype(np.float32)
                                              for k, v in i.weights.items()}, {}, i) for i in instructions]
    before = {u.device_id: np.linalg.norm(m.architecture_named(m.clients[u.device_id].tier).flatten(u.weights)
                                          - m.generate(m.clients[u.device_id]).detach().numpy())
              for u in updates}
    new = m.aggregate_train(1, weights, updates)
    assert set(new) != set() and all(k.startswith("hn.") for k in new)
    for u in updates:
        client = m.clients[u.device_id]
        after = np.linalg.norm(m.architecture_named(client.tier).flatten(u.weights)
                               - m.generate(client).detach().numpy())
        assert after < before[u.device_id]


def test_heads_are_shared_exactly_between_clients_with_equal_tau():
    # lenet tau 9 (twice), vgg8 and resnet10 both tau 12, resnet18 tau 19, mlp tau 6
    m, weights = method()
    m.configure_train(1, weights, devices(["lenet", "lenet", "vgg8", "resnet10", "resnet18", "mlp"]))
    heads = {d: c.head for d, c in m.clients.items()}
    assert heads == {"d0": "tau9", "d1": "tau9", "d2": "tau12", "d3": "tau12", "d4": "tau19", "d5": "tau6"}
    assert len({c.embedding for c in m.clients.values()}) == 6  # embeddings are never shared
    assert m.hypernet.heads["tau12"].rows == 12
    assert m.hypernet.embeddings[m.clients["d3"].embedding].shape == (12, 64)
    g0, g1 = (m.generate(m.clients[d]).detach() for d in ("d0", "d1"))
    assert not torch.equal(g0, g1)  # same head, own embeddings: different models

    snapshot = {k: v.detach().clone() for k, v in m.hypernet.heads.state_dict().items()}
    trained = m.generate(m.clients["d2"]).detach().numpy() + 0.1
    m.step_toward(m.clients["d2"], trained)  # a vgg8 client's step...
    changed = {k.split(".")[0] for k, v in m.hypernet.heads.state_dict().items()
               if not torch.equal(v, snapshot[k])}
    assert changed == {"tau12"}  # ...moves the head it shares with resnet10, and no other head


def test_pfedhn_has_one_head_per_architecture_and_one_embedding_row():
    m, weights = method(PFedHN)
    m.configure_train(1, weights, devices(["lenet", "lenet", "vgg8", "resnet10"]))
    assert [c.head for c in m.clients.values()] == ["arch-lenet", "arch-lenet", "arch-vgg8", "arch-resnet10"]
    assert all(m.hypernet.embeddings[c.embedding].shape == (1, 64) for c in m.clients.values())


def test_embeddings_start_small_and_seeded():
    m, weights = method()
    m.configure_train(1, weights, devices(["lenet"]))
    emb = m.hypernet.embeddings[m.clients["d0"].embedding].detach()
    assert emb.shape == (9, 64) and 0.001 < float(emb.std()) < 0.003
    again, w2 = method()
    again.configure_train(1, w2, devices(["lenet"]))
    assert torch.equal(emb, again.hypernet.embeddings["e0"].detach())


def test_state_round_trip_through_checkpoint_weights_and_json():
    import json

    m, weights = method()
    instructions = m.configure_train(1, weights, devices(["lenet", "resnet10"]))
    updates = [ClientUpdate(i.device_id, 50, {k: v * 0.9 for k, v in i.weights.items()}, {}, i)
               for i in instructions]
    saved = m.aggregate_train(1, weights, updates)
    state = json.loads(json.dumps(m.state_dict()))
    restored = MHPFedHN(SPEC, Recipe())
    restored.load_state_dict(state)
    copied = {k: v.copy() for k, v in saved.items()}
    again = restored.configure_train(2, copied, devices(["lenet", "resnet10"]))
    for a, b in zip(m.configure_train(2, saved, devices(["lenet", "resnet10"])), again, strict=True):
        assert a.weights.keys() == b.weights.keys()
        assert all(np.array_equal(a.weights[k], b.weights[k]) for k in a.weights)


def test_resume_without_options_keeps_the_checkpoints_shapes():
    m, weights = method(chunk=1000, hidden=32)
    instructions = m.configure_train(1, weights, devices(["mlp"]))
    update = ClientUpdate("d0", 50, instructions[0].weights, {}, instructions[0])
    saved = m.aggregate_train(1, weights, [update])
    restored = MHPFedHN(SPEC, Recipe())  # e.g. `fedsdk-server run --resume`, which takes no method options
    restored.load_state_dict(m.state_dict())
    again = restored.configure_train(2, saved, devices(["mlp"]))[0]
    assert restored.clients["d0"].head == "tau18" and restored.hypernet.hidden == 32
    np.testing.assert_array_equal(again.weights["layers.1.weight"],
                                  m.configure_train(2, saved, devices(["mlp"]))[0].weights["layers.1.weight"])


def test_unknown_tier_is_a_clear_error():
    m, weights = method()
    with pytest.raises(ValueError, match="names no architecture"):
        m.configure_train(1, weights, devices(["resnet50"]))
