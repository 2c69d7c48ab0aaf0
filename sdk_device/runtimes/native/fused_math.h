// The maths of the fused training kernels on raw float pointers (no ExecuTorch types); included
// once, by fedsdk_kernels.cpp. Layouts: activations channels-last (B,H,W,C), weights (O,C,k,k).

#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>
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
// Slices per thread: more slices than threads let a thread that is on time take the slices of one
// that is not (ExecuTorch's pool steals work): on a loaded machine a woken worker can wait a
// scheduler slice for its core, and with one slice per thread the caller waited that long.
constexpr size_t kSlicesPerThread = 8;

template <class Body>
void parallel_slices(size_t n, Body&& body) {
  const size_t workers = static_cast<size_t>(std::max(1, worker_count()));
  const size_t parts = std::min(n, workers > 1 ? workers * kSlicesPerThread : 1);
  auto slice = [&](size_t part) { body(part, n * part / parts, n * (part + 1) / parts); };
  if (parts <= 1) {
    if (n) slice(0);
    return;
  }
  using Slice = std::remove_reference_t<decltype(slice)>;
  run_tasks(parts, [](void* context, size_t part) { (*static_cast<Slice*>(context))(part); }, &slice);
}

// Memory-bound passes (packing, elementwise ops, sums) go to the threads only from this many floats:
// a pool dispatch costs tens of microseconds, and on a loaded machine waking a descheduled worker
// can cost more than the pass.
constexpr size_t kParallelFloats = 131072;

// parallel_slices when `worth` (the pass is big enough), else body(0, 0, n) on this thread.
template <class Body>
void parallel_if(bool worth, size_t n, Body&& body) {
  if (worth) return parallel_slices(n, body);
  if (n) body(0, 0, n);
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

// out[p][n0..n0+8V) (+)= sum_t sum_{m in [m0, m1)} win[p][off[t] + m] * wt[t][m * N + n], then + init
// (or, `accumulate`, + out's previous value), for P pixels whose windows start at win[p] (any pixels
// with the same tap set: the offsets off[t] are the same for all of them). P x V accumulators: P =
// kPixels, V = 2 keeps 12 FMA chains in flight, enough to hide the FMA latency (8 chains were not);
// V = 4 (32 channels, 24 accumulators) needs 32 vector registers (AVX-512VL) and loads each input
// value once per 32 outputs instead of 16. Each output's sum runs in one fixed order (taps, then m)
// for every P and V.
constexpr int kPixels = 6;
#if defined(__AVX512VL__)
constexpr int kWideBlock = 4;  // v8 vectors per pixel in the widest block
#else
constexpr int kWideBlock = 2;
#endif

template <int P, int V>
FK_INLINE void gather_pixels(const float* const* win, const ptrdiff_t* off, const float* const* wt, int taps,
                             int m0, int m1, int n_count, int n0, const float* init, bool accumulate,
                             float* const* out) {
  v8 acc[P][V];
  for (int p = 0; p < P; ++p)
    for (int v = 0; v < V; ++v) acc[p][v] = v8{};
  const size_t stride = n_count;
  for (int tap = 0; tap < taps; ++tap) {
    const float* s[P];
    for (int p = 0; p < P; ++p) s[p] = win[p] + off[tap];
    const float* w = wt[tap] + static_cast<size_t>(m0) * stride + n0;
    for (int m = m0; m < m1; ++m, w += stride) {
      v8 wv[V];
      for (int v = 0; v < V; ++v) wv[v] = load8(w + 8 * v);
      for (int p = 0; p < P; ++p) {
        const float sp = s[p][m];
        for (int v = 0; v < V; ++v) acc[p][v] += sp * wv[v];
      }
    }
  }
  for (int p = 0; p < P; ++p)
    for (int v = 0; v < V; ++v) {
      if (accumulate)
        acc[p][v] += load8(out[p] + n0 + 8 * v);
      else if (init)
        acc[p][v] += load8(init + n0 + 8 * v);
      store8(out[p] + n0 + 8 * v, acc[p][v]);
    }
}

template <int V>
void gather_pixels_any(int pixels, const float* const* win, const ptrdiff_t* off, const float* const* wt, int taps,
                       int m0, int m1, int n_count, int n0, const float* init, bool accumulate, float* const* out) {
  switch (pixels) {
    case 6: return gather_pixels<6, V>(win, off, wt, taps, m0, m1, n_count, n0, init, accumulate, out);
    case 5: return gather_pixels<5, V>(win, off, wt, taps, m0, m1, n_count, n0, init, accumulate, out);
    case 4: return gather_pixels<4, V>(win, off, wt, taps, m0, m1, n_count, n0, init, accumulate, out);
    case 3: return gather_pixels<3, V>(win, off, wt, taps, m0, m1, n_count, n0, init, accumulate, out);
    case 2: return gather_pixels<2, V>(win, off, wt, taps, m0, m1, n_count, n0, init, accumulate, out);
    default: return gather_pixels<1, V>(win, off, wt, taps, m0, m1, n_count, n0, init, accumulate, out);
  }
}

// A gather convolution: out (B, rows, cols, N)[b][r][q] = init + sum over the valid taps (i, j) of
// src (B, src_rows, src_cols, M)[b][row_base[r] + row_off[i]][col_base[q] + col_off[j]] x
// weight [i * k + j] (M, N). The forward convolution and its adjoint (grad-input, any stride) are
// both of this form. Only valid taps are summed (no zero padding, no zero taps: on a 4x4 map with
// 3x3 taps, border pixels are most of the map); output pixels are grouped into classes with the
// same valid tap set (row mask x column mask) so 6 of them can share one register block.
struct Gather {
  int b, rows, cols, m, n, k, src_rows, src_cols;
  std::vector<int> row_base, col_base;            // per output row / column
  std::vector<uint64_t> row_mask, col_mask;       // valid taps i (j) of each output row (column)
  std::vector<int> row_off, col_off;              // per tap index i (j)
};

// The forward convolution of g as a Gather (M = C, N = O).
Gather forward_gather(const Geometry& g) {
  Gather q{g.b, g.ho, g.wo, g.c, g.o, g.k, g.h, g.w, {}, {}, {}, {}, {}, {}};
  auto axis = [&](int out_size, int in_size, std::vector<int>& base, std::vector<uint64_t>& mask,
                  std::vector<int>& off) {
    for (int i = 0; i < g.k; ++i) off.push_back(i);
    for (int o = 0; o < out_size; ++o) {
      base.push_back(o * g.stride - g.pad);
      uint64_t bits = 0;
      for (int i = 0; i < g.k; ++i)
        if (base.back() + i >= 0 && base.back() + i < in_size) bits |= uint64_t{1} << i;
      mask.push_back(bits);
    }
  };
  axis(g.ho, g.h, q.row_base, q.row_mask, q.row_off);
  axis(g.wo, g.w, q.col_base, q.col_mask, q.col_off);
  return q;
}

// The adjoint (grad-input) of g as a Gather (M = O, N = C): input pixel ih gets tap i from output
// row oh = (ih + pad - i) / stride when that divides and is in range; then oh = (ih + pad) / stride -
// i / stride, so a pixel's window starts at row (ih + pad) / stride and tap i is -(i / stride) rows away.
Gather adjoint_gather(const Geometry& g) {
  Gather q{g.b, g.h, g.w, g.o, g.c, g.k, g.ho, g.wo, {}, {}, {}, {}, {}, {}};
  auto axis = [&](int in_size, int out_size, std::vector<int>& base, std::vector<uint64_t>& mask,
                  std::vector<int>& off) {
    for (int i = 0; i < g.k; ++i) off.push_back(-(i / g.stride));
    for (int x = 0; x < in_size; ++x) {
      base.push_back((x + g.pad) / g.stride);
      uint64_t bits = 0;
      for (int i = 0; i < g.k; ++i) {
        const int s = x + g.pad - i;
        if (s >= 0 && s % g.stride == 0 && s / g.stride < out_size) bits |= uint64_t{1} << i;
      }
      mask.push_back(bits);
    }
  };
  axis(g.h, g.ho, q.row_base, q.row_mask, q.row_off);
  axis(g.w, g.wo, q.col_base, q.col_mask, q.col_off);
  return q;
}

// Reduction channels per pass: up to 160 KB of weights (taps x chunk x block floats) in one pass,
// else passes of ~144 KB (L2-resident for all of a slice's pixels); passes after the first add to
// the output. Measured on 4x4 / 8x8 / 16x16 VGG layers (Zen 4): L1-sized passes (18 KB) were
// 10-20 % slower, one pass over 256 x 256 x 3 x 3 weights (295 KB) ~15 % slower.
int reduction_chunk(int taps, int m, int width) {
  const int per_channel = std::max(1, taps) * width * 4;
  return per_channel * m <= 163840 ? m : std::max(8, 147456 / per_channel);
}

// Runs q on the packed weight wp = [tap][m][n]: out (B, rows, cols, N), init (N,) or null. Output
// pixels ordered by tap class are sliced over threads; each output's sum runs in one order (chunks,
// taps, m) whatever the slicing.
void run_gather(const Gather& q, const float* src, const float* wp, const float* init, float* out) {
  // Distinct row and column masks, in order of first appearance.
  std::vector<uint64_t> row_kinds, col_kinds;
  for (uint64_t bits : q.row_mask)
    if (std::find(row_kinds.begin(), row_kinds.end(), bits) == row_kinds.end()) row_kinds.push_back(bits);
  for (uint64_t bits : q.col_mask)
    if (std::find(col_kinds.begin(), col_kinds.end(), bits) == col_kinds.end()) col_kinds.push_back(bits);
  struct Class {
    size_t end;                      // one past its last entry in `pixels`
    std::vector<ptrdiff_t> off;      // per valid tap, from the pixel's window start
    std::vector<const float*> wt;    // per valid tap
  };
  std::vector<Class> classes;
  std::vector<uint32_t> pixels;   // (b * rows + r) * cols + c
  std::vector<ptrdiff_t> windows;  // the pixel's window start in src
  pixels.reserve(static_cast<size_t>(q.b) * q.rows * q.cols);
  windows.reserve(pixels.capacity());
  for (uint64_t rk : row_kinds)
    for (uint64_t ck : col_kinds) {
      Class cls;
      for (int i = 0; i < q.k; ++i)
        for (int j = 0; j < q.k; ++j)
          if ((rk >> i & 1) && (ck >> j & 1)) {
            cls.off.push_back((static_cast<ptrdiff_t>(q.row_off[i]) * q.src_cols + q.col_off[j]) * q.m);
            cls.wt.push_back(wp + static_cast<size_t>(i * q.k + j) * q.m * q.n);
          }
      for (int bb = 0; bb < q.b; ++bb)
        for (int r = 0; r < q.rows; ++r) {
          if (q.row_mask[r] != rk) continue;
          const ptrdiff_t row_start = (static_cast<ptrdiff_t>(bb) * q.src_rows + q.row_base[r]) * q.src_cols;
          for (int c = 0; c < q.cols; ++c)
            if (q.col_mask[c] == ck) {
              pixels.push_back(static_cast<uint32_t>((bb * q.rows + r) * q.cols + c));
              windows.push_back((row_start + q.col_base[c]) * q.m);
            }
        }
      cls.end = pixels.size();
      if (classes.empty() || cls.end > classes.back().end) classes.push_back(std::move(cls));
    }
  parallel_slices(pixels.size(), [&](size_t, size_t begin, size_t end) {
    const float* win[kPixels];
    float* dst[kPixels];
    for (int n0 = 0; n0 < q.n;) {
      const int width = n0 + 8 * kWideBlock <= q.n ? 8 * kWideBlock : kBlock;
      const bool full = n0 + width <= q.n;
      const int chunk = reduction_chunk(q.k * q.k, q.m, width);
      for (int m0 = 0; m0 < std::max(q.m, 1); m0 += chunk) {
        const int m1 = std::min(q.m, m0 + chunk);
        size_t cls = 0;
        for (size_t at = begin; at < end;) {
          while (classes[cls].end <= at) ++cls;
          const Class& k = classes[cls];
          const int count = static_cast<int>(std::min<size_t>({static_cast<size_t>(kPixels), end - at, k.end - at}));
          for (int p = 0; p < count; ++p) {
            win[p] = src + windows[at + p];
            dst[p] = out + static_cast<size_t>(pixels[at + p]) * q.n;
          }
          at += count;
          if (full && width > kBlock) {
            gather_pixels_any<kWideBlock>(count, win, k.off.data(), k.wt.data(), static_cast<int>(k.off.size()), m0, m1,
                                          q.n, n0, init, m0 > 0, dst);
            continue;
          }
          if (full) {
            gather_pixels_any<2>(count, win, k.off.data(), k.wt.data(), static_cast<int>(k.off.size()), m0, m1, q.n, n0,
                              init, m0 > 0, dst);
            continue;
          }
          if (m0 > 0) continue;  // the channel tail sums all of m at once
          for (int p = 0; p < count; ++p)
            for (int nn = n0; nn < q.n; ++nn) {
              float acc = 0.0f;
              for (size_t t = 0; t < k.off.size(); ++t)
                for (int mm = 0; mm < q.m; ++mm) acc += win[p][k.off[t] + mm] * k.wt[t][static_cast<size_t>(mm) * q.n + nn];
              dst[p][nn] = acc + (init ? init[nn] : 0.0f);
            }
        }
      }
      n0 += width;
    }
  });
}

// Forward: out (B,Ho,Wo,O); the weight packed as [tap][c][o].
void conv_forward(const Geometry& g, const float* x, const float* weight, const float* bias, float* out) {
  const int kk = g.k * g.k;
  std::vector<float> wf(static_cast<size_t>(kk) * g.c * g.o);
  // Blocks of 16 output channels: 16 sequential reads, 16-float writes (was one write per cache line).
  parallel_if(wf.size() >= kParallelFloats, (g.o + kBlock - 1) / kBlock, [&](size_t, size_t begin, size_t end) {
    for (int o0 = static_cast<int>(begin) * kBlock; o0 < std::min<int>(g.o, static_cast<int>(end) * kBlock); o0 += kBlock)
      for (int c = 0; c < g.c; ++c)
        for (int t = 0; t < kk; ++t)
          for (int o = o0; o < std::min(g.o, o0 + kBlock); ++o)
            wf[(static_cast<size_t>(t) * g.c + c) * g.o + o] = weight[(static_cast<size_t>(o) * g.c + c) * kk + t];
  });
  run_gather(forward_gather(g), x, wf.data(), bias, out);
}

// Grad-input (any stride): the adjoint gather on the weight packed as [tap][o][c].
void conv_grad_input(const Geometry& g, const float* gy, const float* weight, float* gx) {
  const int kk = g.k * g.k;
  std::vector<float> wg(static_cast<size_t>(kk) * g.o * g.c);
  parallel_if(wg.size() >= kParallelFloats, g.o, [&](size_t, size_t begin, size_t end) {
    for (size_t o = begin; o < end; ++o)  // an output channel's C x k x k weights are contiguous
      for (int t = 0; t < kk; ++t) {
        float* to = wg.data() + (static_cast<size_t>(t) * g.o + o) * g.c;
        const float* from = weight + o * g.c * kk + t;
        for (int c = 0; c < g.c; ++c) to[c] = from[static_cast<size_t>(c) * kk];
      }
  });
  run_gather(adjoint_gather(g), gy, wg.data(), nullptr, gx);
}

// Grad-weight register blocks: kRows input x kGwWidth output channels at most (6 x 32 = 24 AVX
// accumulators with AVX-512VL's 32 registers, else 6 x 16).
constexpr int kGwWidth = 8 * kWideBlock;

// acc[r][t] += x[xo[e] + r] * gy[go[e] + t] over the entries e of a pixel list, summed in registers
// (V vectors of 8 outputs; V = 0: any nb, scalar).
template <int R, int V>
FK_INLINE void outer_list(const float* x, const float* gy, const uint32_t* xo, const uint32_t* go, int count, int nb,
                          float (*acc)[kGwWidth]) {
  if constexpr (V > 0) {
    v8 a[R][V];
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < V; ++v) a[r][v] = load8(acc[r] + 8 * v);
    for (int e = 0; e < count; ++e) {
      const float* xc = x + xo[e];
      const float* gc = gy + go[e];
      v8 gv[V];
      for (int v = 0; v < V; ++v) gv[v] = load8(gc + 8 * v);
      for (int r = 0; r < R; ++r) {
        const float xr = xc[r];
        for (int v = 0; v < V; ++v) a[r][v] += xr * gv[v];
      }
    }
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < V; ++v) store8(acc[r] + 8 * v, a[r][v]);
  } else {
    for (int e = 0; e < count; ++e)
      for (int r = 0; r < R; ++r)
        for (int t = 0; t < nb; ++t) acc[r][t] += x[xo[e] + r] * gy[go[e] + t];
  }
}

template <int V>
FK_INLINE void outer_dispatch(int rows, const float* x, const float* gy, const uint32_t* xo, const uint32_t* go,
                              int count, int nb, float (*acc)[kGwWidth]) {
  switch (rows) {
    case 6: outer_list<6, V>(x, gy, xo, go, count, nb, acc); break;
    case 5: outer_list<5, V>(x, gy, xo, go, count, nb, acc); break;
    case 4: outer_list<4, V>(x, gy, xo, go, count, nb, acc); break;
    case 3: outer_list<3, V>(x, gy, xo, go, count, nb, acc); break;
    case 2: outer_list<2, V>(x, gy, xo, go, count, nb, acc); break;
    default: outer_list<1, V>(x, gy, xo, go, count, nb, acc); break;
  }
}

// acc[r][t] += x[line][col][c0 + r] * gy[line][col][o0 + t] over lines x cols (steps x_step / g_step
// per column, x_line / g_line per line), summed in registers (V as in outer_list).
template <int R, int V>
FK_INLINE void outer_rows(const float* xp, size_t x_step, size_t x_line, const float* gp, size_t g_step,
                          size_t g_line, int lines, int cols, int nb, float (*acc)[kGwWidth]) {
  if constexpr (V > 0) {
    v8 a[R][V];
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < V; ++v) a[r][v] = load8(acc[r] + 8 * v);
    for (int line = 0; line < lines; ++line, xp += x_line, gp += g_line) {
      const float *xc = xp, *gc = gp;
      for (int col = 0; col < cols; ++col, xc += x_step, gc += g_step) {
        v8 gv[V];
        for (int v = 0; v < V; ++v) gv[v] = load8(gc + 8 * v);
        for (int r = 0; r < R; ++r) {
          const float xr = xc[r];
          for (int v = 0; v < V; ++v) a[r][v] += xr * gv[v];
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < V; ++v) store8(acc[r] + 8 * v, a[r][v]);
  } else {
    for (int line = 0; line < lines; ++line, xp += x_line, gp += g_line)
      for (int col = 0; col < cols; ++col)
        for (int r = 0; r < R; ++r)
          for (int t = 0; t < nb; ++t) acc[r][t] += xp[col * x_step + r] * gp[col * g_step + t];
  }
}

template <int V>
FK_INLINE void outer_rows_dispatch(int rows, const float* xp, size_t x_step, size_t x_line, const float* gp,
                                   size_t g_step, size_t g_line, int lines, int cols, int nb, float (*acc)[kGwWidth]) {
  switch (rows) {
    case 6: outer_rows<6, V>(xp, x_step, x_line, gp, g_step, g_line, lines, cols, nb, acc); break;
    case 5: outer_rows<5, V>(xp, x_step, x_line, gp, g_step, g_line, lines, cols, nb, acc); break;
    case 4: outer_rows<4, V>(xp, x_step, x_line, gp, g_step, g_line, lines, cols, nb, acc); break;
    case 3: outer_rows<3, V>(xp, x_step, x_line, gp, g_step, g_line, lines, cols, nb, acc); break;
    case 2: outer_rows<2, V>(xp, x_step, x_line, gp, g_step, g_line, lines, cols, nb, acc); break;
    default: outer_rows<1, V>(xp, x_step, x_line, gp, g_step, g_line, lines, cols, nb, acc); break;
  }
}

// One sample's contribution to grad-weight block (tap (i, j), channels c0.., outputs o0.. o0 + nb) over
// the output pixels whose input pixel for this tap is inside the image.
void grad_weight_block(const Geometry& g, const float* x, const float* gy, int i, int j, int c0, int rows,
                       int o0, int nb, float (*acc)[kGwWidth]) {
  const int ow_lo = std::max(0, (g.pad - j + g.stride - 1) / g.stride);
  const int ow_hi = std::min(g.wo, (g.w - 1 + g.pad - j) / g.stride + 1);
  const int oh_lo = std::max(0, (g.pad - i + g.stride - 1) / g.stride);
  const int oh_hi = std::min(g.ho, (g.h - 1 + g.pad - i) / g.stride + 1);
  if (ow_hi <= ow_lo || oh_hi <= oh_lo) return;
  const float* xp = x + (static_cast<size_t>(oh_lo * g.stride - g.pad + i) * g.w + ow_lo * g.stride - g.pad + j) * g.c + c0;
  const float* gp = gy + (static_cast<size_t>(oh_lo) * g.wo + ow_lo) * g.o + o0;
  const size_t x_step = static_cast<size_t>(g.stride) * g.c, x_line = static_cast<size_t>(g.stride) * g.w * g.c;
  const size_t g_line = static_cast<size_t>(g.wo) * g.o;
  const int lines = oh_hi - oh_lo, cols = ow_hi - ow_lo;
  if (nb == kGwWidth)
    outer_rows_dispatch<kWideBlock>(rows, xp, x_step, x_line, gp, g.o, g_line, lines, cols, nb, acc);
  else if (nb == kBlock)
    outer_rows_dispatch<2>(rows, xp, x_step, x_line, gp, g.o, g_line, lines, cols, nb, acc);
  else
    outer_rows_dispatch<0>(rows, xp, x_step, x_line, gp, g.o, g_line, lines, cols, nb, acc);
}

// The pixels of samples [b0, b1) that tap (i, j) reads inside the image, in (b, oh, ow) order: x
// offsets (of the input pixel) and grad_out offsets, both from sample b0's start.
void tap_pixels(const Geometry& g, int b0, int b1, int i, int j, std::vector<uint32_t>& xo, std::vector<uint32_t>& go) {
  xo.clear();
  go.clear();
  const int ow_lo = std::max(0, (g.pad - j + g.stride - 1) / g.stride);
  const int ow_hi = std::min(g.wo, (g.w - 1 + g.pad - j) / g.stride + 1);
  const int oh_lo = std::max(0, (g.pad - i + g.stride - 1) / g.stride);
  const int oh_hi = std::min(g.ho, (g.h - 1 + g.pad - i) / g.stride + 1);
  for (int b = 0; b < b1 - b0; ++b)
    for (int oh = oh_lo; oh < oh_hi; ++oh)
      for (int ow = ow_lo; ow < ow_hi; ++ow) {
        xo.push_back(static_cast<uint32_t>(((static_cast<size_t>(b) * g.h + oh * g.stride - g.pad + i) * g.w +
                                            ow * g.stride - g.pad + j) * g.c));
        go.push_back(static_cast<uint32_t>(((static_cast<size_t>(b) * g.ho + oh) * g.wo + ow) * g.o));
      }
}

// grad_weight (O,C,k,k) and grad_bias (O,), sums over sample groups in double. The blocks (tap, 6 input
// channels, kGwWidth / 16 / fewer output channels) are sliced over the threads; each slice walks the sample groups in
// order, and a block sums a group's valid pixels in float registers: on maps of < 256 pixels from one
// list per tap over the group's samples (a 4x4 map's sample is a few pixels), else row by row.
void conv_grad_weight(const Geometry& g, const float* x, const float* gy, float* gw, float* gb) {
  const int kk = g.k * g.k;
  std::vector<double> total(static_cast<size_t>(kk) * g.c * g.o, 0.0), bias_total(g.o, 0.0);
  const size_t x_sample = static_cast<size_t>(g.h) * g.w * g.c, g_sample = static_cast<size_t>(g.ho) * g.wo * g.o;
  const int c_blocks = (g.c + kRows - 1) / kRows, o_blocks = (g.o + kBlock - 1) / kBlock;
  // Output channel segments: kGwWidth wide, then one of 16, then the rest.
  std::vector<std::pair<int, int>> segments;  // (o0, width)
  for (int o0 = 0; o0 < g.o;) {
    const int width = o0 + kGwWidth <= g.o ? kGwWidth : std::min(kBlock, g.o - o0);
    segments.emplace_back(o0, width);
    o0 += width;
  }
  const int n_segments = static_cast<int>(segments.size());
  // Samples summed in float per group of ~256 output pixels (4x4 maps: 16 samples), groups in double.
  const int group = std::max(1, 256 / std::max(1, g.ho * g.wo));
  parallel_slices(static_cast<size_t>(kk) * c_blocks * n_segments, [&](size_t, size_t begin, size_t end) {
    std::vector<std::vector<uint32_t>> xo(kk), go(kk);
    for (int b0 = 0; b0 < g.b; b0 += group) {
      const int b1 = std::min(g.b, b0 + group);
      const int first_tap = static_cast<int>(begin / (c_blocks * n_segments));
      const int last_tap = static_cast<int>((end - 1) / (c_blocks * n_segments));
      for (int tap = first_tap; tap <= last_tap && group > 1; ++tap) tap_pixels(g, b0, b1, tap / g.k, tap % g.k, xo[tap], go[tap]);
      for (size_t block = begin; block < end; ++block) {
        const int tap = static_cast<int>(block / (c_blocks * n_segments));
        const int c0 = static_cast<int>(block / n_segments % c_blocks) * kRows;
        const auto [o0, nb] = segments[block % n_segments];
        const int rows = std::min(kRows, g.c - c0);
        float acc[kRows][kGwWidth] = {};
        if (group == 1) {  // maps of >= 256 pixels: one sample's rows, without a list
          grad_weight_block(g, x + b0 * x_sample, gy + b0 * g_sample, tap / g.k, tap % g.k, c0, rows, o0, nb, acc);
        } else {
          const float* xs = x + b0 * x_sample + c0;
          const float* gs = gy + b0 * g_sample + o0;
          const int count = static_cast<int>(xo[tap].size());
          if (nb == kGwWidth)
            outer_dispatch<kWideBlock>(rows, xs, gs, xo[tap].data(), go[tap].data(), count, nb, acc);
          else if (nb == kBlock)
            outer_dispatch<2>(rows, xs, gs, xo[tap].data(), go[tap].data(), count, nb, acc);
          else
            outer_dispatch<0>(rows, xs, gs, xo[tap].data(), go[tap].data(), count, nb, acc);
        }
        for (int r = 0; r < rows; ++r)
          for (int t = 0; t < nb; ++t) total[(static_cast<size_t>(tap) * g.c + c0 + r) * g.o + o0 + t] += acc[r][t];
      }
    }
  });
  // grad_bias: per-sample sums (float over 16 pixels at a time, then double) on the threads, folded
  // in sample order; the transposition to (O,C,k,k) sliced over output channels.
  const size_t plane = static_cast<size_t>(g.ho) * g.wo;
  std::vector<double> sample_bias(static_cast<size_t>(g.b) * g.o, 0.0);
  parallel_if(g.b * g_sample >= kParallelFloats, g.b, [&](size_t, size_t begin, size_t end) {
    for (size_t b = begin; b < end; ++b)
      for (size_t p0 = 0; p0 < plane; p0 += 16) {
        const size_t p1 = std::min(plane, p0 + 16);
        const float* rows = gy + b * g_sample;
        double* into = sample_bias.data() + b * g.o;
        int o = 0;
        for (; o + 8 <= g.o; o += 8) {
          v8 part = {};
          for (size_t p = p0; p < p1; ++p) part += load8(rows + p * g.o + o);
          for (int e = 0; e < 8; ++e) into[o + e] += part[e];
        }
        for (; o < g.o; ++o) {
          float part = 0.0f;
          for (size_t p = p0; p < p1; ++p) part += rows[p * g.o + o];
          into[o] += part;
        }
      }
  });
  for (int b = 0; b < g.b; ++b)
    for (int o = 0; o < g.o; ++o) bias_total[o] += sample_bias[static_cast<size_t>(b) * g.o + o];
  parallel_if(total.size() >= kParallelFloats, o_blocks, [&](size_t, size_t begin, size_t end) {
    for (int o0 = static_cast<int>(begin) * kBlock; o0 < std::min<int>(g.o, static_cast<int>(end) * kBlock); o0 += kBlock) {
      const int o1 = std::min(g.o, o0 + kBlock);
      for (int c = 0; c < g.c; ++c)
        for (int t = 0; t < kk; ++t) {
          const double* src = total.data() + (static_cast<size_t>(t) * g.c + c) * g.o;
          for (int o = o0; o < o1; ++o) gw[(static_cast<size_t>(o) * g.c + c) * kk + t] = static_cast<float>(src[o]);
        }
      if (gb)
        for (int o = o0; o < o1; ++o) gb[o] = static_cast<float>(bias_total[o]);
    }
  });
}

// Elementwise ops: kParallelFloats and more in 1024-element slices over the threads.
template <class Body>
void parallel_elements(size_t n, Body&& body) {
  if (n < kParallelFloats) return body(0, n);
  parallel_slices(n / 1024 + (n % 1024 != 0), [&](size_t, size_t begin, size_t end) {
    body(begin * 1024, std::min(n, end * 1024));
  });
}

void rectify_range(const float* __restrict x, float* __restrict y, size_t begin, size_t end) {
  for (size_t i = begin; i < end; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

void rectify_backward_range(const float* __restrict g, const float* __restrict y, float* __restrict gx, size_t begin,
                            size_t end) {
  for (size_t i = begin; i < end; ++i) gx[i] = y[i] > 0.0f ? g[i] : 0.0f;
}

void rectify(const float* x, float* y, size_t n) {
  parallel_elements(n, [&](size_t begin, size_t end) { rectify_range(x, y, begin, end); });
}

void rectify_backward(const float* g, const float* y, float* gx, size_t n) {
  parallel_elements(n, [&](size_t begin, size_t end) { rectify_backward_range(g, y, gx, begin, end); });
}

// Max over each k x k window (stride k) of (B,H,W,C); a later element wins only if greater. Output
// rows (b, oh) are sliced over the threads.
void max_pool(const float* x, float* out, int b, int h, int w, int c, int k) {
  const int ho = h / k, wo = w / k;
  const bool worth = static_cast<size_t>(b) * h * w * c >= kParallelFloats;
  parallel_if(worth, static_cast<size_t>(b) * ho, [&](size_t, size_t begin, size_t end) {
    for (size_t row = begin; row < end; ++row) {
      const size_t n = row / ho;
      const int oh = static_cast<int>(row % ho);
      for (int ow = 0; ow < wo; ++ow) {
        float* dst = out + (row * wo + ow) * c;
        const float* first = x + ((n * h + oh * k) * w + ow * k) * c;
        std::copy(first, first + c, dst);
        for (int i = 0; i < k; ++i)
          for (int j = 0; j < k; ++j) {
            if (i == 0 && j == 0) continue;
            const float* src = first + (static_cast<size_t>(i) * w + j) * c;
            for (int ch = 0; ch < c; ++ch) dst[ch] = src[ch] > dst[ch] ? src[ch] : dst[ch];
          }
      }
    }
  });
}

// The gradient of max_pool: each window's grad to its first maximum (row-major), zeros elsewhere.
// Output rows (b, oh) are sliced over the threads (each owns its k input rows).
void max_pool_backward(const float* g, const float* x, float* gx, int b, int h, int w, int c, int k) {
  const int ho = h / k, wo = w / k;
  if (ho * k < h)  // rows no window covers
    std::fill(gx, gx + static_cast<size_t>(b) * h * w * c, 0.0f);
  const bool worth = static_cast<size_t>(b) * h * w * c >= kParallelFloats;
  parallel_if(worth, static_cast<size_t>(b) * ho, [&](size_t, size_t begin, size_t end) {
    std::vector<float> best(c);
    std::vector<size_t> where(c);
    for (size_t row = begin; row < end; ++row) {
      const size_t n = row / ho;
      const int oh = static_cast<int>(row % ho);
      float* band = gx + (n * h + static_cast<size_t>(oh) * k) * w * c;
      std::fill(band, band + static_cast<size_t>(k) * w * c, 0.0f);
      for (int ow = 0; ow < wo; ++ow) {
        const size_t base = ((n * h + oh * k) * w + ow * k) * c;
        for (int ch = 0; ch < c; ++ch) best[ch] = x[base + ch], where[ch] = base + ch;
        for (int i = 0; i < k; ++i)
          for (int j = 0; j < k; ++j) {
            const size_t at = base + (static_cast<size_t>(i) * w + j) * c;
            for (int ch = 0; ch < c; ++ch)
              if (x[at + ch] > best[ch]) best[ch] = x[at + ch], where[ch] = at + ch;
          }
        const float* src = g + (row * wo + ow) * c;
        for (int ch = 0; ch < c; ++ch) gx[where[ch]] = src[ch];
      }
    }
  });
}

}  // namespace
