"""The numpy optimizers follow torch.optim step for step (synthetic tensors: pure maths)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedcore.recipe import Recipe
from sdk_device.runtimes.optimizers import SGD, Adam, make_optimizer

SHAPES = {"w": (5, 3), "b": (3,)}


def _run(make_ours, make_torch, steps: int = 6) -> float:
    rng = np.random.default_rng(0)
    params = {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}
    torch_params = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    ours, theirs = make_ours(), make_torch(list(torch_params.values()))
    for _ in range(steps):
        grads = {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}
        ours.step(params, grads)
        for k, p in torch_params.items():
            p.grad = torch.from_numpy(grads[k].copy())
        theirs.step()
    assert all(v.dtype == np.float32 for v in params.values())
    return max(float(np.abs(params[k] - p.detach().numpy()).max()) for k, p in torch_params.items())


@pytest.mark.parametrize("momentum, weight_decay", [(0.0, 0.0), (0.9, 0.0), (0.9, 1e-2)])
def test_sgd_matches_torch(momentum, weight_decay):
    diff = _run(lambda: SGD(0.1, momentum, weight_decay),
                lambda p: torch.optim.SGD(p, lr=0.1, momentum=momentum, weight_decay=weight_decay))
    assert diff <= 1e-6


@pytest.mark.parametrize("weight_decay", [0.0, 1e-2])
def test_adam_matches_torch(weight_decay):
    diff = _run(lambda: Adam(0.01, weight_decay),
                lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=weight_decay))
    assert diff <= 1e-6


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_the_proximal_term_matches_torch_with_the_fedprox_gradient(optimizer):
    mu, start = 0.5, {}

    def torch_with_prox(p):
        opt = torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-2) if optimizer == "sgd" else \
            torch.optim.Adam(p, lr=0.01, weight_decay=1e-2)
        step = opt.step

        def prox_step():  # g += mu * (w - w_start), w_start = the values before the first step
            for q in p:
                anchor = start.setdefault(id(q), q.detach().clone())
                q.grad += mu * (q.detach() - anchor)
            step()
        opt.step = prox_step
        return opt

    ours = (lambda: SGD(0.1, 0.9, 1e-2, prox_mu=mu)) if optimizer == "sgd" else \
        (lambda: Adam(0.01, 1e-2, prox_mu=mu))
    assert _run(ours, torch_with_prox) <= 1e-6
    plain = (lambda: SGD(0.1, 0.9, 1e-2)) if optimizer == "sgd" else (lambda: Adam(0.01, 1e-2))
    assert _run(plain, torch_with_prox) > 1e-4  # the term changes the trajectory


def test_a_recipe_sends_prox_mu_only_when_it_is_set():
    assert "prox_mu" not in Recipe().to_dict()
    assert Recipe.from_dict(Recipe(prox_mu=0.01).to_dict()).prox_mu == 0.01
    assert make_optimizer(Recipe(prox_mu=0.01)).proximal.mu == 0.01
    with pytest.raises(ValueError, match="prox_mu"):
        Recipe(prox_mu=-1.0)


def test_updates_are_in_place():
    param = np.ones(4, np.float32)
    view = param[:]
    SGD(0.5, momentum=0.9).step({"p": param}, {"p": np.ones(4, np.float32)})
    Adam(0.5).step({"p": param}, {"p": np.ones(4, np.float32)})
    assert np.shares_memory(view, param) and not np.allclose(view, 1.0)


def test_the_recipe_chooses_the_optimizer():
    assert isinstance(make_optimizer(Recipe(optimizer="adam")), Adam)
    sgd = make_optimizer(Recipe(optimizer="sgd", lr=0.2, momentum=0.5, weight_decay=1e-4))
    assert isinstance(sgd, SGD) and (sgd.lr, sgd.momentum, sgd.weight_decay) == (0.2, 0.5, 1e-4)
