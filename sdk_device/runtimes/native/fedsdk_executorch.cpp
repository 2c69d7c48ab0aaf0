// A C ABI over the ExecuTorch C++ runtime (Module API), for sdk_device.runtimes.native (ctypes).
//
// Decisions:
// * Plain extern "C" functions and caller-owned buffers, so Python needs only ctypes + numpy
//   (no pybind11, no torch). Built with g++ against the executorch wheel's headers and
//   shared libraries; see sdk_device/runtimes/native_build.py.
// * The program bytes are copied into a 64-byte aligned buffer owned by the handle and read
//   through a BufferDataLoader: constant tensors (the parameters a training method returns)
//   then live in that buffer, which the Python side writes weights into in place.
// * Outputs are not copied: fx_output hands back pointers into the method's memory, valid
//   until the next fx_run on the same handle (as the Python bindings' clone_outputs=False).
// * Kernels and the XNNPACK delegate register themselves from static initialisers when their
//   libraries load; the build links them with --no-as-needed so they are always loaded.
// * Errors: every call returns 0 on success, else an ExecuTorch error code (or -1), and
//   fx_error() gives a one-line message.

#include <executorch/extension/data_loader/buffer_data_loader.h>
#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

// The wheel ships no threadpool.h; these two members are exported by libexecutorch_threadpool.so.
namespace executorch::extension::threadpool {
class ThreadPool {
 public:
  bool _unsafe_reset_threadpool(uint32_t num_threads);
  size_t get_thread_count() const;
};
ThreadPool* get_threadpool();
}  // namespace executorch::extension::threadpool

using executorch::aten::ScalarType;
using executorch::extension::BufferDataLoader;
using executorch::extension::TensorPtr;
using executorch::extension::make_tensor_ptr;
using executorch::extension::module::Module;
using executorch::runtime::Error;
using executorch::runtime::EValue;

namespace {

struct Handle {
  uint8_t* bytes = nullptr;  // the program, owned (aligned_alloc)
  size_t size = 0;
  std::unique_ptr<Module> module;
  std::vector<EValue> outputs;
  std::string error;
  std::string names;  // method names, newline-separated (fx_method_names)
  ~Handle() {
    module.reset();  // before the bytes it reads from
    std::free(bytes);
  }
};

std::string g_error;  // for failures before a handle exists

int fail(Handle* h, int code, const std::string& message) {
  (h ? h->error : g_error) = message + " (executorch error " + std::to_string(code) + ")";
  return code == 0 ? -1 : code;
}

}  // namespace

extern "C" {

// The message of the last failure on ``h`` (or of fx_open when ``h`` is null).
const char* fx_error(void* h) {
  return h ? static_cast<Handle*>(h)->error.c_str() : g_error.c_str();
}

// Resize ExecuTorch's shared threadpool (kernels and XNNPACK) to ``threads``. Returns the new
// thread count, or -1.
int fx_set_threads(uint32_t threads) {
  auto* pool = executorch::extension::threadpool::get_threadpool();
  if (pool == nullptr || !pool->_unsafe_reset_threadpool(threads)) return -1;
  return static_cast<int>(pool->get_thread_count());
}

// Load a program from ``size`` bytes at ``data`` (copied). On success *out is the handle.
int fx_open(const void* data, size_t size, void** out) {
  *out = nullptr;
  auto h = std::make_unique<Handle>();
  size_t padded = (size + 63) / 64 * 64;
  h->bytes = static_cast<uint8_t*>(std::aligned_alloc(64, padded == 0 ? 64 : padded));
  if (h->bytes == nullptr) return fail(nullptr, 0, "out of memory for the program");
  std::memcpy(h->bytes, data, size);
  h->size = size;
  h->module = std::make_unique<Module>(std::make_unique<BufferDataLoader>(h->bytes, h->size));
  Error err = h->module->load();
  if (err != Error::Ok) return fail(nullptr, static_cast<int>(err), "not an ExecuTorch program");
  *out = h.release();
  return 0;
}

void fx_close(void* h) { delete static_cast<Handle*>(h); }

// The program's method names, newline-separated (valid until the next call on ``h``).
const char* fx_method_names(void* hv) {
  auto* h = static_cast<Handle*>(hv);
  auto names = h->module->method_names();
  h->names.clear();
  if (names.ok()) {
    for (const auto& name : names.get()) h->names += name + "\n";
  }
  return h->names.c_str();
}

// Run ``method`` on ``n`` tensor inputs: dtypes[i] is an ExecuTorch ScalarType code (6 float,
// 4 int64), ndims[i] its rank, shapes the concatenated sizes, datas[i] its contiguous data
// (read during the call only). Returns 0 and keeps the outputs for fx_output.
int fx_run(void* hv, const char* method, int n, const int32_t* dtypes, const int32_t* ndims,
           const int64_t* shapes, void* const* datas) {
  auto* h = static_cast<Handle*>(hv);
  std::vector<TensorPtr> tensors;
  std::vector<EValue> inputs;
  tensors.reserve(n);
  inputs.reserve(n);
  for (int i = 0; i < n; ++i) {
    std::vector<executorch::aten::SizesType> sizes(shapes, shapes + ndims[i]);
    shapes += ndims[i];
    tensors.push_back(make_tensor_ptr(std::move(sizes), datas[i], static_cast<ScalarType>(dtypes[i])));
    inputs.emplace_back(tensors.back());
  }
  h->outputs.clear();
  auto result = h->module->execute(method, inputs);
  if (!result.ok()) {
    return fail(h, static_cast<int>(result.error()), std::string("method ") + method + " failed");
  }
  h->outputs = std::move(result.get());
  return 0;
}

int fx_num_outputs(void* hv) { return static_cast<int>(static_cast<Handle*>(hv)->outputs.size()); }

// Output ``i`` of the last run. *kind: 0 tensor (dtype, ndim, shape[<=16], data, nbytes set),
// 1 string (data, nbytes), 2 int, 3 double, 4 bool (the value in *scalar), -1 other.
int fx_output(void* hv, int i, int32_t* kind, int32_t* dtype, int32_t* ndim, int64_t* shape,
              void** data, size_t* nbytes, double* scalar) {
  auto* h = static_cast<Handle*>(hv);
  if (i < 0 || i >= static_cast<int>(h->outputs.size())) return fail(h, 0, "no such output");
  const EValue& value = h->outputs[i];
  *kind = -1;
  if (value.isTensor()) {
    const auto& t = value.toTensor();
    if (t.dim() > 16) return fail(h, 0, "output rank above 16");
    *kind = 0;
    *dtype = static_cast<int32_t>(t.scalar_type());
    *ndim = static_cast<int32_t>(t.dim());
    for (ssize_t d = 0; d < t.dim(); ++d) shape[d] = t.size(d);
    *data = t.mutable_data_ptr();
    *nbytes = t.nbytes();
  } else if (value.isString()) {
    auto text = value.toString();
    *kind = 1;
    *data = const_cast<char*>(text.data());
    *nbytes = text.size();
  } else if (value.isInt()) {
    *kind = 2;
    *scalar = static_cast<double>(value.toInt());
  } else if (value.isDouble()) {
    *kind = 3;
    *scalar = value.toDouble();
  } else if (value.isBool()) {
    *kind = 4;
    *scalar = value.toBool() ? 1.0 : 0.0;
  }
  return 0;
}

// Every output of the last run in one call: ``info`` is count x 21 int64 rows of
// (kind, dtype, ndim, data address, nbytes, shape[16]); kind as fx_output (0 tensor; read other
// kinds with fx_output). Returns the number of outputs, or -1 if ``count`` is too small.
int fx_outputs(void* hv, int count, int64_t* info) {
  auto* h = static_cast<Handle*>(hv);
  const int n = static_cast<int>(h->outputs.size());
  if (count < n) return -1;
  std::memset(info, 0, sizeof(int64_t) * 21 * n);
  for (int i = 0; i < n; ++i) {
    int64_t* row = info + 21 * i;
    const EValue& value = h->outputs[i];
    row[0] = value.isTensor() ? 0 : -1;
    if (!value.isTensor()) continue;
    const auto& t = value.toTensor();
    if (t.dim() > 16) return fail(h, 0, "output rank above 16");
    row[1] = static_cast<int64_t>(t.scalar_type());
    row[2] = t.dim();
    row[3] = reinterpret_cast<int64_t>(t.mutable_data_ptr());
    row[4] = static_cast<int64_t>(t.nbytes());
    for (ssize_t d = 0; d < t.dim(); ++d) row[5 + d] = t.size(d);
  }
  return n;
}

}  // extern "C"
