// The maths of the fused training kernels on raw float pointers (no ExecuTorch types); included
// once, by fedsdk_kernels.cpp. Layouts: activations channels-last (B,H,W,C), weights (O,C,k,k).

#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#define FK_INLINE static inline __attribute__((always_inline))

namespace {

constexpr int kBlock = 16;  // output channels per register block
constexpr int kRows = 6;    // input channels per grad-weight block (12 FMA chains)

// The kernels' threads (fedsdk_kernels.cpp: ExecuTorch's shared threadpool, sized by the runtime).
int worker_count();
void run_tasks(size_t tasks, void (*body)(void*, size_t), void* context);

// body(part, begin, end) for `parts` contiguous slices of [0, n), on the kernels' threads. Every
// caller makes each output element's arithmetic independent of the slicing, so results are the
// same bits for any thread count.
template <class Body>
void parallel_slices(size_t n, Body&& body) {
  const size_t parts = std::min(n, static_cast<size_t>(std::max(1, worker_count())));
  auto slice = [&](size_t part) { body(part, n * part / parts, n * (part + 1) / parts); };
  if (parts <= 1) {
    if (n) slice(0);
    return;
  }
  using Slice = std::remove_reference_t<decltype(slice)>;
  run_tasks(parts, [](void* context, size_t part) { (*static_cast<Slice*>(context))(part); }, &slice);
}

struct Geometry {
  int b, h, w, c, o, k, stride, pad, ho, wo;
};

Geometry geometry(int b, int h, int w, int c, int o, int k, int stride, int pad) {
  return {b, h, w, c, o, k, stride, pad, (h + 2 * pad - k) / stride + 1, (w + 2 * pad - k) / stride + 1};
}

// 8-float vectors (GCC vector extensions): two SSE / one AVX / two NEON registers, whichever
// the clone is compiled for. Unaligned, may alias float.
typedef float v8 __attribute__((vector_size(32)));
typedef float v8u __attribute__((vector_size(32), aligned(4), may_alias));
FK_INLINE v8 load8(const float* p) { return *reinterpret_cast<const v8u*>(p); }
FK_INLINE void store8(float* p, v8 v) { *reinterpret_cast<v8u*>(p) = v; }

// out[n] = init[n] + sum_t sum_m src[t][m] * wt[t][m * N + n], n in [n0, n0 + 16). Four
// partial sums over m keep eight independent FMA chains in flight (one chain is
// latency-bound at a quarter of the FMA throughput).
FK_INLINE void gather_block(const float* const* src, const float* const* wt, int taps, int m_count, int n_count,
                            int n0, const float* init, float* out) {
  v8 a0 = {}, a1 = {}, b0 = {}, b1 = {}, c0 = {}, c1 = {}, d0 = {}, d1 = {};
  const size_t stride = n_count;
  for (int tap = 0; tap < taps; ++tap) {
    const float* s = src[tap];
    const float* w = wt[tap] + n0;
    int m = 0;
    for (; m + 4 <= m_count; m += 4, w += 4 * stride) {
      a0 += s[m] * load8(w);
      a1 += s[m] * load8(w + 8);
      b0 += s[m + 1] * load8(w + stride);
      b1 += s[m + 1] * load8(w + stride + 8);
      c0 += s[m + 2] * load8(w + 2 * stride);
      c1 += s[m + 2] * load8(w + 2 * stride + 8);
      d0 += s[m + 3] * load8(w + 3 * stride);
      d1 += s[m + 3] * load8(w + 3 * stride + 8);
    }
    for (; m < m_count; ++m, w += stride) {
      a0 += s[m] * load8(w);
      a1 += s[m] * load8(w + 8);
    }
  }
  v8 lo = (a0 + b0) + (c0 + d0), hi = (a1 + b1) + (c1 + d1);
  if (init) {
    lo += load8(init + n0);
    hi += load8(init + n0 + 8);
  }
  store8(out + n0, lo);
  store8(out + n0 + 8, hi);
}

FK_INLINE void gather_tail(const float* const* src, const float* const* wt, int taps, int m_count, int n_count,
                           int n0, const float* init, float* out) {
  for (int n = n0; n < n_count; ++n) {
    float acc = init ? init[n] : 0.0f;
    for (int tap = 0; tap < taps; ++tap)
      for (int m = 0; m < m_count; ++m) acc += src[tap][m] * wt[tap][static_cast<size_t>(m) * n_count + n];
    out[n] = acc;
  }
}

void gather_pixel(const float* const* src, const float* const* wt, int taps, int m_count, int n_count,
                         const float* init, float* out) {
  int n0 = 0;
  for (; n0 + kBlock <= n_count; n0 += kBlock) gather_block(src, wt, taps, m_count, n_count, n0, init, out);
  if (n0 < n_count) gather_tail(src, wt, taps, m_count, n_count, n0, init, out);
}

// out[p][n0..n0+16) = init + sum_t sum_m win[p][off[t] + m] * wt[t][m * N + n] for P pixels whose
// windows start at win[p] (any pixels: the tap offsets off[t] are the same for all of them).
// 2P accumulators: P = kPixels keeps 12 FMA chains in flight, enough to hide the FMA latency
// (8 chains were not); each output's sum runs in one fixed order (taps, then m) for every P.
constexpr int kPixels = 6;

template <int P>
FK_INLINE void gather_pixels(const float* const* win, const size_t* off, const float* const* wt, int taps,
                             int m_count, int n_count, int n0, const float* init, float* const* out) {
  v8 lo[P], hi[P];
  for (int p = 0; p < P; ++p) lo[p] = v8{}, hi[p] = v8{};
  const size_t stride = n_count;
  for (int tap = 0; tap < taps; ++tap) {
    const float* s[P];
    for (int p = 0; p < P; ++p) s[p] = win[p] + off[tap];
    const float* w = wt[tap] + n0;
    for (int m = 0; m < m_count; ++m, w += stride) {
      const v8 w0 = load8(w), w1 = load8(w + 8);
      for (int p = 0; p < P; ++p) {
        lo[p] += s[p][m] * w0;
        hi[p] += s[p][m] * w1;
      }
    }
  }
  for (int p = 0; p < P; ++p) {
    if (init) lo[p] += load8(init + n0), hi[p] += load8(init + n0 + 8);
    store8(out[p] + n0, lo[p]);
    store8(out[p] + n0 + 8, hi[p]);
  }
}

void gather_pixels_any(int pixels, const float* const* win, const size_t* off, const float* const* wt, int taps,
                       int m_count, int n_count, int n0, const float* init, float* const* out) {
  switch (pixels) {
    case 6: return gather_pixels<6>(win, off, wt, taps, m_count, n_count, n0, init, out);
    case 5: return gather_pixels<5>(win, off, wt, taps, m_count, n_count, n0, init, out);
    case 4: return gather_pixels<4>(win, off, wt, taps, m_count, n_count, n0, init, out);
    case 3: return gather_pixels<3>(win, off, wt, taps, m_count, n_count, n0, init, out);
    case 2: return gather_pixels<2>(win, off, wt, taps, m_count, n_count, n0, init, out);
    default: return gather_pixels<1>(win, off, wt, taps, m_count, n_count, n0, init, out);
  }
}

// x (B,H,W,C) with `pad` zero rows and columns on every side: (B,H+2p,W+2p,C).
std::vector<float> zero_padded(const float* x, int b, int h, int w, int c, int pad) {
  const int hp = h + 2 * pad, wp = w + 2 * pad;
  std::vector<float> padded(static_cast<size_t>(b) * hp * wp * c, 0.0f);
  const size_t row = static_cast<size_t>(w) * c;
  for (int n = 0; n < b; ++n)
    for (int y = 0; y < h; ++y)
      std::copy(x + (static_cast<size_t>(n) * h + y) * row, x + (static_cast<size_t>(n) * h + y + 1) * row,
                padded.data() + ((static_cast<size_t>(n) * hp + y + pad) * wp + pad) * c);
  return padded;
}

// The gather convolution on a packed weight wf = [tap][c][o]: out (B,Ho,Wo,O). Output pixels
// (b, oh, ow) are sliced over threads and taken kPixels at a time. A padded input is first copied
// into a zero-bordered buffer, so every pixel has all k*k taps at the same offsets from its window
// (on 4x4 and 8x8 maps the border pixels are most of the map; the zero taps add exact zeros).
void conv_packed(const Geometry& g, const float* x, const float* wf, const float* bias, float* out) {
  if (g.pad > 0) {
    const std::vector<float> padded = zero_padded(x, g.b, g.h, g.w, g.c, g.pad);
    conv_packed(geometry(g.b, g.h + 2 * g.pad, g.w + 2 * g.pad, g.c, g.o, g.k, g.stride, 0), padded.data(), wf,
                bias, out);
    return;
  }
  const int kk = g.k * g.k;
  std::vector<size_t> off(kk);
  for (int t = 0; t < kk; ++t) off[t] = (static_cast<size_t>(t / g.k) * g.w + t % g.k) * g.c;
  parallel_slices(static_cast<size_t>(g.b) * g.ho * g.wo, [&](size_t, size_t begin, size_t end) {
    std::vector<const float*> wt(kk);
    for (int t = 0; t < kk; ++t) wt[t] = wf + static_cast<size_t>(t) * g.c * g.o;
    const float* win[kPixels];
    float* dst[kPixels];
    // One block of output channels over all of the slice's pixels, then the next: the block's
    // weights (taps x C x 16 floats) stay in cache for all of them.
    for (int n0 = 0; n0 < g.o; n0 += kBlock) {
      for (size_t q = begin; q < end; q += kPixels) {
        const int pixels = static_cast<int>(std::min<size_t>(kPixels, end - q));
        for (int p = 0; p < pixels; ++p) {
          const size_t pixel = q + p, b = pixel / (static_cast<size_t>(g.ho) * g.wo);
          const int oh = static_cast<int>(pixel / g.wo % g.ho), ow = static_cast<int>(pixel % g.wo);
          win[p] = x + ((b * g.h + oh * g.stride) * g.w + ow * g.stride) * g.c;
          dst[p] = out + pixel * g.o;
        }
        if (n0 + kBlock <= g.o) {
          gather_pixels_any(pixels, win, off.data(), wt.data(), kk, g.c, g.o, n0, bias, dst);
          continue;
        }
        for (int p = 0; p < pixels; ++p)
          for (int n = n0; n < g.o; ++n) {
            float acc = bias ? bias[n] : 0.0f;
            for (int t = 0; t < kk; ++t)
              for (int m = 0; m < g.c; ++m) acc += win[p][off[t] + m] * wt[t][static_cast<size_t>(m) * g.o + n];
            dst[p][n] = acc;
          }
      }
    }
  });
}

// Forward: out (B,Ho,Wo,O); the weight packed as [tap][c][o].
void conv_forward(const Geometry& g, const float* x, const float* weight, const float* bias, float* out) {
  const int kk = g.k * g.k;
  std::vector<float> wf(static_cast<size_t>(kk) * g.c * g.o);
  for (int o = 0; o < g.o; ++o)
    for (int c = 0; c < g.c; ++c)
      for (int t = 0; t < kk; ++t) wf[(static_cast<size_t>(t) * g.c + c) * g.o + o] = weight[(static_cast<size_t>(o) * g.c + c) * kk + t];
  conv_packed(g, x, wf.data(), bias, out);
}

// Stride-1 grad-input is itself a convolution: of grad_out padded by k-1-pad with the weight
// flipped in both spatial axes and its channels swapped, packed as [flipped tap][o][c].
void conv_grad_input_stride1(const Geometry& g, const float* gy, const float* weight, float* gx) {
  const int kk = g.k * g.k;
  std::vector<float> wg(static_cast<size_t>(kk) * g.o * g.c);
  for (int o = 0; o < g.o; ++o)
    for (int c = 0; c < g.c; ++c)
      for (int t = 0; t < kk; ++t)
        wg[(static_cast<size_t>(kk - 1 - t) * g.o + o) * g.c + c] = weight[(static_cast<size_t>(o) * g.c + c) * kk + t];
  conv_packed(geometry(g.b, g.ho, g.wo, g.o, g.c, g.k, 1, g.k - 1 - g.pad), gy, wg.data(), nullptr, gx);
}

// Grad-input: the adjoint gather; wg = weight as [tap][o][c]. Input rows (b, ih) are sliced over
// threads. Stride 1 (pad < k) goes through conv_grad_input_stride1.
void conv_grad_input(const Geometry& g, const float* gy, const float* weight, float* gx) {
  if (g.stride == 1 && g.pad < g.k) return conv_grad_input_stride1(g, gy, weight, gx);
  const int kk = g.k * g.k;
  std::vector<float> wg(static_cast<size_t>(kk) * g.o * g.c);
  for (int o = 0; o < g.o; ++o)
    for (int c = 0; c < g.c; ++c)
      for (int t = 0; t < kk; ++t) wg[(static_cast<size_t>(t) * g.o + o) * g.c + c] = weight[(static_cast<size_t>(o) * g.c + c) * kk + t];
  parallel_slices(static_cast<size_t>(g.b) * g.h, [&](size_t, size_t begin, size_t end) {
    std::vector<const float*> src(kk), wt(kk);
    for (size_t row = begin; row < end; ++row) {
      const int b = static_cast<int>(row / g.h), ih = static_cast<int>(row % g.h);
      for (int iw = 0; iw < g.w; ++iw) {
        int taps = 0;
        for (int i = 0; i < g.k; ++i) {
          const int sh = ih + g.pad - i;  // = oh * stride
          if (sh < 0 || sh % g.stride || sh / g.stride >= g.ho) continue;
          for (int j = 0; j < g.k; ++j) {
            const int sw = iw + g.pad - j;
            if (sw < 0 || sw % g.stride || sw / g.stride >= g.wo) continue;
            src[taps] = gy + ((static_cast<size_t>(b) * g.ho + sh / g.stride) * g.wo + sw / g.stride) * g.o;
            wt[taps++] = wg.data() + static_cast<size_t>(i * g.k + j) * g.o * g.c;
          }
        }
        gather_pixel(src.data(), wt.data(), taps, g.o, g.c, nullptr, gx + ((static_cast<size_t>(b) * g.h + ih) * g.w + iw) * g.c);
      }
    }
  });
}

// acc[r][t] += x[line][col][c0 + r] * gy[line][col][o0 + t] over lines x cols (steps x_step / g_step
// per column, x_line / g_line per line), summed in registers (not through the pointer).
template <int R, int NB>
FK_INLINE void outer_rows(const float* xp, size_t x_step, size_t x_line, const float* gp, size_t g_step,
                          size_t g_line, int lines, int cols, int nb, float (*acc)[kBlock]) {
  if constexpr (NB == kBlock) {
    v8 lo[R], hi[R];
    for (int r = 0; r < R; ++r) lo[r] = load8(acc[r]), hi[r] = load8(acc[r] + 8);
    for (int line = 0; line < lines; ++line, xp += x_line, gp += g_line) {
      const float *xc = xp, *gc = gp;
      for (int col = 0; col < cols; ++col, xc += x_step, gc += g_step) {
        const v8 g0 = load8(gc), g1 = load8(gc + 8);
        for (int r = 0; r < R; ++r) {
          lo[r] += xc[r] * g0;
          hi[r] += xc[r] * g1;
        }
      }
    }
    for (int r = 0; r < R; ++r) store8(acc[r], lo[r]), store8(acc[r] + 8, hi[r]);
  } else {
    for (int line = 0; line < lines; ++line, xp += x_line, gp += g_line)
      for (int col = 0; col < cols; ++col)
        for (int r = 0; r < R; ++r)
          for (int t = 0; t < nb; ++t) acc[r][t] += xp[col * x_step + r] * gp[col * g_step + t];
  }
}

template <int NB>
FK_INLINE void outer_dispatch(int rows, const float* xp, size_t x_step, size_t x_line, const float* gp,
                              size_t g_step, size_t g_line, int lines, int cols, int nb, float (*acc)[kBlock]) {
  switch (rows) {
    case 6: outer_rows<6, NB>(xp, x_step, x_line, gp, g_step, g_line, lines, cols, nb, acc); break;
    case 5: outer_rows<5, NB>(xp, x_step, x_line, gp, g_step, g_line, lines, cols, nb, acc); break;
    case 4: outer_rows<4, NB>(xp, x_step, x_line, gp, g_step, g_line, lines, cols, nb, acc); break;
    case 3: outer_rows<3, NB>(xp, x_step, x_line, gp, g_step, g_line, lines, cols, nb, acc); break;
    case 2: outer_rows<2, NB>(xp, x_step, x_line, gp, g_step, g_line, lines, cols, nb, acc); break;
    default: outer_rows<1, NB>(xp, x_step, x_line, gp, g_step, g_line, lines, cols, nb, acc); break;
  }
}

// One sample's contribution to grad-weight block (tap (i, j), channels c0.., outputs o0..) over the
// output pixels whose input pixel for this tap is inside the image.
void grad_weight_block(const Geometry& g, const float* x, const float* gy, int i, int j, int c0, int rows,
                       int o0, int nb, float (*acc)[kBlock]) {
  const int ow_lo = std::max(0, (g.pad - j + g.stride - 1) / g.stride);
  const int ow_hi = std::min(g.wo, (g.w - 1 + g.pad - j) / g.stride + 1);
  const int oh_lo = std::max(0, (g.pad - i + g.stride - 1) / g.stride);
  const int oh_hi = std::min(g.ho, (g.h - 1 + g.pad - i) / g.stride + 1);
  if (ow_hi <= ow_lo || oh_hi <= oh_lo) return;
  const float* xp = x + (static_cast<size_t>(oh_lo * g.stride - g.pad + i) * g.w + ow_lo * g.stride - g.pad + j) * g.c + c0;
  const float* gp = gy + (static_cast<size_t>(oh_lo) * g.wo + ow_lo) * g.o + o0;
  const size_t x_step = static_cast<size_t>(g.stride) * g.c, x_line = static_cast<size_t>(g.stride) * g.w * g.c;
  const size_t g_line = static_cast<size_t>(g.wo) * g.o;
  if (nb == kBlock)
    outer_dispatch<kBlock>(rows, xp, x_step, x_line, gp, g.o, g_line, oh_hi - oh_lo, ow_hi - ow_lo, nb, acc);
  else
    outer_dispatch<0>(rows, xp, x_step, x_line, gp, g.o, g_line, oh_hi - oh_lo, ow_hi - ow_lo, nb, acc);
}

// grad_weight (O,C,k,k) and grad_bias (O,), sums over sample groups in double. The blocks (tap, input
// channels, output channels) are sliced over the threads; each slice walks the samples in order.
void conv_grad_weight(const Geometry& g, const float* x, const float* gy, float* gw, float* gb) {
  const int kk = g.k * g.k;
  std::vector<double> total(static_cast<size_t>(kk) * g.c * g.o, 0.0), bias_total(g.o, 0.0);
  const size_t x_sample = static_cast<size_t>(g.h) * g.w * g.c, g_sample = static_cast<size_t>(g.ho) * g.wo * g.o;
  const int c_blocks = (g.c + kRows - 1) / kRows, o_blocks = (g.o + kBlock - 1) / kBlock;
  // Samples summed in float per group of ~256 output pixels (4x4 maps: 16 samples), groups in double.
  const int group = std::max(1, 256 / std::max(1, g.ho * g.wo));
  parallel_slices(static_cast<size_t>(kk) * c_blocks * o_blocks, [&](size_t, size_t begin, size_t end) {
    for (int b0 = 0; b0 < g.b; b0 += group)
      for (size_t block = begin; block < end; ++block) {
        const int tap = static_cast<int>(block / (c_blocks * o_blocks)), i = tap / g.k, j = tap % g.k;
        const int c0 = static_cast<int>(block / o_blocks % c_blocks) * kRows;
        const int o0 = static_cast<int>(block % o_blocks) * kBlock;
        const int rows = std::min(kRows, g.c - c0), nb = std::min(kBlock, g.o - o0);
        float acc[kRows][kBlock] = {};
        for (int b = b0; b < std::min(g.b, b0 + group); ++b)
          grad_weight_block(g, x + b * x_sample, gy + b * g_sample, i, j, c0, rows, o0, nb, acc);
        for (int r = 0; r < rows; ++r)
          for (int t = 0; t < nb; ++t) total[(static_cast<size_t>(tap) * g.c + c0 + r) * g.o + o0 + t] += acc[r][t];
      }
  });
  for (int b = 0; b < g.b; ++b)
    for (size_t p = 0; p < static_cast<size_t>(g.ho) * g.wo; ++p)
      for (int o = 0; o < g.o; ++o) bias_total[o] += gy[b * g_sample + p * g.o + o];
  for (int o = 0; o < g.o; ++o) {
    for (int c = 0; c < g.c; ++c)
      for (int t = 0; t < kk; ++t)
        gw[(static_cast<size_t>(o) * g.c + c) * kk + t] = static_cast<float>(total[(static_cast<size_t>(t) * g.c + c) * g.o + o]);
    if (gb) gb[o] = static_cast<float>(bias_total[o]);
  }
}

void rectify(const float* x, float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

void rectify_backward(const float* g, const float* y, float* gx, size_t n) {
  for (size_t i = 0; i < n; ++i) gx[i] = y[i] > 0.0f ? g[i] : 0.0f;
}

// Max over each k x k window (stride k) of (B,H,W,C); a later element wins only if greater.
void max_pool(const float* x, float* out, int b, int h, int w, int c, int k) {
  const int ho = h / k, wo = w / k;
  for (int n = 0; n < b; ++n)
    for (int oh = 0; oh < ho; ++oh)
      for (int ow = 0; ow < wo; ++ow) {
        float* dst = out + ((static_cast<size_t>(n) * ho + oh) * wo + ow) * c;
        const float* first = x + ((static_cast<size_t>(n) * h + oh * k) * w + ow * k) * c;
        std::copy(first, first + c, dst);
        for (int i = 0; i < k; ++i)
          for (int j = 0; j < k; ++j) {
            if (i == 0 && j == 0) continue;
            const float* src = first + (static_cast<size_t>(i) * w + j) * c;
            for (int ch = 0; ch < c; ++ch) dst[ch] = src[ch] > dst[ch] ? src[ch] : dst[ch];
          }
      }
}

// The gradient of max_pool: each window's grad to its first maximum (row-major), zeros elsewhere.
void max_pool_backward(const float* g, const float* x, float* gx, int b, int h, int w, int c, int k) {
  const int ho = h / k, wo = w / k;
  std::fill(gx, gx + static_cast<size_t>(b) * h * w * c, 0.0f);
  std::vector<float> best(c);
  std::vector<size_t> where(c);
  for (int n = 0; n < b; ++n)
    for (int oh = 0; oh < ho; ++oh)
      for (int ow = 0; ow < wo; ++ow) {
        const size_t base = ((static_cast<size_t>(n) * h + oh * k) * w + ow * k) * c;
        for (int ch = 0; ch < c; ++ch) best[ch] = x[base + ch], where[ch] = base + ch;
        for (int i = 0; i < k; ++i)
          for (int j = 0; j < k; ++j) {
            const size_t at = base + (static_cast<size_t>(i) * w + j) * c;
            for (int ch = 0; ch < c; ++ch)
              if (x[at + ch] > best[ch]) best[ch] = x[at + ch], where[ch] = at + ch;
          }
        const float* src = g + ((static_cast<size_t>(n) * ho + oh) * wo + ow) * c;
        for (int ch = 0; ch < c; ++ch) gx[where[ch]] = src[ch];
      }
}

}  // namespace
