#include "pte_trainer.h"

#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor.h>

#include <dlfcn.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <numeric>
#include <random>

using executorch::extension::TensorPtr;
using executorch::extension::from_blob;
using executorch::extension::module::Module;
using executorch::runtime::EValue;
using executorch::aten::ScalarType;

namespace fedsdk {

namespace {
std::vector<int64_t> shape_of(const nlohmann::json& j) { return j.get<std::vector<int64_t>>(); }
int64_t numel(const std::vector<int64_t>& s) {
  return std::accumulate(s.begin(), s.end(), int64_t{1}, std::multiplies<int64_t>());
}
std::vector<executorch::aten::SizesType> sizes(const std::vector<int64_t>& s) {
  return std::vector<executorch::aten::SizesType>(s.begin(), s.end());
}

// Makes the program's kernel set (metadata "kernels", docs/protocol.md §23.8) runnable or throws
// CodedError("unsupported_kernels"). "portable" (or absent): ExecuTorch's own kernels, linked in.
// "fused": libfedsdk_kernels (`fedsdk runtime build --kernels`), loaded once from
// $FEDSDK_KERNELS_LIB with RTLD_GLOBAL; its kernels register themselves with the registry of the
// libexecutorch this client links, so it must be built against the same executorch package.
void require_kernels(const std::string& set) {
  if (set == "portable") return;
  if (set != "fused") throw CodedError("unsupported_kernels", "this client has no kernel set '" + set + "'");
  static std::mutex mu;
  static bool loaded = false;
  std::lock_guard<std::mutex> lock(mu);
  if (loaded) return;
  const char* path = std::getenv("FEDSDK_KERNELS_LIB");
  if (path == nullptr || *path == 0)
    throw CodedError("unsupported_kernels", "the 'fused' kernels are not loaded: set FEDSDK_KERNELS_LIB to "
                     "libfedsdk_kernels.so (fedsdk runtime build --kernels)");
  void* handle = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  if (handle == nullptr) throw CodedError("unsupported_kernels", std::string("cannot load the 'fused' kernels: ") + dlerror());
  auto registered = reinterpret_cast<int (*)()>(dlsym(handle, "fk_registered"));
  if (registered == nullptr || registered() != 1)
    throw CodedError("unsupported_kernels", std::string(path) + " did not register the 'fused' kernels");
  // The library's self-test (fedsdk_kernels.cpp): a miscompiled build is refused, not trained with.
  auto self_test = reinterpret_cast<double (*)()>(dlsym(handle, "fk_self_test"));
  const double error = self_test ? self_test() : INFINITY;
  if (!(error <= 1e-4))
    throw CodedError("unsupported_kernels", std::string(path) + " failed its self-test (relative error " +
                     std::to_string(error) + " > 1e-4)");
  loaded = true;
}
}  // namespace

// The inputs of one `train` call, in meta["train_inputs"] order, backed by these buffers.
struct Batch {
  std::vector<std::vector<float>> floats;  // one buffer per float input
  std::vector<int64_t> y;
  std::vector<TensorPtr> tensors;
};

PteTrainer::PteTrainer() = default;
PteTrainer::~PteTrainer() = default;

void PteTrainer::load(const std::string& path) {
  module_ = std::make_unique<Module>(path);
  auto names = module_->method_names();
  if (!names.ok() || !names->count("fedsdk_meta")) throw CodedError("bad_task", "not a fedsdk training program: no metadata method");
  auto out = module_->execute("fedsdk_meta");
  if (!out.ok() || out->empty() || !(*out)[0].isString()) throw CodedError("bad_task", "fedsdk_meta did not return a string");
  meta_ = nlohmann::json::parse(std::string((*out)[0].toString()));
  if (meta_.value("format", "") != "pte/1" || meta_.value("schema", 0) != 1)
    throw CodedError("bad_task", "program is not pte/1 schema 1");
  require_kernels(meta_.value("kernels", "portable"));
  param_order_.clear();
  running_order_.clear();
  running_.clear();
  for (auto& p : meta_["params"]) param_order_.push_back(p[0]);
  for (auto& r : meta_["running"]) {
    std::string name = r[0];
    auto shape = shape_of(r[1]);
    bool mean = name.size() >= 4 && name.compare(name.size() - 4, 4, "mean") == 0;
    running_[name] = Tensor{shape, std::vector<float>(numel(shape), mean ? 0.0f : 1.0f)};
    running_order_.push_back(name);
  }
  // One step on a zero batch (mask all ones) returns the parameter tensors (program memory).
  Batch zero;
  zero.floats.reserve(64);
  for (auto& in : meta_["train_inputs"]) {
    std::string name = in[0], dtype = in[2];
    auto shape = shape_of(in[1]);
    if (dtype == "int64") {
      zero.y.assign(numel(shape), 0);
      zero.tensors.push_back(from_blob(zero.y.data(), sizes(shape), ScalarType::Long));
      continue;
    }
    bool ones = name == "sample_mask" || name.rfind("dropout:", 0) == 0 ||
                (name.size() > 11 && name.compare(name.size() - 11, 11, "running_var") == 0);
    zero.floats.emplace_back(numel(shape), ones ? 1.0f : 0.0f);
    zero.tensors.push_back(from_blob(zero.floats.back().data(), sizes(shape)));
  }
  auto views = run_train(zero, nullptr, nullptr);
  for (auto& [name, t] : running_) {  // the zero step's statistics are not the model's
    bool mean = name.size() >= 4 && name.compare(name.size() - 4, 4, "mean") == 0;
    std::fill(t.data.begin(), t.data.end(), mean ? 0.0f : 1.0f);
  }
  params_.clear();
  std::map<std::string, std::vector<int64_t>> shapes;
  for (auto& p : meta_["params"]) shapes[p[0]] = shape_of(p[1]);
  size_t k = 0;
  for (auto& name_j : meta_["parameter_output_order"]) {
    std::string name = name_j;
    params_[name] = {views.at(k++), shapes.at(name)};
  }
}

std::vector<float*> PteTrainer::run_train(Batch& batch, double* loss, std::vector<int64_t>* predictions) {
  std::vector<EValue> inputs;
  for (auto& t : batch.tensors) inputs.emplace_back(*t);
  auto result = module_->execute("train", inputs);
  if (!result.ok()) throw CodedError("device_failure", "ExecuTorch train method failed (error " +
                                     std::to_string(static_cast<int>(result.error())) + ")");
  auto& outs = *result;
  const size_t n_user = meta_["train_outputs"].size(), n_params = meta_["params"].size();
  if (outs.size() != n_user + 2 * n_params) throw CodedError("bad_task", "train returned an unexpected number of outputs");
  if (loss) *loss = outs[0].toTensor().const_data_ptr<float>()[0];
  if (predictions) {
    auto& p = outs[1].toTensor();
    predictions->assign(p.const_data_ptr<int64_t>(), p.const_data_ptr<int64_t>() + p.numel());
  }
  for (size_t i = 0; i < running_order_.size(); ++i) {
    auto& t = outs[2 + i].toTensor();
    std::memmove(running_[running_order_[i]].data.data(), t.const_data_ptr<float>(), t.numel() * 4);
  }
  std::vector<float*> ptrs;  // gradients (gradient_order) then parameters (parameter_output_order)
  for (size_t i = n_user; i < outs.size(); ++i) ptrs.push_back(outs[i].toTensor().mutable_data_ptr<float>());
  if (!loss) return std::vector<float*>(ptrs.begin() + n_params, ptrs.end());
  return ptrs;
}

void PteTrainer::set_weights(const Record& record) {
  for (auto& [name, t] : record.tensors) {
    auto p = params_.find(name);
    auto r = running_.find(name);
    if (p == params_.end() && r == running_.end()) throw CodedError("bad_task", "tensor " + name + " is not one of the program's");
    const auto& shape = p != params_.end() ? p->second.second : r->second.shape;
    if (shape != t.shape) throw CodedError("bad_task", "tensor " + name + " has the wrong shape");
  }
  for (auto& [name, t] : record.tensors) {
    auto p = params_.find(name);
    if (p != params_.end()) std::memcpy(p->second.first, t.data.data(), t.data.size() * 4);
    else running_[name].data = t.data;
  }
}

Record PteTrainer::get_weights(const std::vector<std::string>& names) const {
  Record out;
  std::vector<std::string> all = names;
  if (all.empty()) {
    all = param_order_;
    all.insert(all.end(), running_order_.begin(), running_order_.end());
  }
  for (auto& name : all) {
    auto p = params_.find(name);
    Tensor t;
    if (p != params_.end()) {
      t.shape = p->second.second;
      t.data.assign(p->second.first, p->second.first + numel(t.shape));
    } else {
      t = running_.at(name);
    }
    out.order.push_back(name);
    out.tensors[name] = std::move(t);
  }
  return out;
}

namespace {

// The data as (N, H, W, C), the programs' input layout.
std::vector<float> channels_last(const Dataset& d) {
  std::vector<float> out(d.x.size());
  const int64_t hw = d.h * d.w, chw = d.c * hw;
  for (int64_t n = 0; n < d.n; ++n)
    for (int64_t c = 0; c < d.c; ++c)
      for (int64_t i = 0; i < hw; ++i) out[n * chw + i * d.c + c] = d.x[n * chw + c * hw + i];
  return out;
}

}  // namespace

struct DropoutMask {
  float* data;
  double p;
  int64_t count;
};

// The padded buffers of one batch (run_train reads them through batch.tensors), and where
// the data, the sample mask and the dropout masks go.
struct Inputs {
  Batch batch;
  float* x = nullptr;
  float* mask = nullptr;
  std::vector<DropoutMask> dropout;
};

static Inputs make_inputs(const nlohmann::json& meta, std::map<std::string, Tensor>& running) {
  Inputs out;
  Batch& batch = out.batch;
  batch.floats.reserve(64);
  for (auto& in : meta["train_inputs"]) {
    std::string name = in[0], dtype = in[2];
    auto shape = in[1].get<std::vector<int64_t>>();
    if (dtype == "int64") {
      batch.y.assign(numel(shape), 0);
      batch.tensors.push_back(from_blob(batch.y.data(), sizes(shape), ScalarType::Long));
    } else if (running.count(name)) {
      batch.tensors.push_back(from_blob(running[name].data.data(), sizes(shape)));
    } else {
      batch.floats.emplace_back(numel(shape), 1.0f);
      float* data = batch.floats.back().data();
      batch.tensors.push_back(from_blob(data, sizes(shape)));
      if (name == "x") out.x = data;
      else if (name == "sample_mask") out.mask = data;
      else if (name.rfind("dropout:", 0) == 0) {
        double p = 0;
        for (auto& d : meta["dropout"]) if (d[0] == name) p = d[1];
        out.dropout.push_back({data, p, numel(shape)});
      } else {
        throw CodedError("unsupported_task", "the program's loss reads " + name + " (a teacher), which this client does not compute");
      }
    }
  }
  return out;
}

StepStats PteTrainer::train(const Dataset& data, const Recipe& recipe, const std::function<void(double)>& progress) {
  const int64_t b = meta_["max_batch"], batch_size = recipe.batch_size;
  if (batch_size > b) throw CodedError("device_failure", "recipe batch exceeds the program's batch");
  Inputs in = make_inputs(meta_, running_);
  Batch& batch = in.batch;
  float* x_buf = in.x;
  float* mask = in.mask;
  std::vector<DropoutMask>& dropout = in.dropout;
  const std::vector<float> x = channels_last(data);
  const int64_t sample = data.c * data.h * data.w;
  std::mt19937_64 gen(static_cast<uint64_t>(recipe.seed));
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  std::vector<int64_t> order(data.n);
  const int64_t steps = (data.n + batch_size - 1) / batch_size;
  int64_t total = recipe.epochs * steps;  // optimiser steps in all: at most recipe.max_steps (> 0)
  if (recipe.max_steps > 0) total = std::min(total, recipe.max_steps);
  const int64_t last_epoch = steps ? (total - 1) / steps : -1;  // the epoch reported
  Optimizer opt(recipe);
  StepStats stats;
  double total_loss = 0;
  int64_t correct = 0, done = 0, seen = 0;
  for (int64_t epoch = 0; epoch <= last_epoch; ++epoch) {
    std::iota(order.begin(), order.end(), 0);
    for (int64_t i = data.n - 1; i > 0; --i) std::swap(order[i], order[gen() % static_cast<uint64_t>(i + 1)]);
    for (int64_t step = 0; step < steps && done < total; ++step) {
      const int64_t start = step * batch_size, real = std::min(batch_size, data.n - start);
      std::fill(x_buf, x_buf + b * sample, 0.0f);
      std::fill(batch.y.begin(), batch.y.end(), 0);
      for (int64_t j = 0; j < b; ++j) mask[j] = j < real ? 1.0f : 0.0f;
      for (int64_t j = 0; j < real; ++j) {
        const int64_t s = order[start + j];
        std::memcpy(x_buf + j * sample, x.data() + s * sample, sample * 4);
        batch.y[j] = data.y[s];
      }
      for (auto& drop : dropout)  // keep with probability 1 - p, scaled by 1 / (1 - p)
        for (int64_t k = 0; k < drop.count; ++k)
          drop.data[k] = uniform(gen) >= drop.p ? static_cast<float>(1.0 / (1.0 - drop.p)) : 0.0f;
      double loss = 0;
      std::vector<int64_t> predictions;
      auto ptrs = run_train(batch, &loss, &predictions);
      const size_t n_params = param_order_.size();
      opt.next();
      for (size_t k = 0; k < n_params; ++k) {
        const std::string& name = meta_["gradient_order"][k];
        auto& view = params_.at(name);
        opt.step(name, view.first, ptrs[k], numel(view.second));
      }
      ++done;
      if (epoch == last_epoch) {
        total_loss += loss * real;
        for (int64_t j = 0; j < real; ++j) correct += predictions[j] == batch.y[j];
        seen += real;
      }
      if (progress) progress(double(done) / double(total));
    }
  }
  stats.samples = seen ? data.n : 0;
  stats.loss = seen ? total_loss / seen : 0.0;
  stats.accuracy = seen ? double(correct) / seen : 0.0;
  return stats;
}

double PteTrainer::train_one_batch(const Dataset& data, const std::vector<int64_t>& idx, const Recipe& recipe) {
  Dataset sub;
  sub.c = data.c, sub.h = data.h, sub.w = data.w, sub.n = static_cast<int64_t>(idx.size());
  const int64_t sample = data.c * data.h * data.w;
  for (auto i : idx) {
    sub.x.insert(sub.x.end(), data.x.begin() + i * sample, data.x.begin() + (i + 1) * sample);
    sub.y.push_back(data.y[i]);
  }
  // A one-sample "shuffle" of a single batch keeps the order: train on sub in order.
  Recipe r = recipe;
  r.epochs = 1;
  r.batch_size = sub.n;
  Inputs in = make_inputs(meta_, running_);
  Batch& batch = in.batch;
  float* x_buf = in.x;
  float* mask = in.mask;
  // dropout masks stay all ones: no dropout in a parity step
  const std::vector<float> x = channels_last(sub);
  const int64_t b = meta_["max_batch"];
  std::fill(x_buf, x_buf + b * sample, 0.0f);
  for (int64_t j = 0; j < b; ++j) mask[j] = j < sub.n ? 1.0f : 0.0f;
  std::memcpy(x_buf, x.data(), x.size() * 4);
  for (int64_t j = 0; j < sub.n; ++j) batch.y[j] = sub.y[j];
  double loss = 0;
  std::vector<int64_t> predictions;
  auto ptrs = run_train(batch, &loss, &predictions);
  Optimizer opt(r);
  opt.next();
  for (size_t k = 0; k < param_order_.size(); ++k) {
    const std::string& name = meta_["gradient_order"][k];
    auto& view = params_.at(name);
    opt.step(name, view.first, ptrs[k], numel(view.second));
  }
  return loss;
}

void Optimizer::step(const std::string& name, float* p, const float* grad_in, size_t n) {
  std::vector<float> g(grad_in, grad_in + n);
  if (r_.prox_mu != 0.0) {  // FedProx: mu * (w - w_start), w_start = the value at the first step
    auto it = start_.find(name);
    if (it == start_.end()) it = start_.emplace(name, std::vector<float>(p, p + n)).first;
    const float mu = static_cast<float>(r_.prox_mu);
    for (size_t i = 0; i < n; ++i) g[i] += mu * (p[i] - it->second[i]);
  }
  if (r_.weight_decay != 0.0) {
    const float wd = static_cast<float>(r_.weight_decay);
    for (size_t i = 0; i < n; ++i) g[i] += wd * p[i];
  }
  const float lr = static_cast<float>(r_.lr);
  if (r_.optimizer == "adam") {
    const double b1 = 0.9, b2 = 0.999;
    const float step_size = static_cast<float>(r_.lr / (1.0 - std::pow(b1, adam_steps_)));
    const float c2 = static_cast<float>(std::sqrt(1.0 - std::pow(b2, adam_steps_)));
    auto& m = m_.try_emplace(name, n, 0.0f).first->second;
    auto& v = v_.try_emplace(name, n, 0.0f).first->second;
    for (size_t i = 0; i < n; ++i) {
      m[i] += static_cast<float>(1.0 - b1) * (g[i] - m[i]);
      v[i] = v[i] * static_cast<float>(b2) + static_cast<float>(1.0 - b2) * g[i] * g[i];
      p[i] -= step_size * (m[i] / (std::sqrt(v[i]) / c2 + 1e-8f));
    }
    return;
  }
  if (r_.momentum != 0.0) {  // buf = g on the first step, else momentum * buf + g
    auto it = buf_.find(name);
    if (it == buf_.end()) {
      it = buf_.emplace(name, g).first;
    } else {
      const float mom = static_cast<float>(r_.momentum);
      for (size_t i = 0; i < n; ++i) it->second[i] = it->second[i] * mom + g[i];
    }
    for (size_t i = 0; i < n; ++i) p[i] -= lr * it->second[i];
    return;
  }
  for (size_t i = 0; i < n; ++i) p[i] -= lr * g[i];
}

}  // namespace fedsdk
