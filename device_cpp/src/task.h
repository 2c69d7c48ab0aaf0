// Running a task (docs/protocol.md §5.5, §9.2, §14): the strict config and recipe parsers and
// the steps. This client trains `pte/1` programs only (runtime name "executorch"); losses that
// read a teacher (kd, recipfl_kt) are refused with unsupported_task; the `features` output is
// accepted and declined (no record is sent, §20.1).
#pragma once
#include <functional>
#include <memory>

#include "blobs.h"
#include "npy.h"
#include "pte_trainer.h"
#include "safetensors.h"

namespace fedsdk {

struct Step {
  std::string train, teacher;  // teacher "" = none
  Recipe recipe;
};
struct Plan {
  std::vector<Step> steps;
  std::vector<std::string> returns;
  std::vector<std::string> reports;  // output names
};

// §14.1: unknown keys, wrong JSON types and bad values throw CodedError("invalid_field").
Recipe parse_recipe(const json& recipe);
// §5.5; `models` = the task's model names. invalid_field, or unsupported_task for an unknown output.
Plan parse_plan(const json& config, const std::vector<std::string>& models);

// The clock rule (§9.6): seconds left before the task's deadline (negative: late). With
// `server_time`, deadline - server_time counted on the monotonic clock from `arrived_mono` (when
// the task reached this device, mono_s()); without it, deadline - this device's wall clock.
double seconds_left(const json& task, double arrived_mono);

class TaskRunner {
 public:
  TaskRunner(std::string work_dir, Puller& puller, Holder& holder, const Dataset& data)
      : dir_(std::move(work_dir)), puller_(puller), holder_(holder), data_(data) {}
  // Runs a validated task; returns the `result` message (its blobs offered). Throws CodedError
  // with the refusal code (§9.3). `progress(f)` reports the fraction of the task done. The
  // deadline counts from `task["_arrived_mono"]` (set by the client on arrival; default now).
  nlohmann::ordered_json run(const json& task, const std::function<void(double)>& progress);

 private:
  PteTrainer& trainer_for(const BlobRef& program);
  std::string dir_;
  Puller& puller_;
  Holder& holder_;
  const Dataset& data_;
  std::map<std::string, std::unique_ptr<PteTrainer>> trainers_;  // by program id: loaded once
};

}  // namespace fedsdk
