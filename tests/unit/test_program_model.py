"""The export-friendly model (``export.program_model``) computes what the torch runtime's
model computes, for every zoo model (default widths), in eager mode (no export needed):
outputs, loss, gradients and BN running statistics in train mode, logits in eval mode,
and a zero-padded sample changes nothing.

Both sides run in float64, so the comparison checks the mathematics exactly (1e-9): in
float32 a deep BatchNorm over a few samples at 1x1 resolution is ill-conditioned and both
torch and the decomposition differ from the exact result by ~3e-4. Float32 parity of
the exported programs is tested in test_export_parity.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from export.parity import _FixedMask, _with_masks
from export.program_model import ProgramModel
from fedcore.losses import Loss
from fedcore.torch_model import build_model, state_numpy
from server_toolkit.models.zoo import ZOO, model_spec

SHAPES = [(3, 16, 16), (1, 8, 8)]
CASES = [(name, shape) for name in ZOO for shape in SHAPES]


TOL = 1e-9


def _pair(spec: dict, training: bool):
    reference = build_model(spec, seed=1).double()
    program = ProgramModel(spec, training=training).double()
    program.load_state_dict({n: p.detach().clone() for n, p in reference.named_parameters()})
    return reference, program


def _running(program: ProgramModel, gen: torch.Generator) -> list[torch.Tensor]:
    """Random running statistics (variances >= 0.5), float64."""
    return [torch.rand(s, generator=gen, dtype=torch.float64) + (0.5 if i % 2 else 0.0)
            for i, s in enumerate(program.running_shapes)]


@pytest.mark.parametrize("name, shape", CASES, ids=[f"{n}-{s[1]}" for n, s in CASES])
def test_train_mode_matches_torch_with_a_padded_sample(name, shape):
    spec = model_spec(name, shape, 10)
    reference, program = _pair(spec, training=True)
    reference.train()
    gen = torch.Generator().manual_seed(0)
    real, batch = 3, 4
    x = torch.randn(batch, *shape, generator=gen, dtype=torch.float64)
    x[real:] = 0.0  # the padded sample
    y = torch.randint(0, 10, (batch,), generator=gen)
    mask = torch.tensor([1.0] * real + [0.0] * (batch - real), dtype=torch.float64)
    masks = [(torch.rand(batch, *s, generator=gen) >= p).double() / (1 - p)
             for _, p, s in program.dropout_shapes]
    running = _running(program, gen)
    outputs, features, new_running = program(x.permute(0, 2, 3, 1), mask, masks, running)
    loss = Loss()(outputs, features, y, mask, {})
    loss.backward()

    ref_state = state_numpy(reference)
    for i, n in enumerate(program.running_names):
        ref_state[n] = running[i].numpy()
    _with_masks(reference, [m[:real] for m in masks])
    reference.load_state_dict({k: torch.from_numpy(v).double() for k, v in ref_state.items()}, strict=False)
    ref_outputs = reference(x[:real])
    ref_loss = sum(torch.nn.functional.cross_entropy(o, y[:real]) for o in ref_outputs)
    ref_loss.backward()

    assert any(isinstance(m, _FixedMask) for m in reference.modules()) == bool(masks)
    assert abs(float(loss) - float(ref_loss)) <= TOL
    for a, b in zip(outputs, ref_outputs, strict=True):
        assert torch.allclose(a[:real], b, atol=TOL)
    for (n, p), q in zip(program.named_parameters(), reference.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, atol=TOL * max(1.0, float(q.grad.abs().max()))), n
    after = state_numpy(reference)
    for n, value in zip(program.running_names, new_running, strict=True):
        assert np.allclose(value.detach().numpy(), after[n], atol=TOL), n


@pytest.mark.parametrize("name, shape", CASES, ids=[f"{n}-{s[1]}" for n, s in CASES])
def test_eval_mode_matches_torch(name, shape):
    spec = model_spec(name, shape, 10)
    reference, program = _pair(spec, training=False)
    gen = torch.Generator().manual_seed(1)
    running = _running(program, gen)
    state = {k: torch.from_numpy(v) for k, v in state_numpy(reference).items()}
    state.update(dict(zip(program.running_names, running, strict=True)))
    reference.load_state_dict(state, strict=False)
    reference.eval()
    x = torch.randn(5, *shape, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        outputs, _, _ = program(x.permute(0, 2, 3, 1), torch.ones(5, dtype=torch.float64), [], running)
        expected = reference(x)
    for a, b in zip(outputs, expected, strict=True):
        assert torch.allclose(a, b, atol=TOL)
