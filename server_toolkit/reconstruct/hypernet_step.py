"""The server update of a hypernetwork from one client's trained weights (pFedHN's rule).

The hypernetwork generated ``generated`` (tensors attached to its graph); the client trained
them into ``trained``. Moving the generated weights towards the trained ones is one
vector-Jacobian product: the gradient of ``0.5·‖generated − trained‖²`` with respect to the
hypernetwork's parameters is ``J^T (generated − trained)``, i.e.
``torch.autograd.grad(generated, params, grad_outputs=generated − trained)``. (MH-pFedHN's
paper prints the difference the other way round, which would push the hypernetwork away
from what the client learned; METHODS.md settles it.)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def hypernet_step(generated: Sequence[torch.Tensor], trained: Sequence[torch.Tensor],
                  params: Sequence[torch.nn.Parameter], optimizer: torch.optim.Optimizer,
                  max_norm: float = 50.0, weight: float = 1.0) -> float:
    """One optimizer step of ``params`` from ``generated`` → ``trained`` (same shapes, in
    pairs). ``weight`` scales the step's gradient (e.g. a client's sample share);
    the gradient's total norm is clipped at ``max_norm``. Returns the norm before clipping.
    Parameters no generated tensor depends on get no gradient (their ``.grad`` is None)."""
    generated, trained = list(generated), list(trained)
    if len(generated) != len(trained):
        raise ValueError(f"{len(generated)} generated tensors but {len(trained)} trained ones")
    for g, t in zip(generated, trained, strict=True):
        if g.shape != t.shape:
            raise ValueError(f"generated shape {tuple(g.shape)} != trained shape {tuple(t.shape)}")
    params = list(params)
    directions = [weight * (g.detach() - t.to(g.dtype)) for g, t in zip(generated, trained, strict=True)]
    grads = torch.autograd.grad(generated, params, grad_outputs=directions, allow_unused=True)
    optimizer.zero_grad(set_to_none=True)
    for p, g in zip(params, grads, strict=True):
        p.grad = g
    norm = torch.nn.utils.clip_grad_norm_([p for p in params if p.grad is not None], max_norm)
    optimizer.step()
    return float(norm)
