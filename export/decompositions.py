"""Layer operations written in the few tensor ops ExecuTorch trains correctly and fast.

ExecuTorch 1.5.1's portable kernels get several training ops wrong or slow, so the
exported programs never use them; each layer is written here in plain tensor ops whose
backward (derived by ``torch.export``'s joint graph) only needs safe, fast kernels:

* ``max_pool2d_with_indices_backward`` does not zero its output (gradients upstream of a
  max-pool were off by ~6e3) -> max-pool routes the gradient with 0/1 float masks.
* ``avg_pool2d_backward`` / ``_adaptive_avg_pool2d_backward`` have no kernel -> average
  pools are sums of window slices / a single-dimension sum.
* Train-mode BatchNorm leaves ``_native_batch_norm_legit_functional`` in the graph and
  ``to_edge`` rejects it -> BatchNorm is written out (mean, variance, scale, shift).
* The portable convolution is ~50x slower than torch -> convolution is im2col (window
  slices concatenated) + one matrix multiply, which runs in the optimized (Eigen) ``mm``.
* ``constant_pad_nd`` rejects the negative pads its own backward uses -> zero padding is
  a concatenation with zero blocks.
* Portable ``sum`` over many elements loses precision -> per-channel sums over all rows
  are matrix-vector products (``ones @ rows``), also the fastest form.
* Measured on 0.5M floats (1 thread): mul/add/relu/slice/cat 0.2-0.6 ms, sign 0.6 ms,
  but ``where`` 10-15 ms, bool->float 10 ms, ``eq``/``le`` 2 ms, ``maximum`` 3 ms, a 4-D
  permute 8.6 ms. So no ``where``/comparison is left in the backward pass: ReLU is
  ``x * sign(relu(x))`` (the mask is detached) and pooling masks are built from ``sign``.

Layout decision: activations between layers are channels-last, (B, H, W, C), and the
program's input is channels-last too (the runtime transposes the data once). Then a
convolution's im2col matrix is (B*Ho*Wo, k*k*C) without any transpose and its output
(B*Ho*Wo, O) is already the next layer's input; only ``flatten`` (which must follow
torch's (C, H, W) order) permutes back. Batch statistics use a per-sample ``mask`` (1 for
a real sample, 0 for padding) so a short last batch can be padded to the program's fixed
batch without changing any result.
"""

from __future__ import annotations

import torch

BN_EPS = 1e-5  # torch.nn.BatchNorm2d defaults
BN_MOMENTUM = 0.1
# "Wide rows" compute (W + 2*pad) output columns per row and drop 2*pad of them: cheap
# slicing but wasted multiply work, 1.5x on a 4x4 map. Below this width, 2-D windows.
WIDE_ROWS_MIN_WIDTH = 16


def pad_hw(x: torch.Tensor, top: int, bottom: int, left: int, right: int) -> torch.Tensor:
    """Zero-pad the H and W axes of a (B, H, W, C) tensor (by concatenation)."""
    b, h, w, c = x.shape
    if top or bottom:
        parts = [x.new_zeros(b, top, w, c)] if top else []
        parts += [x] + ([x.new_zeros(b, bottom, w, c)] if bottom else [])
        x = torch.cat(parts, dim=1)
        h = h + top + bottom
    if left or right:
        parts = [x.new_zeros(b, h, left, c)] if left else []
        parts += [x] + ([x.new_zeros(b, h, right, c)] if right else [])
        x = torch.cat(parts, dim=2)
    return x


def conv2d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: int, pad: int,
           groups: int) -> torch.Tensor:
    """Convolution of a (B, H, W, C) input with a torch-layout weight (O, C/groups, k, k).

    groups == 1: im2col + one matrix multiply, the bias folded in as a column of ones.
    groups == C == O (depthwise): a weighted sum of the k*k window slices.
    Otherwise: one groups == 1 convolution per group, concatenated along channels.
    Returns (B, Ho, Wo, O).
    """
    c, out_ch, k = x.shape[3], weight.shape[0], weight.shape[2]
    if groups == 1:
        return _conv_dense(x, weight, bias, k, stride, pad)
    if groups == c == out_ch:
        slices = _windows(x, k, stride, pad)
        taps = weight.reshape(out_ch, k * k)  # tap t of channel o multiplies slice t
        out = slices[0] * taps[:, 0]
        for t in range(1, k * k):
            out = out + slices[t] * taps[:, t]
        return out if bias is None else out + bias
    in_per_group, out_per_group = c // groups, out_ch // groups
    parts = []
    for g in range(groups):
        xg = x[..., g * in_per_group:(g + 1) * in_per_group]
        wg = weight[g * out_per_group:(g + 1) * out_per_group]
        bg = None if bias is None else bias[g * out_per_group:(g + 1) * out_per_group]
        parts.append(_conv_dense(xg, wg, bg, k, stride, pad))
    return torch.cat(parts, dim=3)


def _windows(x: torch.Tensor, k: int, stride: int, pad: int) -> list[torch.Tensor]:
    """The k*k shifted views of zero-padded (B, H, W, C), each (B, Ho, Wo, C), in row-major
    window order (i, j): view (i, j) holds xp[:, i + stride*r, j + stride*c, :]."""
    h, w = x.shape[1], x.shape[2]
    out_h, out_w = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    xp = pad_hw(x, pad, pad, pad, pad)
    return [xp[:, i:i + stride * (out_h - 1) + 1:stride, j:j + stride * (out_w - 1) + 1:stride, :]
            for i in range(k) for j in range(k)]


def _conv_dense(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, k: int, stride: int,
                pad: int) -> torch.Tensor:
    """groups == 1 convolution as im2col + matrix multiply.

    Stride 1 uses "wide rows": the padded image is flattened to (B, Hp*Wp, C) so that
    window (i, j) of every output position is ONE contiguous slice starting at i*Wp + j;
    the product then has Wp columns per output row, of which the last k-1 are discarded
    (one zero row at the bottom keeps the last slice in range). This halves the slicing
    work of the 2-D window views used for strides > 1 and for narrow maps (where the
    discarded columns would cost more than the slicing saves).
    """
    b, h, w, c = x.shape
    out_ch = weight.shape[0]
    out_h, out_w = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    # column (i, j, c) of the im2col matrix meets weight[o, c, i, j]
    matrix = weight.permute(0, 2, 3, 1).reshape(out_ch, k * k * c)
    if bias is not None:
        matrix = torch.cat([matrix, bias.reshape(out_ch, 1)], dim=1)
    if k == 1 and stride == 1 and pad == 0:
        pieces, rows, row_width = [x.reshape(b, h * w, c)], h * w, w
    elif stride == 1 and w >= WIDE_ROWS_MIN_WIDTH:
        row_width = w + 2 * pad
        extra_rows = 0 if k == 1 else 1
        flat = pad_hw(x, pad, pad + extra_rows, pad, pad).reshape(b, -1, c)
        rows = out_h * row_width
        pieces = [flat[:, i * row_width + j:i * row_width + j + rows, :] for i in range(k) for j in range(k)]
    else:
        pieces = [v.reshape(b, out_h * out_w, c) for v in _windows(x, k, stride, pad)]
        rows, row_width = out_h * out_w, out_w
    if bias is not None:
        pieces.append(x.new_ones(b, rows, 1))
    cols = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=2)
    out = matmul(cols.reshape(b * rows, cols.shape[2]), matrix.t()).reshape(b, out_h, row_width, out_ch)
    return out if row_width == out_w else out[:, :, :out_w, :]


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(M, K) @ (K, N) written as a one-batch ``bmm``: XNNPACK delegates ``bmm`` with both
    operands computed at run time (its ``mm`` support needs a constant right operand), and
    autograd's backward of ``bmm`` is ``bmm`` again, so forward and backward products both
    run in XNNPACK's GEMM when the program is lowered to it."""
    m, n = a.shape[0], b.shape[1]
    # reshape, not unsqueeze/squeeze: ExecuTorch turns reshapes into views, the others into copies
    return torch.bmm(a.reshape(1, m, a.shape[1]), b.reshape(1, b.shape[0], n)).reshape(m, n)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """(B, in) x (out, in) weight (+ bias) -> (B, out), through ``matmul``."""
    out = matmul(x, weight.t())
    return out if bias is None else out + bias


def relu(x: torch.Tensor) -> torch.Tensor:
    """ReLU as ``x * mask`` with a detached 0/1 mask: its backward is one multiply (torch's
    threshold_backward becomes ``le`` + ``where``, ~40x slower in ExecuTorch)."""
    return x * torch.sign(torch.relu(x.detach()))


def _first_max(candidates: list[torch.Tensor]) -> torch.Tensor:
    """Elementwise maximum of same-shape tensors; the gradient goes to the first maximum
    (torch's max_pool2d rule). ``keep`` is 1 where the winner so far is >= the candidate,
    computed exactly from ``sign(relu(candidate - winner))`` on detached values."""
    winner = candidates[0]
    for candidate in candidates[1:]:
        beaten = torch.sign(torch.relu(candidate.detach() - winner.detach()))  # 1 where candidate wins
        winner = winner * (1.0 - beaten) + candidate * beaten
    return winner


def _pool_w_then_h(x: torch.Tensor, k: int, combine) -> torch.Tensor:
    """Apply ``combine`` (a function of k same-shape tensors) over each k x k window of
    (B, H, W, C) with stride k: first across W inside each row, then across H. Row-major
    first-maximum order is preserved (first the row's first maximum, then the first row)."""
    b, h, w, c = x.shape
    out_h, out_w = h // k, w // k
    if h != out_h * k or w != out_w * k:
        x = x[:, :out_h * k, :out_w * k, :]
    # slices, not ``select``: select's backward becomes ``where`` in ExecuTorch (slow)
    across_w = x.reshape(b * out_h * k * out_w, k * c)
    rows = combine([across_w[:, j * c:(j + 1) * c] for j in range(k)])  # (B*H'*Wo, C), H' = out_h*k
    across_h = rows.reshape(b * out_h, k * out_w * c)
    width = out_w * c
    pooled = combine([across_h[:, i * width:(i + 1) * width] for i in range(k)])  # (B*Ho, Wo*C)
    return pooled.reshape(b, out_h, out_w, c)


def max_pool2d(x: torch.Tensor, k: int) -> torch.Tensor:
    """k x k max-pool with stride k of (B, H, W, C); gradient to the first maximum of each
    window in row-major order, as torch's max_pool2d."""
    return _pool_w_then_h(x, k, _first_max)


def avg_pool2d(x: torch.Tensor, k: int) -> torch.Tensor:
    """k x k average pool with stride k of (B, H, W, C)."""
    def mean(parts: list[torch.Tensor]) -> torch.Tensor:
        total = parts[0]
        for part in parts[1:]:
            total = total + part
        return total * (1.0 / k)

    return _pool_w_then_h(x, k, mean)


def global_avg_pool(x: torch.Tensor) -> torch.Tensor:
    """Mean over H and W of (B, H, W, C) -> (B, 1, 1, C) (one single-dimension sum)."""
    b, h, w, c = x.shape
    return (x.reshape(b, h * w, c).sum(dim=1) * (1.0 / (h * w))).reshape(b, 1, 1, c)


def flatten(x: torch.Tensor) -> torch.Tensor:
    """(B, H, W, C) -> (B, C*H*W) in torch's (C, H, W) order; 2-D input is returned as is."""
    if x.dim() == 2:
        return x
    b, h, w, c = x.shape
    if h * w > 1:
        x = x.permute(0, 3, 1, 2)
    return x.reshape(b, c * h * w)


def to_channels_last(t: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) -> (B, H, W, C); other ranks unchanged."""
    return t.permute(0, 2, 3, 1) if t.dim() == 4 else t


def row_mask(sample_mask: torch.Tensor, rows_per_sample: int) -> torch.Tensor:
    """(B,) sample mask -> (1, B*rows_per_sample): each sample's mask repeated over its rows."""
    b = sample_mask.shape[0]
    return sample_mask.reshape(b, 1).expand(b, rows_per_sample).reshape(1, b * rows_per_sample)


def batch_stats(x: torch.Tensor, sample_mask: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-channel statistics of (B, H, W, C) over the real samples.

    Returns (centered rows (B*H*W, C), mean (C,), biased variance (C,), count: values per
    channel as a 0-d tensor). Sums over rows are ``mask_row @ rows`` matrix products.
    """
    b, h, w, c = x.shape
    rows = x.reshape(b * h * w, c)
    weights = row_mask(sample_mask, h * w)
    count = sample_mask.sum() * (h * w)
    mean = (weights @ rows).reshape(c) / count
    centered = rows - mean
    var = (weights @ (centered * centered)).reshape(c) / count
    return centered, mean, var, count


def batch_norm_train(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, sample_mask: torch.Tensor,
                     running: tuple[torch.Tensor, torch.Tensor] | None
                     ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """Train-mode BatchNorm of (B, H, W, C) with batch statistics over the real samples.

    ``running`` = (running_mean, running_var) or None (static BN). Returns the normalised
    tensor and the updated running statistics (torch's rule: momentum 0.1, unbiased
    variance), computed without gradient.
    """
    centered, mean, var, count = batch_stats(x, sample_mask)
    scale = weight * torch.rsqrt(var + BN_EPS)
    y = (centered * scale + bias).reshape(x.shape)
    if running is None:
        return y, None
    unbiased = var.detach() * (count / (count - 1.0))
    new_mean = running[0] * (1.0 - BN_MOMENTUM) + mean.detach() * BN_MOMENTUM
    new_var = running[1] * (1.0 - BN_MOMENTUM) + unbiased * BN_MOMENTUM
    return y, (new_mean, new_var)


def batch_norm_eval(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, running_mean: torch.Tensor,
                    running_var: torch.Tensor) -> torch.Tensor:
    """Eval-mode BatchNorm of (B, H, W, C) with running statistics."""
    scale = weight * torch.rsqrt(running_var + BN_EPS)
    return (x - running_mean) * scale + bias
