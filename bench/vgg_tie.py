"""Is the fused VGG's gradient gap (6.8e-3 at batch 32, 32x32) a max-pool near-tie? A float64 check.

The batch, weights and dropout masks of ``bench/runtimes.py``'s parity row (vgg_multi_exit,
batch 32, seed 0; masks of ``gradient_parity``'s seed 0). Prints, per pair of (fused program on
``executorch-native``, torch float32 autograd, torch float64 autograd), the worst relative
gradient difference (max |a-b| / max(1, max |b|), as ``gradient_parity``), and for each max-pool
of the model: the windows whose float32 maximum (torch's first-maximum rule) is another element
than float64's, and the smallest gap between a window's two largest values (relative).

    PYTHONPATH=. .venv/bin/python bench/vgg_tie.py
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from torch import nn

from bench.runtimes import MODELS, _data
from export.executorch import export_training_program
from export.parity import _FixedMask, _forward_with_features, _with_masks
from export.program_store import ProgramStore
from export.programs import program_key, store_key
from fedcore.losses import Loss
from fedcore.torch_model import build_model, load_numpy, state_numpy
from sdk_device.runtimes.executorch_native_runtime import NativeExecutorchRuntime

CE, BATCH = {"kind": "ce"}, 32


def _torch_gradients(spec, weights, x, y, masks, dtype):
    """(gradients by name, [input of each max-pool]) of one forward+backward in ``dtype``."""
    model = build_model(spec)
    load_numpy(model, weights)
    _with_masks(model, [torch.from_numpy(m) for m in masks] if masks else None)
    model = model.to(dtype).train()
    for m in model.modules():
        if isinstance(m, _FixedMask):
            m.mask = m.mask.to(dtype)
    pooled: list[torch.Tensor] = []
    hooks = [m.register_forward_hook(lambda _m, inputs, _o: pooled.append(inputs[0].detach()))
             for m in model.modules() if isinstance(m, nn.MaxPool2d)]
    outputs, features = _forward_with_features(model, torch.from_numpy(x).to(dtype))
    for hook in hooks:
        hook.remove()
    yt = torch.from_numpy(y.astype(np.int64))
    Loss.from_dict(CE)(outputs, features, yt, torch.ones(len(yt), dtype=dtype), {}).backward()
    return {n: p.grad.double().numpy() for n, p in model.named_parameters()}, pooled


def _windows(x: torch.Tensor, k: int = 2) -> torch.Tensor:
    """(B, C, H, W) -> (windows, k*k) in row-major order within each window."""
    b, c, h, w = x.shape
    x = x[:, :, :h // k * k, :w // k * k].reshape(b, c, h // k, k, w // k, k)
    return x.permute(0, 1, 2, 4, 3, 5).reshape(-1, k * k)


def _worst(a: dict, b: dict) -> tuple[float, str]:
    errors = {n: float(np.abs(a[n] - v).max() / max(1.0, float(np.abs(v).max()))) for n, v in b.items()}
    name = max(errors, key=errors.get)
    return errors[name], name


def main() -> None:
    warnings.filterwarnings("ignore")
    spec = MODELS["vgg_multi_exit"]()
    x, y = _data(spec, BATCH * 8)
    x, y = x[:BATCH], y[:BATCH]
    weights = state_numpy(build_model(spec, seed=0))
    key = store_key(program_key(spec, "pte/1", CE, BATCH), "fused")
    program, _ = ProgramStore().get_or_make(key, "pte/1",
                                            lambda: export_training_program(spec, CE, BATCH, kernels="fused"))
    runtime = NativeExecutorchRuntime()
    runtime.load_program(program, "pte/1")
    runtime.set_weights(weights)
    rng = np.random.default_rng(0)  # gradient_parity's masks (dropout_seed 0)
    masks = [((rng.random((len(y), *shape)) >= p) / (1.0 - p)).astype(np.float32)
             for _, p, shape in runtime.meta["dropout"]]
    _, fused, _ = runtime.gradients(x, y, None, masks or None)
    fused = {n: g.astype(np.float64) for n, g in fused.items()}
    t32, pooled32 = _torch_gradients(spec, weights, x, y, masks, torch.float32)
    t64, pooled64 = _torch_gradients(spec, weights, x, y, masks, torch.float64)
    for label, a, b in (("fused vs float64", fused, t64), ("torch float32 vs float64", t32, t64),
                        ("fused vs torch float32", fused, t32)):
        error, name = _worst(a, b)
        print(f"{label:26s} {error:.2e}  (worst tensor {name})")
    for i, (p32, p64) in enumerate(zip(pooled32, pooled64, strict=True)):
        w32, w64 = _windows(p32), _windows(p64)
        flipped = int((w32.argmax(1) != w64.argmax(1)).sum())
        top2 = w64.topk(2, dim=1).values
        gap = ((top2[:, 0] - top2[:, 1]) / top2[:, 0].abs().clamp_min(1e-30)).min().item()
        print(f"max-pool {i}: {len(w64)} windows, float32 argmax != float64 argmax in {flipped}; "
              f"smallest top-2 gap (relative, float64) {gap:.1e}")


if __name__ == "__main__":
    main()
