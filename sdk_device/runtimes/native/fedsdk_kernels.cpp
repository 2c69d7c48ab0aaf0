// libfedsdk_kernels: the C++ kernels of the "fused" kernel set (export/fused_ops.py), registered
// with ExecuTorch's kernel registry when the library loads.
//
// Ops (float32, activations channels-last, weight in torch's (O, C, k, k) layout):
//   fedsdk::conv2d_nhwc.out            x (B,H,W,C), weight, bias? -> out (B,Ho,Wo,O)
//   fedsdk::conv2d_nhwc_backward.out   grad_out, x, weight -> grad_input, grad_weight, grad_bias
//   fedsdk::rectify.out / rectify_backward.out             ReLU and its gradient (from the output)
//   fedsdk::max_pool_nhwc.out / max_pool_nhwc_backward.out k x k, stride k, first-maximum gradient
//   fedsdk::batch_norm_nhwc.out / batch_norm_nhwc_backward.out  train-mode BatchNorm over the
//                                      samples of the mask (export/fused_batch_norm.py, fused_norm.h)
//
// Decisions:
// * Threads: every kernel slices its outputs over ExecuTorch's threadpool (the runtime's thread
//   count), 8 slices per thread so the pool's work stealing covers a worker that waits for a core;
//   memory-bound passes (BatchNorm, ReLU, max-pool, packing) only from 128K floats. Each output's
//   arithmetic does not depend on the slicing (BatchNorm sums per sample, folded in sample order),
//   so 1 and 2 threads give the same bits (tested).
// * Plain C++17, no XNNPACK (its C API header is not shipped by the wheel). Forward and grad-input
//   (any stride) are one "gather" engine: an output pixel sums (input window at a tap) x (packed
//   weight at that tap) over its valid taps only (no zero padding; grad-input's window at stride s
//   starts at (ih + pad) / s and tap i is i / s rows back). Pixels with the same valid tap set are
//   grouped, and 6 of them x 32 output channels (AVX-512VL: 32 vector registers; else 16) form a
//   register block; the reduction runs in passes of up to ~160 KB of weights. Grad-weight blocks
//   6 input x 32 (or 16) output channels; on maps under 256 pixels a block sums a list of the tap's
//   valid pixels over a group of samples in registers, else a sample's rows; groups in double, so
//   its error does not grow with the batch.
// * Vectors are GCC vector extensions (8 floats), lowered to whatever the build targets:
//   native_build compiles with -march=native for the build machine (AVX2/FMA here: ~5x the
//   baseline SSE code; GCC's target_clones did not vectorise these loops), NEON on arm64.
// * ExecuTorch aborts the process if a kernel is registered twice: the Python side loads this
//   library once per process (sdk_device/runtimes/fused_kernels.py).
// * The maths is in fused_math.h; fk_* C functions expose it on raw pointers (tests, no program).


#include <executorch/runtime/core/function_ref.h>
#include <executorch/runtime/kernel/kernel_includes.h>
#include <executorch/runtime/kernel/operator_registry.h>

#include <cmath>
#include <vector>

#include "fused_math.h"
#include "fused_norm.h"

// The wheel ships no threadpool.h; these members are exported by libexecutorch_threadpool.so (the
// pool the native shim sizes with fx_set_threads, shared by XNNPACK and these kernels).
namespace executorch::extension::threadpool {
class ThreadPool {
 public:
  bool _unsafe_reset_threadpool(uint32_t num_threads);
  size_t get_thread_count() const;
  void run(executorch::runtime::FunctionRef<void(size_t)> fn, size_t range);
};
ThreadPool* get_threadpool();
}  // namespace executorch::extension::threadpool

namespace {

int worker_count() {
  auto* pool = executorch::extension::threadpool::get_threadpool();
  return pool ? static_cast<int>(pool->get_thread_count()) : 1;
}

void run_tasks(size_t tasks, void (*body)(void*, size_t), void* context) {
  auto* pool = executorch::extension::threadpool::get_threadpool();
  auto task = [&](size_t index) { body(context, index); };
  if (pool == nullptr) {
    for (size_t index = 0; index < tasks; ++index) task(index);
    return;
  }
  pool->run(task, tasks);
}

}  // namespace


// ---- Self-test (fk_self_test): the kernels against a plain double-precision reference ----
// Run once when a runtime loads the library (sdk_device/runtimes/fused_kernels.py, the C++
// client's pte_trainer.cpp): a miscompiled or mis-targeted build (a wrong vector width, a
// compiler bug) is refused before it trains anything, and the server falls back to the portable
// program. Geometries (b, h, w, c, o, k, stride, pad) pick every code path of the gather and
// grad-weight engines: 3x3 stride 1 and 2 with a channel tail past one register block, a 1x1
// stride-2 shortcut, a small map (< 256 pixels: the pixel-list grad-weight) and a larger one.
namespace {

struct SelfTestData {
  std::vector<float> x, w, bias, gy;
};

float lcg(uint32_t& state) {  // deterministic values in [-1, 1)
  state = state * 1664525u + 1013904223u;
  return static_cast<float>(state >> 8) / static_cast<float>(1u << 23) - 1.0f;
}

double relative(const std::vector<float>& got, const std::vector<double>& want) {
  double worst = 0.0, scale = 1.0;
  for (double v : want) scale = std::max(scale, std::abs(v));
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = std::abs(static_cast<double>(got[i]) - want[i]);
    if (!(d <= worst)) worst = std::isnan(d) ? INFINITY : d;  // a NaN is the worst error
  }
  return worst / scale;
}

double conv_self_test(int b, int h, int w, int c, int o, int k, int stride, int pad, uint32_t seed) {
  const Geometry g = geometry(b, h, w, c, o, k, stride, pad);
  SelfTestData d;
  d.x.resize(size_t(b) * h * w * c);
  d.w.resize(size_t(o) * c * k * k);
  d.bias.resize(o);
  d.gy.resize(size_t(b) * g.ho * g.wo * o);
  for (auto* v : {&d.x, &d.w, &d.bias, &d.gy})
    for (float& f : *v) f = lcg(seed);
  std::vector<double> y(d.gy.size()), gx(d.x.size(), 0.0), gw(d.w.size(), 0.0), gb(o, 0.0);
  for (int n = 0; n < b; ++n)
    for (int i = 0; i < g.ho; ++i)
      for (int j = 0; j < g.wo; ++j)
        for (int oc = 0; oc < o; ++oc) {
          const size_t yi = ((size_t(n) * g.ho + i) * g.wo + j) * o + oc;
          double acc = d.bias[oc];
          const double grad = d.gy[yi];
          gb[oc] += grad;
          for (int u = 0; u < k; ++u)
            for (int v = 0; v < k; ++v) {
              const int ih = i * stride - pad + u, iw = j * stride - pad + v;
              if (ih < 0 || ih >= h || iw < 0 || iw >= w) continue;
              for (int ic = 0; ic < c; ++ic) {
                const size_t xi = ((size_t(n) * h + ih) * w + iw) * c + ic;
                const size_t wi = ((size_t(oc) * c + ic) * k + u) * k + v;
                acc += double(d.x[xi]) * d.w[wi];
                gx[xi] += grad * d.w[wi];
                gw[wi] += grad * d.x[xi];
              }
            }
          y[yi] = acc;
        }
  std::vector<float> out(y.size()), fgx(gx.size()), fgw(gw.size()), fgb(o);
  conv_forward(g, d.x.data(), d.w.data(), d.bias.data(), out.data());
  conv_grad_input(g, d.gy.data(), d.w.data(), fgx.data());
  conv_grad_weight(g, d.x.data(), d.gy.data(), fgw.data(), fgb.data());
  return std::max({relative(out, y), relative(fgx, gx), relative(fgw, gw), relative(fgb, gb)});
}

double pool_relu_self_test(uint32_t seed) {
  const int b = 2, h = 6, w = 6, c = 19, k = 2;
  std::vector<float> x(size_t(b) * h * w * c), out(size_t(b) * (h / k) * (w / k) * c), r(x.size());
  for (float& f : x) f = lcg(seed);
  max_pool(x.data(), out.data(), b, h, w, c, k);
  rectify(x.data(), r.data(), x.size());
  std::vector<double> want(out.size()), want_r(x.size());
  for (int n = 0; n < b; ++n)
    for (int i = 0; i < h / k; ++i)
      for (int j = 0; j < w / k; ++j)
        for (int ch = 0; ch < c; ++ch) {
          double best = -INFINITY;
          for (int u = 0; u < k; ++u)
            for (int v = 0; v < k; ++v)
              best = std::max(best, double(x[((size_t(n) * h + i * k + u) * w + j * k + v) * c + ch]));
          want[((size_t(n) * (h / k) + i) * (w / k) + j) * c + ch] = best;
        }
  for (size_t i = 0; i < x.size(); ++i) want_r[i] = std::max(0.0, double(x[i]));
  return std::max(relative(out, want), relative(r, want_r));
}

}  // namespace

extern "C" double fk_self_test() {
  double worst = pool_relu_self_test(7u);
  const int cases[][8] = {{2, 5, 5, 3, 37, 3, 1, 1}, {2, 8, 8, 5, 33, 3, 2, 1}, {2, 4, 4, 8, 16, 1, 2, 0},
                          {1, 17, 17, 4, 18, 3, 1, 1}};
  uint32_t seed = 1;
  for (const auto& q : cases)
    worst = std::max(worst, conv_self_test(q[0], q[1], q[2], q[3], q[4], q[5], q[6], q[7], seed++));
  return worst;
}

extern "C" {

void fk_rectify(const float* x, float* y, size_t n) { rectify(x, y, n); }
void fk_rectify_backward(const float* g, const float* y, float* gx, size_t n) { rectify_backward(g, y, gx, n); }
void fk_max_pool(const float* x, float* out, int b, int h, int w, int c, int k) { max_pool(x, out, b, h, w, c, k); }
void fk_max_pool_backward(const float* g, const float* x, float* gx, int b, int h, int w, int c, int k) {
  max_pool_backward(g, x, gx, b, h, w, c, k);
}

// The kernel set this library implements (the programs' metadata "kernels" value).
const char* fk_kernel_set() { return "fused"; }

// The shared threadpool's size, and resizing it (tests; a runtime sizes it through its shim).
int fk_thread_count() { return worker_count(); }
int fk_set_threads(uint32_t threads) {
  auto* pool = executorch::extension::threadpool::get_threadpool();
  return pool && pool->_unsafe_reset_threadpool(threads) ? worker_count() : -1;
}

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

// running_mean / running_var may be null (static BatchNorm).
void fk_batch_norm(const float* x, const float* weight, const float* bias, const float* mask, const float* running_mean,
                   const float* running_var, double momentum, double eps, int b, int hw, int c, float* y, float* mean,
                   float* invstd, float* new_mean, float* new_var) {
  batch_norm_forward(x, weight, bias, mask, running_mean, running_var, momentum, eps, b, hw, c, y, mean, invstd,
                     new_mean, new_var);
}

void fk_batch_norm_backward(const float* g, const float* x, const float* weight, const float* mask, const float* mean,
                            const float* invstd, int b, int hw, int c, float* gx, float* gw, float* gb) {
  batch_norm_backward(g, x, weight, mask, mean, invstd, b, hw, c, gx, gw, gb);
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
      weight.size(2) > 64 || stride < 1 || pad < 0) {
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

bool float_like(const Tensor& a, const Tensor& b) {
  return a.scalar_type() == ScalarType::Float && b.scalar_type() == ScalarType::Float && a.numel() == b.numel();
}

void fail(KernelRuntimeContext& ctx, const char* op) {
  ET_LOG(Error, "%s: bad arguments", op);
  ctx.fail(Error::InvalidArgument);
}

// rectify.out(x, *, out)
void rectify_out(KernelRuntimeContext& ctx, Span<EValue*> stack) {
  const Tensor& x = stack[0]->toTensor();
  Tensor& out = stack[1]->toTensor();
  if (!float_like(x, out)) return fail(ctx, "fedsdk::rectify.out");
  rectify(x.const_data_ptr<float>(), out.mutable_data_ptr<float>(), x.numel());
}

// rectify_backward.out(grad_out, y, *, out)
void rectify_backward_out(KernelRuntimeContext& ctx, Span<EValue*> stack) {
  const Tensor& g = stack[0]->toTensor();
  const Tensor& y = stack[1]->toTensor();
  Tensor& out = stack[2]->toTensor();
  if (!float_like(g, y) || !float_like(g, out)) return fail(ctx, "fedsdk::rectify_backward.out");
  rectify_backward(g.const_data_ptr<float>(), y.const_data_ptr<float>(), out.mutable_data_ptr<float>(), g.numel());
}

// max_pool_nhwc.out(x, k, *, out)
void max_pool_out(KernelRuntimeContext& ctx, Span<EValue*> stack) {
  const Tensor& x = stack[0]->toTensor();
  const int64_t k = stack[1]->toInt();
  Tensor& out = stack[2]->toTensor();
  if (!is_float(x, 4) || k < 1 || !same_shape(out, {x.size(0), x.size(1) / k, x.size(2) / k, x.size(3)}))
    return fail(ctx, "fedsdk::max_pool_nhwc.out");
  max_pool(x.const_data_ptr<float>(), out.mutable_data_ptr<float>(), x.size(0), x.size(1), x.size(2), x.size(3), k);
}

// max_pool_nhwc_backward.out(grad_out, x, k, *, out)
void max_pool_backward_out(KernelRuntimeContext& ctx, Span<EValue*> stack) {
  const Tensor& g = stack[0]->toTensor();
  const Tensor& x = stack[1]->toTensor();
  const int64_t k = stack[2]->toInt();
  Tensor& out = stack[3]->toTensor();
  if (!is_float(x, 4) || k < 1 || !same_shape(g, {x.size(0), x.size(1) / k, x.size(2) / k, x.size(3)}) ||
      !float_like(x, out))
    return fail(ctx, "fedsdk::max_pool_nhwc_backward.out");
  max_pool_backward(g.const_data_ptr<float>(), x.const_data_ptr<float>(), out.mutable_data_ptr<float>(), x.size(0),
                    x.size(1), x.size(2), x.size(3), k);
}

bool channel_vector(const Tensor& t, int64_t c) { return t.scalar_type() == ScalarType::Float && same_shape(t, {c}); }

// batch_norm_nhwc.out(x, weight, bias, sample_mask, running_mean?, running_var?, momentum, eps,
//                     *, y, mean, invstd, new_running_mean, new_running_var)
void batch_norm_out(KernelRuntimeContext& ctx, Span<EValue*> stack) {
  const Tensor& x = stack[0]->toTensor();
  const bool tracked = !stack[4]->isNone() && !stack[5]->isNone();
  if (!is_float(x, 4)) return fail(ctx, "fedsdk::batch_norm_nhwc.out");
  const int64_t c = x.size(3);
  const Tensor& mask = stack[3]->toTensor();
  Tensor& y = stack[8]->toTensor();
  bool ok = channel_vector(stack[1]->toTensor(), c) && channel_vector(stack[2]->toTensor(), c) &&
            mask.scalar_type() == ScalarType::Float && same_shape(mask, {x.size(0)}) && float_like(x, y);
  for (int i = 9; i < 13; ++i) ok = ok && channel_vector(stack[i]->toTensor(), c);
  if (tracked) ok = ok && channel_vector(stack[4]->toTensor(), c) && channel_vector(stack[5]->toTensor(), c);
  if (!ok) return fail(ctx, "fedsdk::batch_norm_nhwc.out");
  batch_norm_forward(x.const_data_ptr<float>(), stack[1]->toTensor().const_data_ptr<float>(),
                     stack[2]->toTensor().const_data_ptr<float>(), mask.const_data_ptr<float>(),
                     tracked ? stack[4]->toTensor().const_data_ptr<float>() : nullptr,
                     tracked ? stack[5]->toTensor().const_data_ptr<float>() : nullptr, stack[6]->toDouble(),
                     stack[7]->toDouble(), x.size(0), x.size(1) * x.size(2), c, y.mutable_data_ptr<float>(),
                     stack[9]->toTensor().mutable_data_ptr<float>(), stack[10]->toTensor().mutable_data_ptr<float>(),
                     stack[11]->toTensor().mutable_data_ptr<float>(), stack[12]->toTensor().mutable_data_ptr<float>());
}

// batch_norm_nhwc_backward.out(grad_out, x, weight, sample_mask, mean, invstd, *, grad_input, grad_weight, grad_bias)
void batch_norm_backward_out(KernelRuntimeContext& ctx, Span<EValue*> stack) {
  const Tensor& g = stack[0]->toTensor();
  const Tensor& x = stack[1]->toTensor();
  if (!is_float(x, 4)) return fail(ctx, "fedsdk::batch_norm_nhwc_backward.out");
  const int64_t c = x.size(3);
  const Tensor& mask = stack[3]->toTensor();
  Tensor& gx = stack[6]->toTensor();
  bool ok = float_like(x, g) && float_like(x, gx) && mask.scalar_type() == ScalarType::Float &&
            same_shape(mask, {x.size(0)});
  for (int i : {2, 4, 5, 7, 8}) ok = ok && channel_vector(stack[i]->toTensor(), c);
  if (!ok) return fail(ctx, "fedsdk::batch_norm_nhwc_backward.out");
  batch_norm_backward(g.const_data_ptr<float>(), x.const_data_ptr<float>(), stack[2]->toTensor().const_data_ptr<float>(),
                      mask.const_data_ptr<float>(), stack[4]->toTensor().const_data_ptr<float>(),
                      stack[5]->toTensor().const_data_ptr<float>(), x.size(0), x.size(1) * x.size(2), c,
                      gx.mutable_data_ptr<float>(), stack[7]->toTensor().mutable_data_ptr<float>(),
                      stack[8]->toTensor().mutable_data_ptr<float>());
}

const executorch::runtime::Kernel kKernels[] = {
    executorch::runtime::Kernel("fedsdk::conv2d_nhwc.out", conv2d_nhwc_out),
    executorch::runtime::Kernel("fedsdk::conv2d_nhwc_backward.out", conv2d_nhwc_backward_out),
    executorch::runtime::Kernel("fedsdk::rectify.out", rectify_out),
    executorch::runtime::Kernel("fedsdk::rectify_backward.out", rectify_backward_out),
    executorch::runtime::Kernel("fedsdk::max_pool_nhwc.out", max_pool_out),
    executorch::runtime::Kernel("fedsdk::max_pool_nhwc_backward.out", max_pool_backward_out),
    executorch::runtime::Kernel("fedsdk::batch_norm_nhwc.out", batch_norm_out),
    executorch::runtime::Kernel("fedsdk::batch_norm_nhwc_backward.out", batch_norm_backward_out),
};

const Error kRegistered = executorch::runtime::register_kernels({kKernels, sizeof(kKernels) / sizeof(kKernels[0])});

}  // namespace

extern "C" int fk_registered() { return kRegistered == Error::Ok ? 1 : 0; }
