"""Convolutional compression (FedConv, seed 001): small convs that turn weights into weights.

"Learning on the model": every parameter tensor of the global model is read as a stack of
one-channel images and run through a small conv network whose output is the matching
tensor of a smaller model. The convs are trained on server data with the global weights
frozen; the generated tensors enter the sub-model through ``torch.func.functional_call``, so
the loss of the *sub-model* back-propagates into the convs.

Matrices. A conv weight (O, I, K, K) is K·K matrices (1, O, I), one per kernel position; a
linear weight (O, I) is one matrix; a vector (bias, BatchNorm weight/bias) of C entries is
one (C, 1) matrix. A tensor's target shape is the width-shared sub-model's at ratio SR
(``submodels/width.py``: ``ceil(SR * C)`` channels per hidden channel space; input
channels and class logits stay whole), so a tier's model is the same plain torchspec/1
model as HeteroFL's and exports like any other.

The path of one tensor (``TensorPath``), with ``BlockConfig``'s parts switchable for
ablations:

1. every matrix j times a learned scalar ω_j (init 1): one path per tensor is shared by its
   matrices (the paper's shared-parameter optimisation);
2. the 1×1 block: m + conv1x1(16→1)(ReLU(conv1x1(1→16)(m))) (the skip connection; no biases);
3. the size-changing conv, stride 1, padding 0, kernel (rows − rows' + 1, cols − cols' + 1):
   a conv to compress, a transposed conv to dilate (``methods/fedconv/conv_dilate.py``), with
   weight normalisation (large kernels are applied through an FFT: same result, faster);
4. the Modified Leaky ReLU (MLR) on the generated values: 0.85·x for x ≥ 0, 0.001·x for
   x < 0 (off by default, see below);
5. (compression only, ours) the generated tensor rescaled to the Frobenius norm of the
   source tensor's top-left block of the target shape (``keep_norm``, see below).

Decisions where the paper is silent or where it fails here:
* The MLR is off by default (``BlockConfig.mlr``). Measured on digits (small_cnn trained to
  0.958, 70 server images, 20 epochs): with the MLR the sub-model at SR 0.75 reaches 0.23,
  without it 0.958: slope 0.001 leaves almost every generated weight >= 0 and gives negative
  pre-activations a 1000x smaller gradient, so training cannot bring them back. ``mlr=True``
  is the paper's block exactly (``bench/accuracy_fedconv.py`` measures the ladder).
* ``init="delta"`` (default): the size-changing conv starts as a delta at (0, 0), so an
  untrained compressor yields the top-left block of every matrix (HeteroFL's sub-model) and
  an untrained dilator pads with zeros (the dilated model computes what the small one
  did). ``"random"`` (torch's default init) left every sub-model at chance level here.
* Biases and BatchNorm weights/biases get paths of their own (vectors, kernel (C − C' + 1, 1));
  the global spec's BatchNorm is made static (no running statistics, as the width methods).
  Tensors whose shape does not change (e.g. the classifier bias) get a (1, 1) path too.
* The 1×1 block has a ReLU between its two convs (two linear 1×1 convs in a row would be one
  scalar); its second conv starts at zero, so the block starts as the identity. Its convs
  have no bias: a bias adds one constant to every entry, which a large size-changing kernel
  then sums up coherently. With biases, generated linear weights grew to ~100× the global
  ones within two rounds on digits, and the devices' training then killed every ReLU.
* ``keep_norm`` (on by default; not in the paper). Trained on a few dozen server images, the
  compressors scaled their outputs up round after round (a large kernel can add up many
  entries coherently; 2-6× the top-left block's norm after two rounds), the devices'
  training on such weights killed most ReLUs and the federation fell to chance by round 5
  on digits (Dirichlet 0.1). Rescaling each compressed tensor to the norm of the block the
  width methods would send leaves the compressor free to choose *which* weights, not how
  large they are; with it the same runs kept learning.
* Because of its slopes, a path with the MLR is never the identity; without it, a
  delta-initialised compressor at SR = 1 returns the global model exactly.
* Optimiser: Adam (the paper writes plain gradient descent; the authors' code uses Adam),
  cosine learning rate per epoch (``methods/fedconv/train_generated.py``; epochs count from 0, so
  the rate cycles with period 2·T_max), batch 16.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedcore.torch_model import build_model

from ...submodels.width import width_layout
from ...torch_utils import to_numpy, to_torch
from .train_generated import Schedule, train_generated

Weights = dict[str, np.ndarray]
Shape = tuple[int, ...]

POSITIVE_SLOPE = 0.85
NEGATIVE_SLOPE = 0.001


@dataclass(frozen=True)
class BlockConfig:
    """Which parts of the path are on. ``expand_channels``: width of the 1×1 block (0: no
    block, no skip); ``mlr``: Modified Leaky ReLU on the output; ``weight_norm`` on the
    size-changing conv; ``init``: "delta" or "random"; ``keep_norm``: a compressed tensor is
    rescaled to the norm of the source's top-left block (see the module docstring)."""

    expand_channels: int = 16
    mlr: bool = False
    weight_norm: bool = True
    init: str = "delta"
    keep_norm: bool = True

    def __post_init__(self) -> None:
        if self.init not in ("delta", "random"):
            raise ValueError(f"init must be 'delta' or 'random', got {self.init!r}")
        if self.expand_channels < 0:
            raise ValueError(f"expand_channels must be >= 0, got {self.expand_channels}")


DEFAULT_BLOCK = BlockConfig()
PLAIN = BlockConfig(expand_channels=0, mlr=False, weight_norm=False, keep_norm=False)  # one conv only


def modified_leaky_relu(x: torch.Tensor) -> torch.Tensor:
    """FedConv's MLR: 0.85·x where x >= 0, 0.001·x where x < 0."""
    return torch.where(x >= 0, POSITIVE_SLOPE * x, NEGATIVE_SLOPE * x)


def matrix_dims(shape: Shape) -> tuple[int, int, int]:
    """(matrices, rows, cols) a tensor of ``shape`` is read as."""
    if len(shape) == 4:
        return shape[2] * shape[3], shape[0], shape[1]
    if len(shape) == 2:
        return 1, shape[0], shape[1]
    if len(shape) == 1:
        return 1, shape[0], 1
    raise ValueError(f"cannot read a tensor of shape {shape} as matrices")


def as_matrices(tensor: torch.Tensor) -> torch.Tensor:
    """(O, I, KH, KW) -> (KH*KW, 1, O, I); (O, I) -> (1, 1, O, I); (C,) -> (1, 1, C, 1)."""
    if tensor.dim() == 4:
        o, i, kh, kw = tensor.shape
        return tensor.permute(2, 3, 0, 1).reshape(kh * kw, 1, o, i)
    if tensor.dim() == 2:
        return tensor.reshape(1, 1, *tensor.shape)
    return tensor.reshape(1, 1, -1, 1)


def from_matrices(matrices: torch.Tensor, shape: Shape) -> torch.Tensor:
    """The inverse of ``as_matrices`` for a tensor of ``shape``."""
    if len(shape) == 4:
        o, i, kh, kw = shape
        return matrices.reshape(kh, kw, o, i).permute(2, 3, 0, 1)
    return matrices.reshape(shape)


FFT_MIN_KERNEL = 64  # kernels with at least this many entries are applied through an FFT


def correlate_valid(m: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """``conv2d(m, kernel)``, stride 1, no padding: (M, 1, R, C) -> (M, 1, R - k1 + 1, C - k2 + 1).
    Large kernels go through an FFT (same result up to float rounding): on one CPU thread
    torch's direct backward of a one-channel conv with a 49×97 kernel took ~30 ms, the FFT ~2."""
    k1, k2 = kernel.shape
    if kernel.numel() < FFT_MIN_KERNEL:
        return F.conv2d(m, kernel.view(1, 1, k1, k2))
    rows, cols = m.shape[-2:]
    spectrum = torch.fft.rfft2(m) * torch.conj(torch.fft.rfft2(kernel, s=(rows, cols)))
    return torch.fft.irfft2(spectrum, s=(rows, cols))[..., :rows - k1 + 1, :cols - k2 + 1]


def convolve_full(m: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """``conv_transpose2d(m, kernel)``, stride 1, no padding: (M, 1, R', C') -> (M, 1, R' + k1 - 1,
    C' + k2 - 1); large kernels through an FFT, as ``correlate_valid``."""
    k1, k2 = kernel.shape
    if kernel.numel() < FFT_MIN_KERNEL:
        return F.conv_transpose2d(m, kernel.view(1, 1, k1, k2))
    rows, cols = m.shape[-2] + k1 - 1, m.shape[-1] + k2 - 1
    spectrum = torch.fft.rfft2(m, s=(rows, cols)) * torch.fft.rfft2(kernel, s=(rows, cols))
    return torch.fft.irfft2(spectrum, s=(rows, cols))


class TensorPath(nn.Module):
    """Maps one tensor of ``source`` shape to ``target`` shape (compress: target <= source
    on both matrix axes; ``transposed``: dilate, target >= source).

    The size-changing conv is a one-channel conv without bias, stored as its kernel
    ``direction`` (k1, k2) and, with weight normalisation, a ``gain``: kernel = gain ·
    direction / ||direction|| (Salimans & Kingma); otherwise kernel = direction."""

    def __init__(self, source: Shape, target: Shape, config: BlockConfig, transposed: bool = False) -> None:
        super().__init__()
        count, rows, cols = matrix_dims(tuple(source))
        t_count, t_rows, t_cols = matrix_dims(tuple(target))
        grow = (t_rows - rows, t_cols - cols) if transposed else (rows - t_rows, cols - t_cols)
        if len(source) != len(target) or t_count != count or min(grow) < 0:
            verb = "dilate" if transposed else "compress"
            raise ValueError(f"cannot {verb} a tensor of shape {tuple(source)} to {tuple(target)}")
        self.source, self.target, self.config = tuple(source), tuple(target), config
        self.transposed = transposed
        self.kernel_size = (grow[0] + 1, grow[1] + 1)
        self.scale = nn.Parameter(torch.ones(count))  # ω_j, one per matrix
        self.expand = self.reduce = None
        if config.expand_channels:
            self.expand = nn.Conv2d(1, config.expand_channels, 1, bias=False)
            self.reduce = nn.Conv2d(config.expand_channels, 1, 1, bias=False)
            if config.init == "delta":
                nn.init.zeros_(self.reduce.weight)
        direction = torch.zeros(self.kernel_size)
        if config.init == "delta":
            direction[0, 0] = 1.0
        else:  # torch's default for a one-channel conv: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
            bound = 1.0 / math.sqrt(direction.numel())
            direction.uniform_(-bound, bound)
        self.direction = nn.Parameter(direction)
        self.gain = nn.Parameter(direction.norm().clone()) if config.weight_norm else None

    def kernel(self) -> torch.Tensor:
        """The size-changing conv's kernel (k1, k2)."""
        if self.gain is None:
            return self.direction
        return self.gain * self.direction / self.direction.norm()

    def block_slopes(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The 1×1 block's residual ``reduce(ReLU(expand(m)))`` as slopes (a, b): it equals
        a·m where m > 0 and b·m where m < 0, with a = Σ_{e_c > 0} r_c e_c, b = Σ_{e_c < 0} r_c e_c
        (e, r: the two convs' weights; ReLU(e_c m) is e_c m exactly when e_c and m share a sign).
        Same values and gradients as running the two convs, without the 16-channel
        intermediate: on small_cnn's 64×1568 linear weight it was 11 of a compressor step's 15 ms."""
        e, r = self.expand.weight.view(-1), self.reduce.weight.view(-1)
        products = r * e
        return (products * (e > 0)).sum(), (products * (e < 0)).sum()

    def forward(self, tensor: torch.Tensor, base: torch.Tensor | None = None) -> torch.Tensor:
        """The generated tensor; ``base`` (target shape, dilation only): its values outside the
        block ``tensor`` covers (the top-left one) are added to the output."""
        source = as_matrices(tensor)
        m = source * self.scale.view(-1, 1, 1, 1)
        if self.expand is not None:
            up, down = self.block_slopes()
            m = m + up * F.relu(m) - down * F.relu(-m)
        m = convolve_full(m, self.kernel()) if self.transposed else correlate_valid(m, self.kernel())
        if self.config.mlr:
            m = modified_leaky_relu(m)
        if self.config.keep_norm and not self.transposed:  # same layout, so an identity stays exact
            corner = source[:, :, :m.shape[2], :m.shape[3]].contiguous()
            m = m * (corner.norm() / m.contiguous().norm().clamp_min(1e-12))
        if base is not None:
            outside = torch.ones_like(m)
            outside[:, :, :source.shape[2], :source.shape[3]] = 0.0
            m = m + as_matrices(base) * outside
        return from_matrices(m, self.target)


class WeightTransform(nn.Module):
    """One ``TensorPath`` per tensor: ``forward({name: tensor})`` -> ``{name: new tensor}``."""

    def __init__(self, source: dict[str, Shape], target: dict[str, Shape], config: BlockConfig,
                 transposed: bool = False) -> None:
        super().__init__()
        if set(source) != set(target):
            differ = sorted(set(source) ^ set(target))[:5]
            raise ValueError(f"source and target models differ in tensors: {differ}")
        self.names = sorted(source)
        self.paths = nn.ModuleDict({_key(n): TensorPath(source[n], target[n], config, transposed)
                                    for n in self.names})

    def forward(self, tensors: dict[str, torch.Tensor],
                base: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        return {name: self.paths[_key(name)](tensors[name], None if base is None else base[name])
                for name in self.names}

    def generate(self, weights: Weights, base: Weights | None = None) -> Weights:
        """The generated tensors for numpy ``weights`` (no gradients), as float32 numpy;
        ``base``: see ``TensorPath.forward``."""
        with torch.no_grad():
            out = self(to_torch(weights), None if base is None else to_torch(base))
        return to_numpy(out)


def _key(name: str) -> str:
    return name.replace(".", "__")  # ModuleDict keys cannot hold dots


def tensor_shapes(spec: dict) -> dict[str, Shape]:
    """Name -> shape of every tensor of the model ``spec`` describes."""
    return {k: tuple(v.shape) for k, v in build_model(spec).state_dict().items()
            if not k.endswith("num_batches_tracked")}


def tier_spec(global_spec: dict, ratio: float) -> dict:
    """The spec of the tier of shrinkage ratio ``ratio``: the width-shared sub-model's."""
    return width_layout(global_spec).plan(ratio).spec


def compressor(global_spec: dict, ratio: float, config: BlockConfig = DEFAULT_BLOCK,
               seed: int = 0) -> WeightTransform:
    """The compression paths from ``global_spec`` to tier ``ratio``'s model (``tier_spec``);
    ``seed`` fixes the random parts of the initialisation."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        target = tensor_shapes(tier_spec(global_spec, ratio))
        return WeightTransform(tensor_shapes(global_spec), target, config)


def train_transform(transform: WeightTransform, source: Weights, target_spec: dict, x: np.ndarray,
                    y: np.ndarray, schedule: Schedule, seed: int = 0, base: Weights | None = None) -> dict:
    """Train ``transform`` so the model ``target_spec`` with the tensors it generates from the
    frozen ``source`` weights (and frozen ``base``, see ``TensorPath.forward``) classifies
    (x, y) well; returns the last epoch's mean loss and accuracy."""
    frozen, frozen_base = to_torch(source), None if base is None else to_torch(base)
    return train_generated(lambda: transform(frozen, frozen_base), transform.parameters(), target_spec, x, y,
                           schedule, seed)


def pull_back(transform: WeightTransform, source: Weights, change: Weights) -> Weights:
    """``change`` (a change of the weights ``transform`` generated from ``source``, e.g. what a
    device's training did to its sub-model) carried back to ``source``'s shapes through the
    transposed Jacobian of the transform at ``source`` (a vector-Jacobian product: the chain
    rule's map from the sub-model's gradient to the global model's). For an untrained
    delta-initialised compressor this is zero padding."""
    inputs = {k: v.requires_grad_(True) for k, v in to_torch(source).items()}
    generated = transform(inputs)
    names = [n for n in transform.names if n in change]
    grads = torch.autograd.grad([generated[n] for n in names], [inputs[n] for n in names],
                                grad_outputs=[torch.from_numpy(np.ascontiguousarray(change[n], np.float32))
                                              for n in names], allow_unused=True)
    return {n: (np.zeros_like(source[n], np.float32) if g is None else g.numpy().astype(np.float32))
            for n, g in zip(names, grads, strict=True)}
