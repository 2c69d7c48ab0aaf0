// libfedsdk_kernels: the C++ kernels of the "fused" kernel set (export/fused_ops.py), registered
// with ExecuTorch's kernel registry when the library loads.
//
// Ops (float32, activations channels-last, weight in torch's (O, C, k, k) layout):
//   fedsdk::conv2d_nhwc.out            x (B,H,W,C), weight, bias? -> out (B,Ho,Wo,O)
//   fedsdk::conv2d_nhwc_backward.out   grad_out, x, weight -> grad_input, grad_weight, grad_bias
//
// Decisions:
// * Plain C++17, no XNNPACK (its C API header is not shipped by the wheel; this is the first,
//   correctness-first slice). Forward and grad-input are "gather" convolutions: for each
//   output pixel, a sum over the valid kernel taps of (input row) x (weight block), with the
//   output channels in register-sized blocks of 16. Grad-weight accumulates per sample in
//   float registers (blocks of 4 input x 16 output channels) and across samples in double,
//   so its error does not grow with the batch.
// * Vectors are GCC vector extensions (8 floats), lowered to whatever the build targets:
//   native_build compiles with -march=native for the build machine (AVX2/FMA here: ~5x the
//   baseline SSE code; GCC's target_clones did not vectorise these loops), NEON on arm64.
// * ExecuTorch aborts the process if a kernel is registered twice: the Python side loads this
//   library once per process (sdk_device/runtimes/fused_kernels.py).
// * fk_* C functions expose the same maths on raw pointers (tests, no program needed).

#include <executorch/runtime/kernel/kernel_includes.h>
#include <executorch/runtime/kernel/operator_registry.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#define FK_HOT
#define FK_INLINE static inline __attribute__((always_inline))

namespace {

constexpr int kBlock = 16;  // output channels per register block
constexpr int kRows = 4;    // input channels per grad-weight block

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

FK_HOT void gather_pixel(const float* const* src, const float* const* wt, int taps, int m_count, int n_count,
                         const float* init, float* out) {
  int n0 = 0;
  for (; n0 + kBlock <= n_count; n0 += kBlock) gather_block(src, wt, taps, m_count, n_count, n0, init, out);
  if (n0 < n_count) gather_tail(src, wt, taps, m_count, n_count, n0, init, out);
}

// Forward: out (B,Ho,Wo,O); wf = weight as [tap][c][o].
void conv_forward(const Geometry& g, const float* x, const float* weight, const float* bias, float* out) {
  const int kk = g.k * g.k;
  std::vector<float> wf(static_cast<size_t>(kk) * g.c * g.o);
  for (int o = 0; o < g.o; ++o)
    for (int c = 0; c < g.c; ++c)
      for (int t = 0; t < kk; ++t) wf[(static_cast<size_t>(t) * g.c + c) * g.o + o] = weight[(static_cast<size_t>(o) * g.c + c) * kk + t];
  std::vector<const float*> src(kk), wt(kk);
  for (int b = 0; b < g.b; ++b)
    for (int oh = 0; oh < g.ho; ++oh)
      for (int ow = 0; ow < g.wo; ++ow) {
        int taps = 0;
        for (int i = 0; i < g.k; ++i) {
          const int ih = oh * g.stride - g.pad + i;
          if (ih < 0 || ih >= g.h) continue;
          for (int j = 0; j < g.k; ++j) {
            const int iw = ow * g.stride - g.pad + j;
            if (iw < 0 || iw >= g.w) continue;
            src[taps] = x + ((static_cast<size_t>(b) * g.h + ih) * g.w + iw) * g.c;
            wt[taps++] = wf.data() + static_cast<size_t>(i * g.k + j) * g.c * g.o;
          }
        }
        float* dst = out + ((static_cast<size_t>(b) * g.ho + oh) * g.wo + ow) * g.o;
        gather_pixel(src.data(), wt.data(), taps, g.c, g.o, bias, dst);
      }
}

// Grad-input: the adjoint gather; wg = weight as [tap][o][c].
void conv_grad_input(const Geometry& g, const float* gy, const float* weight, float* gx) {
  const int kk = g.k * g.k;
  std::vector<float> wg(static_cast<size_t>(kk) * g.o * g.c);
  for (int o = 0; o < g.o; ++o)
    for (int c = 0; c < g.c; ++c)
      for (int t = 0; t < kk; ++t) wg[(static_cast<size_t>(t) * g.o + o) * g.c + c] = weight[(static_cast<size_t>(o) * g.c + c) * kk + t];
  std::vector<const float*> src(kk), wt(kk);
  for (int b = 0; b < g.b; ++b)
    for (int ih = 0; ih < g.h; ++ih)
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
        float* dst = gx + ((static_cast<size_t>(b) * g.h + ih) * g.w + iw) * g.c;
        gather_pixel(src.data(), wt.data(), taps, g.o, g.c, nullptr, dst);
      }
}

// acc[r][t] += x[ow][c0 + r] * gy[ow][o0 + t] over one output row's valid columns (summed in
// a local copy: through the pointer the compiler would reload/store it on every FMA).
template <int R, int NB>
FK_INLINE void outer_row(const float* xp, size_t x_step, const float* gp, size_t g_step, int cols, int nb,
                         float (*acc)[kBlock]) {
  if constexpr (NB == kBlock) {
    v8 lo[R], hi[R];
    for (int r = 0; r < R; ++r) lo[r] = load8(acc[r]), hi[r] = load8(acc[r] + 8);
    for (int col = 0; col < cols; ++col, xp += x_step, gp += g_step) {
      const v8 g0 = load8(gp), g1 = load8(gp + 8);
      for (int r = 0; r < R; ++r) {
        lo[r] += xp[r] * g0;
        hi[r] += xp[r] * g1;
      }
    }
    for (int r = 0; r < R; ++r) store8(acc[r], lo[r]), store8(acc[r] + 8, hi[r]);
  } else {
    for (int col = 0; col < cols; ++col, xp += x_step, gp += g_step)
      for (int r = 0; r < R; ++r)
        for (int t = 0; t < nb; ++t) acc[r][t] += xp[r] * gp[t];
  }
}

template <int NB>
FK_INLINE void outer_dispatch(int rows, const float* xp, size_t x_step, const float* gp, size_t g_step, int cols,
                              int nb, float (*acc)[kBlock]) {
  switch (rows) {
    case 4: outer_row<4, NB>(xp, x_step, gp, g_step, cols, nb, acc); break;
    case 3: outer_row<3, NB>(xp, x_step, gp, g_step, cols, nb, acc); break;
    case 2: outer_row<2, NB>(xp, x_step, gp, g_step, cols, nb, acc); break;
    default: outer_row<1, NB>(xp, x_step, gp, g_step, cols, nb, acc); break;
  }
}

// One sample's contribution to grad-weight block (tap (i, j), channels c0.., outputs o0..).
FK_HOT void grad_weight_block(const Geometry& g, const float* x, const float* gy, int i, int j, int c0, int rows,
                              int o0, int nb, float (*acc)[kBlock]) {
  const int ow_lo = std::max(0, (g.pad - j + g.stride - 1) / g.stride);
  const int ow_hi = std::min(g.wo, (g.w - 1 + g.pad - j) / g.stride + 1);
  if (ow_hi <= ow_lo) return;
  for (int oh = 0; oh < g.ho; ++oh) {
    const int ih = oh * g.stride - g.pad + i;
    if (ih < 0 || ih >= g.h) continue;
    const float* xp = x + (static_cast<size_t>(ih) * g.w + ow_lo * g.stride - g.pad + j) * g.c + c0;
    const float* gp = gy + (static_cast<size_t>(oh) * g.wo + ow_lo) * g.o + o0;
    const size_t x_step = static_cast<size_t>(g.stride) * g.c;
    if (nb == kBlock)
      outer_dispatch<kBlock>(rows, xp, x_step, gp, g.o, ow_hi - ow_lo, nb, acc);
    else
      outer_dispatch<0>(rows, xp, x_step, gp, g.o, ow_hi - ow_lo, nb, acc);
  }
}

// grad_weight (O,C,k,k) and grad_bias (O,), sums over samples in double.
void conv_grad_weight(const Geometry& g, const float* x, const float* gy, float* gw, float* gb) {
  const int kk = g.k * g.k;
  std::vector<double> total(static_cast<size_t>(kk) * g.c * g.o, 0.0), bias_total(g.o, 0.0);
  const size_t x_sample = static_cast<size_t>(g.h) * g.w * g.c, g_sample = static_cast<size_t>(g.ho) * g.wo * g.o;
  for (int b = 0; b < g.b; ++b) {
    const float* xb = x + b * x_sample;
    const float* gb_ = gy + b * g_sample;
    for (int i = 0; i < g.k; ++i)
      for (int j = 0; j < g.k; ++j)
        for (int c0 = 0; c0 < g.c; c0 += kRows)
          for (int o0 = 0; o0 < g.o; o0 += kBlock) {
            const int rows = std::min(kRows, g.c - c0), nb = std::min(kBlock, g.o - o0);
            float acc[kRows][kBlock] = {};
            grad_weight_block(g, xb, gb_, i, j, c0, rows, o0, nb, acc);
            for (int r = 0; r < rows; ++r)
              for (int t = 0; t < nb; ++t)
                total[(static_cast<size_t>(i * g.k + j) * g.c + c0 + r) * g.o + o0 + t] += acc[r][t];
          }
    for (size_t p = 0; p < static_cast<size_t>(g.ho) * g.wo; ++p)
      for (int o = 0; o < g.o; ++o) bias_total[o] += gb_[p * g.o + o];
  }
  for (int o = 0; o < g.o; ++o) {
    for (int c = 0; c < g.c; ++c)
      for (int t = 0; t < kk; ++t)
        gw[(static_cast<size_t>(o) * g.c + c) * kk + t] = static_cast<float>(total[(static_cast<size_t>(t) * g.c + c) * g.o + o]);
    if (gb) gb[o] = static_cast<float>(bias_total[o]);
  }
}

}  // namespace

extern "C" {

// The kernel set this library implements (the programs' metadata "kernels" value).
const char* fk_kernel_set() { return "fused"; }

void fk_conv2d(const float* x, const float* weight, const float* bias, float* out, int b, int h, int w, int c,
               int o, int k, int stride, int pad) {
  conv_forward(geometry(b, h, w, c, o, k, stride, pad), x, weight, bias, out);
}

// grad_input may be null (no input gradient wanted).
void fk_conv2d_backward(const float* gy, const float* x, const float* weight, float* grad_input, float* grad_weight,
                        float* grad_bias, int b, int h, int w, int c, int o, int k, int stride, int pad) {
  const Geometry g = geometry(b, h, w, c, o, k, stride, pad);
  if (grad_input) conv_grad_input(g, gy, weight, grad_input);
  conv_grad_weight(g, x, gy, grad_weight, grad_bias);
}

}  // extern "C"

// ---- ExecuTorch boxed kernels --------------------------------------------------------------------
namespace {

using executorch::aten::ScalarType;
using executorch::aten::Tensor;
using executorch::runtime::Error;
using executorch::runtime::EValue;
using executorch::runtime::KernelRuntimeContext;
using executorch::runtime::Span;

bool is_float(const Tensor& t, int dim) { return t.scalar_type() == ScalarType::Float && t.dim() == dim; }

bool same_shape(const Tensor& t, std::initializer_list<int64_t> sizes) {
  if (t.dim() != static_cast<ssize_t>(sizes.size())) return false;
  int d = 0;
  for (int64_t s : sizes)
    if (t.size(d++) != s) return false;
  return true;
}

// Validates (x, weight) and returns the geometry, or fails the context.
bool conv_geometry(KernelRuntimeContext& ctx, const Tensor& x, const Tensor& weight, int64_t stride, int64_t pad,
                   Geometry* g) {
  if (!is_float(x, 4) || !is_float(weight, 4) || weight.size(1) != x.size(3) || weight.size(2) != weight.size(3) ||
      stride < 1 || pad < 0) {
    ET_LOG(Error, "fedsdk::conv2d_nhwc: bad arguments");
    ctx.fail(Error::InvalidArgument);
    return false;
  }
  *g = geometry(x.size(0), x.size(1), x.size(2), x.size(3), weight.size(0), weight.size(2), stride, pad);
  return true;
}

// conv2d_nhwc.out(x, weight, bias?, stride, pad, *, out)
void conv2d_nhwc_out(KernelRuntimeContext& ctx, Span<EValue*> stack) {
  const Tensor& x = stack[0]->toTensor();
  const Tensor& weight = stack[1]->toTensor();
  const bool has_bias = !stack[2]->isNone();
  Tensor& out = stack[5]->toTensor();
  Geometry g;
  if (!conv_geometry(ctx, x, weight, stack[3]->toInt(), stack[4]->toInt(), &g)) return;
  if (!same_shape(out, {g.b, g.ho, g.wo, g.o}) || out.scalar_type() != ScalarType::Float ||
      (has_bias && !same_shape(stack[2]->toTensor(), {g.o}))) {
    ET_LOG(Error, "fedsdk::conv2d_nhwc.out: output or bias shape");
    ctx.fail(Error::InvalidArgument);
    return;
  }
  conv_forward(g, x.const_data_ptr<float>(), weight.const_data_ptr<float>(),
               has_bias ? stack[2]->toTensor().const_data_ptr<float>() : nullptr, out.mutable_data_ptr<float>());
}

// conv2d_nhwc_backward.out(grad_out, x, weight, stride, pad, input_grad, *, grad_input, grad_weight, grad_bias)
void conv2d_nhwc_backward_out(KernelRuntimeContext& ctx, Span<EValue*> stack) {
  const Tensor& gy = stack[0]->toTensor();
  const Tensor& x = stack[1]->toTensor();
  const Tensor& weight = stack[2]->toTensor();
  const bool input_grad = stack[5]->toBool();
  Tensor& gx = stack[6]->toTensor();
  Tensor& gw = stack[7]->toTensor();
  Tensor& gb = stack[8]->toTensor();
  Geometry g;
  if (!conv_geometry(ctx, x, weight, stack[3]->toInt(), stack[4]->toInt(), &g)) return;
  if (!same_shape(gy, {g.b, g.ho, g.wo, g.o}) || !same_shape(gx, {g.b, g.h, g.w, g.c}) ||
      !same_shape(gw, {g.o, g.c, g.k, g.k}) || !same_shape(gb, {g.o}) || gy.scalar_type() != ScalarType::Float) {
    ET_LOG(Error, "fedsdk::conv2d_nhwc_backward.out: shapes");
    ctx.fail(Error::InvalidArgument);
    return;
  }
  float* gx_data = gx.mutable_data_ptr<float>();
  if (input_grad)
    conv_grad_input(g, gy.const_data_ptr<float>(), weight.const_data_ptr<float>(), gx_data);
  else
    std::fill(gx_data, gx_data + gx.numel(), 0.0f);
  conv_grad_weight(g, x.const_data_ptr<float>(), gy.const_data_ptr<float>(), gw.mutable_data_ptr<float>(),
                   gb.mutable_data_ptr<float>());
}

const executorch::runtime::Kernel kKernels[] = {
    executorch::runtime::Kernel("fedsdk::conv2d_nhwc.out", conv2d_nhwc_out),
    executorch::runtime::Kernel("fedsdk::conv2d_nhwc_backward.out", conv2d_nhwc_backward_out),
};

const Error kRegistered = executorch::runtime::register_kernels({kKernels, sizeof(kKernels) / sizeof(kKernels[0])});

}  // namespace

extern "C" int fk_registered() { return kRegistered == Error::Ok ? 1 : 0; }
