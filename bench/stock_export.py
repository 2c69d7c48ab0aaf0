"""The stock ExecuTorch training export, for bench/runtimes.py's ``--stock`` arm.

What upstream's training example and NVIDIA FLARE's edge SDK ship: the joint forward+backward
graph of ``torch.export`` with the model's layers as their own ATen ops, lowered with
``to_edge`` and no partitioner, so every op runs on ExecuTorch's portable kernels
(``aten.convolution`` / ``convolution_backward``, ``relu`` / ``threshold_backward``,
``max_pool2d_with_indices`` and its backward, ``linear``).

Decisions:
* The program keeps fedsdk's training interface (channels-last input, sample mask, running
  statistics as inputs, metadata), so the same torch-free runtime drives it: only the layer
  ops change. It is built by swapping ``export.decompositions``' conv2d, ReLU, max-pool and
  linear for the ATen ops while ``export_with_stats(..., backend="portable")`` runs.
* BatchNorm stays written out in ATen ops (``decompositions.batch_norm_train``): ExecuTorch
  1.5.1 has no batch-norm backward kernel, so a stock program of a BatchNorm model could not
  train at all; the written-out form is the closest stock program that runs.
* Timing only where its kernels are wrong: the portable max-pool backward is the buggy one
  (BENCHMARKS, "Torch-free ExecuTorch runtime"); the bench prints the gradient error as
  measured.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F

import export.decompositions as ops
from export.executorch import export_with_stats


def _conv2d(x, weight, bias, stride, pad, groups=1):
    return F.conv2d(x.permute(0, 3, 1, 2), weight, bias, stride, pad, groups=groups).permute(0, 2, 3, 1)


def _max_pool2d(x, k):
    return F.max_pool2d(x.permute(0, 3, 1, 2), k, k).permute(0, 2, 3, 1)


STOCK_OPS = {"conv2d": _conv2d, "relu": torch.relu, "max_pool2d": _max_pool2d, "linear": F.linear}


@contextmanager
def stock_layers():
    """``export.decompositions``' layer ops replaced by the ATen ops while the block runs."""
    saved = {name: getattr(ops, name) for name in STOCK_OPS}
    try:
        for name, op in STOCK_OPS.items():
            setattr(ops, name, op)
        yield
    finally:
        for name, op in saved.items():
            setattr(ops, name, op)


def export_stock(spec: dict, batch: int) -> tuple[bytes, dict]:
    """(.pte bytes, {"export_s", "size_bytes"}) of the stock training program of ``spec``."""
    with stock_layers():
        return export_with_stats(spec, {"kind": "ce"}, batch, backend="portable")
