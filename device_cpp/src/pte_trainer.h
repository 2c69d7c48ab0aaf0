// Trains a `pte/1` program (export/executorch.py) with the ExecuTorch Module API, as
// sdk_device/runtimes/executorch_runtime.py does:
// * `fedsdk_meta` (a JSON string) names every input/output of `train`;
// * one `train` call on a zero batch returns the parameter tensors, which alias the program's
//   memory: weights are written into them in place and the optimizer updates them there;
// * BatchNorm running statistics are inputs/outputs kept here;
// * the batch is fixed (meta max_batch): a short batch is zero-padded and masked.
// Decision: data order per epoch is a Fisher-Yates shuffle driven by std::mt19937_64 seeded with
// the recipe's seed (not torch.randperm); dropout masks come from the same generator.
#pragma once
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>

#include "npy.h"
#include "util.h"

namespace executorch::extension::module { class Module; }

namespace fedsdk {

struct Recipe {
  int64_t epochs = 1, batch_size = 32, seed = 0, teacher_features = 0, max_steps = 0;  // max_steps 0: no bound
  std::string optimizer = "sgd", loss = "ce";
  double lr = 0.05, momentum = 0.9, weight_decay = 0.0, prox_mu = 0.0, temperature = 1.0, alpha = 0.0;
};

struct StepStats {
  int64_t samples = 0;
  double loss = 0.0, accuracy = 0.0;
};

struct Batch;  // the padded inputs of one `train` call (pte_trainer.cpp)

class PteTrainer {
 public:
  PteTrainer();
  ~PteTrainer();
  // Loads the program file; throws CodedError("bad_task") when it is not a pte/1 training program,
  // CodedError("unsupported_kernels") when it needs a kernel set this client cannot load.
  void load(const std::string& path);
  const nlohmann::json& meta() const { return meta_; }
  // Writes the named tensors into the program; names it does not hold, or wrong shapes, throw
  // CodedError("bad_task"). Names absent from `record` keep their current value (§13.3).
  void set_weights(const Record& record);
  // Copies out the named tensors (all of the program's when `names` is empty).
  Record get_weights(const std::vector<std::string>& names) const;
  // recipe.epochs passes of mini-batch training, at most recipe.max_steps steps when > 0 (stats of
  // the last epoch that ran, samples = N); `progress(f)` after each step, f in (0, 1].
  StepStats train(const Dataset& data, const Recipe& recipe, const std::function<void(double)>& progress);
  // One optimizer step on the batch `idx` of `data` (no shuffling, no dropout): for parity tests.
  double train_one_batch(const Dataset& data, const std::vector<int64_t>& idx, const Recipe& recipe);

 private:
  std::vector<float*> run_train(Batch& batch, double* loss, std::vector<int64_t>* predictions);
  std::unique_ptr<executorch::extension::module::Module> module_;
  nlohmann::json meta_;
  std::map<std::string, std::pair<float*, std::vector<int64_t>>> params_;  // views of program memory
  std::map<std::string, Tensor> running_;
  std::vector<std::string> param_order_, running_order_;
};

// Applies one optimizer step in place; torch.optim's single-tensor rules (optimizers.py).
class Optimizer {
 public:
  explicit Optimizer(const Recipe& r) : r_(r) {}
  void next() { ++adam_steps_; }  // once per optimizer step, before the step() of each tensor
  void step(const std::string& name, float* param, const float* grad, size_t n);

 private:
  Recipe r_;
  int64_t adam_steps_ = 0;
  std::map<std::string, std::vector<float>> buf_, m_, v_, start_;
};

}  // namespace fedsdk
