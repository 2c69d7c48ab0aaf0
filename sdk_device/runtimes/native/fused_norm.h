// Train-mode BatchNorm of the fused kernel set on raw float pointers (export/fused_batch_norm.py
// states the maths); included once, by fedsdk_kernels.cpp. x is (rows, C) with rows = B*H*W,
// sample b owning rows [b*hw, (b+1)*hw) and counting with weight mask[b] (0 for padding).
//
// Each direction reads the data twice: one pass of per-channel sums, one pass that writes; both
// passes are sliced over the kernels' threads (sums per sample, folded in sample order).
// Sums are over one sample's rows in float vectors (at most kChunk rows, so a partial sum holds
// few terms) folded into per-channel double totals.

#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "fused_math.h"  // parallel_slices

namespace {

constexpr int kChunk = 16;  // rows summed in float before folding into double

// total[c] += sum over rows of (a[row][c] - ka[c]) and total_ab[c] += sum of (a - ka) * (b - kb), in
// double; ka / kb null means 0. Shifting by a value near the mean keeps the one-pass variance exact.
void channel_sums(const float* a, const float* b, const float* ka, const float* kb, int rows, int c,
                  double* total, double* total_ab) {
  std::vector<float> s(c), q(c), za(c, 0.0f), zb(c, 0.0f);
  if (!ka) ka = za.data();
  if (!kb) kb = zb.data();
  for (int r0 = 0; r0 < rows; r0 += kChunk) {
    const int r1 = std::min(rows, r0 + kChunk);
    std::fill(s.begin(), s.end(), 0.0f);
    std::fill(q.begin(), q.end(), 0.0f);
    for (int r = r0; r < r1; ++r) {
      const float* ar = a + static_cast<size_t>(r) * c;
      const float* br = b + static_cast<size_t>(r) * c;
      for (int ch = 0; ch < c; ++ch) {
        const float da = ar[ch] - ka[ch];
        s[ch] += da;
        q[ch] += da * (br[ch] - kb[ch]);
      }
    }
    for (int ch = 0; ch < c; ++ch) total[ch] += s[ch], total_ab[ch] += q[ch];
  }
}

// Forward. Outputs y (rows, C), mean, invstd, new running mean/var (C,); running_* may be null.
void batch_norm_forward(const float* x, const float* weight, const float* bias, const float* mask,
                        const float* running_mean, const float* running_var, double momentum, double eps,
                        int b, int hw, int c, float* y, float* mean_out, float* invstd_out, float* new_mean,
                        float* new_var) {
  std::vector<double> sum(c, 0.0), sumsq(c, 0.0);  // of x - shift
  const bool worth = static_cast<size_t>(b) * hw * c >= kParallelFloats;
  const float* shift_row = x;  // the first counted row: near the mean
  for (int n_ = 0; n_ < b; ++n_)
    if (mask[n_] != 0.0f) {
      shift_row = x + static_cast<size_t>(n_) * hw * c;
      break;
    }
  const std::vector<float> k(shift_row, shift_row + c);
  // Per-sample sums on the threads, folded in sample order (the same bits for any thread count).
  std::vector<double> s(static_cast<size_t>(b) * c, 0.0), q(static_cast<size_t>(b) * c, 0.0);
  parallel_if(worth, b, [&](size_t, size_t begin, size_t end) {
    for (size_t n_ = begin; n_ < end; ++n_) {
      if (mask[n_] == 0.0f) continue;
      const float* xb = x + n_ * hw * c;
      channel_sums(xb, xb, k.data(), k.data(), hw, c, s.data() + n_ * c, q.data() + n_ * c);
    }
  });
  double n = 0.0;
  for (int n_ = 0; n_ < b; ++n_) {
    if (mask[n_] == 0.0f) continue;
    for (int ch = 0; ch < c; ++ch)
      sum[ch] += mask[n_] * s[static_cast<size_t>(n_) * c + ch], sumsq[ch] += mask[n_] * q[static_cast<size_t>(n_) * c + ch];
    n += static_cast<double>(mask[n_]) * hw;
  }
  std::vector<float> scale(c), shift(c);
  for (int ch = 0; ch < c; ++ch) {
    const double offset = sum[ch] / n;
    const double mean = k[ch] + offset;
    const double var = std::max(0.0, sumsq[ch] / n - offset * offset);
    const double invstd = 1.0 / std::sqrt(var + eps);
    const double unbiased = var * (n / (n - 1.0));
    mean_out[ch] = static_cast<float>(mean);
    invstd_out[ch] = static_cast<float>(invstd);
    scale[ch] = static_cast<float>(weight[ch] * invstd);
    shift[ch] = static_cast<float>(bias[ch] - mean * weight[ch] * invstd);
    new_mean[ch] = static_cast<float>(running_mean ? (1.0 - momentum) * running_mean[ch] + momentum * mean : mean);
    new_var[ch] = static_cast<float>(running_var ? (1.0 - momentum) * running_var[ch] + momentum * unbiased
                                                 : unbiased);
  }
  parallel_if(worth, static_cast<size_t>(b) * hw, [&](size_t, size_t begin, size_t end) {
    for (size_t r = begin; r < end; ++r) {
      const float* xr = x + r * c;
      float* yr = y + r * c;
      for (int ch = 0; ch < c; ++ch) yr[ch] = xr[ch] * scale[ch] + shift[ch];
    }
  });
}

// Backward: grad_input (rows, C), grad_weight = sum(g * xhat), grad_bias = sum(g) over all rows.
void batch_norm_backward(const float* g, const float* x, const float* weight, const float* mask,
                         const float* mean, const float* invstd, int b, int hw, int c, float* gx, float* gw,
                         float* gb) {
  std::vector<double> s1(c, 0.0), sgx(c, 0.0);  // sum g, sum g * (x - mean)
  const bool worth = static_cast<size_t>(b) * hw * c >= kParallelFloats;
  // Per-sample sums on the threads, folded in sample order (the same bits for any thread count).
  std::vector<double> ps(static_cast<size_t>(b) * c, 0.0), pq(static_cast<size_t>(b) * c, 0.0);
  parallel_if(worth, b, [&](size_t, size_t begin, size_t end) {
    for (size_t n_ = begin; n_ < end; ++n_) {
      const size_t at = n_ * hw * c;
      channel_sums(g + at, x + at, nullptr, mean, hw, c, ps.data() + n_ * c, pq.data() + n_ * c);
    }
  });
  double n = 0.0;
  for (int n_ = 0; n_ < b; ++n_) {
    for (int ch = 0; ch < c; ++ch) s1[ch] += ps[static_cast<size_t>(n_) * c + ch], sgx[ch] += pq[static_cast<size_t>(n_) * c + ch];
    n += static_cast<double>(mask[n_]) * hw;
  }
  std::vector<float> a(c), k1(c), k2(c);  // gx = a * g - m * (k1 + k2 * xhat)
  for (int ch = 0; ch < c; ++ch) {
    const double s2 = invstd[ch] * sgx[ch];  // sum g * xhat
    gw[ch] = static_cast<float>(s2);
    gb[ch] = static_cast<float>(s1[ch]);
    const double scale = static_cast<double>(weight[ch]) * invstd[ch];
    a[ch] = static_cast<float>(scale);
    k1[ch] = static_cast<float>(scale * s1[ch] / n);
    k2[ch] = static_cast<float>(scale * s2 / n);
  }
  parallel_if(worth, static_cast<size_t>(b) * hw, [&](size_t, size_t begin, size_t end) {
    for (size_t r = begin; r < end; ++r) {
      const float m = mask[r / hw];
      const float* gr = g + r * c;
      const float* xr = x + r * c;
      float* out = gx + r * c;
      for (int ch = 0; ch < c; ++ch) {
        const float xhat = (xr[ch] - mean[ch]) * invstd[ch];
        out[ch] = a[ch] * gr[ch] - m * (k1[ch] + k2[ch] * xhat);
      }
    }
  });
}

}  // namespace
