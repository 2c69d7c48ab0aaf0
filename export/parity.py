"""Gradient parity: an exported program against torch autograd on the same weights and data.

The reference is ``fedcore.torch_model.SpecModel`` (the torch runtime's own
model, built from nn modules) in train mode, with the program's loss from
``fedcore.losses``. Dropout layers of the reference multiply by the same masks the
program receives. Three checks:

* ``gradient_parity``: loss, every parameter gradient and the updated BN running stats of
  one batch; gradient error is reported relative to max(1, max |torch grad|) per tensor.
* ``training_parity``: ``recipe.epochs`` epochs of the runtime's own training loop (its
  optimizer, its padding of the short last batch) against torch.optim on the same batch
  order; max |weight difference| at the end. Dropout is off on both sides.
* ``eval_parity``: max |logit difference| of the program's eval method against the
  reference in eval mode.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fedcore.losses import Loss
from fedcore.recipe import Recipe
from fedcore.torch_model import SpecModel, build_model, load_numpy, state_numpy
from fedcore.torch_train import add_proximal, torch_optimizer
from sdk_device.runtimes.executorch_runtime import ExecutorchRuntime


@dataclass(frozen=True)
class GradientParity:
    loss_program: float
    loss_torch: float
    grad_error: float  # max over tensors of max|g_program - g_torch| / max(1, max|g_torch|)
    worst_tensor: str
    running_error: float  # max |running stat difference|

    @property
    def loss_error(self) -> float:
        return abs(self.loss_program - self.loss_torch)


class _FixedMask(nn.Module):
    """Dropout replaced by multiplication with a given mask (in torch's layout)."""

    def __init__(self, mask: torch.Tensor) -> None:
        super().__init__()
        self.mask = mask

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.mask


def _with_masks(model: SpecModel, masks: list[torch.Tensor] | None) -> None:
    """Swap the model's dropout layers (in spec order) for fixed masks, or identities."""
    dropouts = [name for name, m in model.named_modules() if isinstance(m, nn.Dropout)]  # spec order
    for i, name in enumerate(dropouts):
        parent_name, _, child_name = name.rpartition(".")
        replacement = _FixedMask(masks[i]) if masks else nn.Identity()
        setattr(model.get_submodule(parent_name), child_name, replacement)


def _forward_with_features(model: SpecModel, x: torch.Tensor
                           ) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """The model's outputs and its features (the input of the last layer when it is linear)."""
    captured: list[torch.Tensor] = []
    last = model.layers[-1]
    hook = last.register_forward_hook(lambda _m, inputs, _out: captured.append(inputs[0]))
    try:
        outputs = model(x)
    finally:
        hook.remove()
    features = captured[0] if isinstance(last, nn.Linear) else outputs[-1]
    return outputs, features


def reference_gradients(spec: dict, weights: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray,
                        loss: dict, extras: dict[str, np.ndarray] | None = None,
                        dropout_masks: list[np.ndarray] | None = None
                        ) -> tuple[float, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Torch autograd: (loss, gradients by name, updated running stats by name)."""
    model = build_model(spec)
    load_numpy(model, weights)
    _with_masks(model, None if dropout_masks is None else [torch.from_numpy(m) for m in dropout_masks])
    model.train()
    xt, yt = torch.from_numpy(np.ascontiguousarray(x, np.float32)), torch.from_numpy(y.astype(np.int64))
    outputs, features = _forward_with_features(model, xt)
    extras_t = {k: torch.from_numpy(np.ascontiguousarray(v, np.float32)) for k, v in (extras or {}).items()}
    value = Loss.from_dict(loss)(outputs, features, yt, torch.ones(len(yt)), extras_t)
    value.backward()
    grads = {name: p.grad.numpy().copy() for name, p in model.named_parameters()}
    running = {k: v for k, v in state_numpy(model).items() if "running_" in k}
    return float(value.detach()), grads, running


def gradient_parity(program: bytes, spec: dict, weights: dict[str, np.ndarray], x: np.ndarray,
                    y: np.ndarray, loss: dict, extras: dict[str, np.ndarray] | None = None,
                    dropout_seed: int | None = 0, runtime_class: type = ExecutorchRuntime) -> GradientParity:
    """Compare one forward+backward of ``program`` with torch autograd (see module doc).
    ``dropout_seed`` draws dropout masks shared by both sides (None: dropout off).
    ``runtime_class``: the pte/1 runtime under test (the bindings one, or executorch-native)."""
    runtime = runtime_class()
    runtime.load_program(program, "pte/1")
    runtime.set_weights(weights)
    masks = None
    if dropout_seed is not None and runtime.meta["dropout"]:
        rng = np.random.default_rng(dropout_seed)
        masks = [((rng.random((len(y), *shape)) >= p) / (1.0 - p)).astype(np.float32)
                 for _, p, shape in runtime.meta["dropout"]]
    loss_p, grads_p, running_p = runtime.gradients(x, y, extras, masks)
    loss_t, grads_t, running_t = reference_gradients(spec, weights, x, y, loss, extras, masks)
    errors = {name: float(np.abs(grads_p[name] - g).max() / max(1.0, float(np.abs(g).max())))
              for name, g in grads_t.items()}
    worst = max(errors, key=errors.get)
    running_error = max([float(np.abs(running_p[k] - v).max()) for k, v in running_t.items()] or [0.0])
    return GradientParity(loss_p, loss_t, errors[worst], worst, running_error)


def kink_margin(spec: dict, weights: dict[str, np.ndarray], x: np.ndarray) -> float:
    """How far a float64 train-mode forward pass of ``x`` stays from the kinks of the loss:
    the smallest |input| of any ReLU and the smallest non-zero gap between the largest and the
    second largest value of any max-pool window.

    A gradient is only defined to float32 precision where this margin is larger than float32
    rounding (~1e-6 of the activations): closer, two correct float32 implementations may put
    an input on different sides of a kink (or pick different maxima), and that sample's
    gradient then differs by O(1e-3). Parity batches are checked against it (bench/runtimes.py).
    """
    model = build_model(spec)
    load_numpy(model, weights)
    model.double().train()
    smallest = [float("inf")]

    def relu(_module, inputs, _output) -> None:
        smallest[0] = min(smallest[0], float(inputs[0].detach().abs().min()))

    def pool(module, inputs, _output) -> None:
        k = module.kernel_size
        windows = torch.nn.functional.unfold(inputs[0].detach(), k, stride=k)  # (B, C*k*k, L)
        b, _, count = windows.shape
        top = windows.reshape(b, -1, k * k, count).topk(2, dim=2).values
        gaps = top[:, :, 0] - top[:, :, 1]
        gaps = gaps[gaps > 0]  # exact ties (windows of ReLU zeros) go to the first maximum on every side
        if gaps.numel():
            smallest[0] = min(smallest[0], float(gaps.min()))

    hooks = [m.register_forward_hook(relu) for m in model.modules() if isinstance(m, nn.ReLU)]
    hooks += [m.register_forward_hook(pool) for m in model.modules() if isinstance(m, nn.MaxPool2d)]
    try:
        with torch.no_grad():
            model(torch.from_numpy(np.ascontiguousarray(x, np.float64)))
    finally:
        for hook in hooks:
            hook.remove()
    return smallest[0]


def reference_training(spec: dict, weights: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray,
                       recipe: Recipe, loss: dict, extras: dict[str, np.ndarray] | None = None
                       ) -> dict[str, np.ndarray]:
    """torch.optim training with the runtimes' batch order (randperm of the recipe seed),
    dropout off. Returns the final weights."""
    model = build_model(spec)
    load_numpy(model, weights)
    _with_masks(model, None)
    model.train()
    params = list(model.parameters())
    opt = torch_optimizer(params, recipe)
    anchors = [p.detach().clone() for p in params] if recipe.prox_mu else []
    loss_fn = Loss.from_dict(loss)
    xt, yt = torch.from_numpy(np.ascontiguousarray(x, np.float32)), torch.from_numpy(y.astype(np.int64))
    extras_t = {k: torch.from_numpy(np.ascontiguousarray(v, np.float32)) for k, v in (extras or {}).items()}
    gen = torch.Generator().manual_seed(recipe.seed)
    for _ in range(recipe.epochs):
        order = torch.randperm(len(yt), generator=gen)
        for start in range(0, len(yt), recipe.batch_size):
            idx = order[start:start + recipe.batch_size]
            outputs, features = _forward_with_features(model, xt[idx])
            value = loss_fn(outputs, features, yt[idx], torch.ones(len(idx)),
                            {k: v[idx] for k, v in extras_t.items()})
            opt.zero_grad(set_to_none=True)
            value.backward()
            add_proximal(params, anchors, recipe.prox_mu)
            opt.step()
    return state_numpy(model)


def training_parity(program: bytes, spec: dict, weights: dict[str, np.ndarray], x: np.ndarray,
                    y: np.ndarray, recipe: Recipe, loss: dict,
                    extras: dict[str, np.ndarray] | None = None, runtime_class: type = ExecutorchRuntime
                    ) -> float:
    """Max |weight difference| after the runtime's training loop vs ``reference_training``."""
    runtime = runtime_class()
    runtime.load_program(program, "pte/1")
    runtime.set_weights(weights)
    runtime.dropout_enabled = False
    runtime.train(x, y, recipe, extras=extras)
    trained = runtime.get_weights()
    reference = reference_training(spec, weights, x, y, recipe, loss, extras)
    return max(float(np.abs(trained[k] - v).max()) for k, v in reference.items())


def eval_parity(program: bytes, spec: dict, weights: dict[str, np.ndarray], x: np.ndarray,
                runtime_class: type = ExecutorchRuntime) -> float:
    """Max |logit difference| over all outputs: the program's eval method vs torch eval mode."""
    runtime = runtime_class()
    runtime.load_program(program, "pte/1")
    runtime.set_weights(weights)
    logits, _ = runtime.predict(x)
    model = build_model(spec)
    load_numpy(model, weights)
    model.eval()
    with torch.no_grad():
        reference = model(torch.from_numpy(np.ascontiguousarray(x, np.float32)))
    return max(float(np.abs(p - r.numpy()).max()) for p, r in zip(logits, reference, strict=True))
