#include "task.h"

#include <cmath>
#include <regex>
#include <set>

namespace fedsdk {

namespace {
[[noreturn]] void invalid(const std::string& what) { throw CodedError("invalid_field", what); }
const std::regex kName("^[a-z][a-z0-9_]{0,31}$");
bool is_name(const json& j) { return j.is_string() && std::regex_match(j.get<std::string>(), kName); }
double number(const json& j, const std::string& key) {
  if (!j.is_number()) invalid("recipe." + key + ": expected a number");
  double v = j.get<double>();
  if (!std::isfinite(v)) invalid("recipe." + key + ": not finite");
  return v;
}
int64_t integer(const json& j, const std::string& key) {
  if (!j.is_number_integer()) invalid("recipe." + key + ": expected an integer");
  return j.get<int64_t>();
}
std::string string(const json& j, const std::string& key) {
  if (!j.is_string()) invalid("recipe." + key + ": expected a string");
  return j.get<std::string>();
}
// The losses of docs/protocol.md §14.3 that read a teacher's outputs (depthfl_sd and ce read none).
bool reads_teacher(const std::string& loss) { return loss == "kd" || loss == "recipfl_kt"; }
}  // namespace

Recipe parse_recipe(const json& j) {
  Recipe r;
  if (!j.is_object()) return r;  // the reference treats a non-object as {} (§5.5)
  for (auto& [key, v] : j.items()) {
    if (key == "epochs") r.epochs = integer(v, key);
    else if (key == "batch_size") r.batch_size = integer(v, key);
    else if (key == "optimizer") r.optimizer = string(v, key);
    else if (key == "lr") r.lr = number(v, key);
    else if (key == "momentum") r.momentum = number(v, key);
    else if (key == "weight_decay") r.weight_decay = number(v, key);
    else if (key == "loss") r.loss = string(v, key);
    else if (key == "seed") r.seed = integer(v, key);
    else if (key == "temperature") r.temperature = number(v, key);
    else if (key == "alpha") r.alpha = number(v, key);
    else if (key == "teacher_features") r.teacher_features = integer(v, key);
    else if (key == "prox_mu") r.prox_mu = number(v, key);
    else if (key == "max_steps") r.max_steps = integer(v, key);
    else invalid("recipe: unknown key " + key);
  }
  if (r.epochs < 1) invalid("recipe.epochs must be >= 1");
  if (r.batch_size < 1) invalid("recipe.batch_size must be > 0");
  if (r.optimizer != "sgd" && r.optimizer != "adam") invalid("recipe.optimizer must be sgd or adam");
  if (r.lr <= 0) invalid("recipe.lr must be > 0");
  if (r.loss != "ce" && r.loss != "kd" && r.loss != "recipfl_kt" && r.loss != "depthfl_sd") invalid("recipe.loss: unknown loss " + r.loss);
  if (r.temperature <= 0) invalid("recipe.temperature must be > 0");
  if (r.alpha < 0 || r.alpha > 1) invalid("recipe.alpha must be in 0..1");
  if (r.teacher_features < 0) invalid("recipe.teacher_features must be >= 0");
  if (r.prox_mu < 0) invalid("recipe.prox_mu must be >= 0");
  if (r.max_steps < 0) invalid("recipe.max_steps must be >= 0");
  return r;
}

Plan parse_plan(const json& config, const std::vector<std::string>& models) {
  const std::set<std::string> known(models.begin(), models.end());
  auto model = [&](const json& j, const std::string& where) {
    if (!is_name(j) || !known.count(j.get<std::string>())) invalid(where + ": not a model of the task");
    return j.get<std::string>();
  };
  if (!config.is_object()) invalid("config: not an object");
  for (auto& [key, _] : config.items())
    if (key != "steps" && key != "return" && key != "report") invalid("config: unknown key " + key);
  if (!config.contains("steps") || !config["steps"].is_array() || config["steps"].empty() || config["steps"].size() > 8)
    invalid("config.steps: 1 to 8 steps");
  Plan plan;
  for (auto& s : config["steps"]) {
    if (!s.is_object()) invalid("config.steps: a step must be an object");
    for (auto& [key, _] : s.items())
      if (key != "train" && key != "recipe" && key != "teacher") invalid("step: unknown key " + key);
    Step step;
    step.train = model(s.value("train", json()), "step.train");
    step.recipe = parse_recipe(s.value("recipe", json::object()));
    if (s.contains("teacher") && !s["teacher"].is_null()) {
      step.teacher = model(s["teacher"], "step.teacher");
      if (step.teacher == step.train) invalid("step.teacher: the trained model cannot be its own teacher");
    }
    if (reads_teacher(step.recipe.loss) && step.teacher.empty()) invalid("step: loss " + step.recipe.loss + " needs a teacher");
    plan.steps.push_back(step);
  }
  if (config.contains("return")) {
    if (!config["return"].is_array()) invalid("config.return: not an array");
    for (auto& r : config["return"]) {
      std::string name = model(r, "config.return");
      if (std::find(plan.returns.begin(), plan.returns.end(), name) != plan.returns.end()) invalid("config.return: duplicate " + name);
      plan.returns.push_back(name);
    }
  } else {
    plan.returns = {model(json("model"), "config.return")};
  }
  if (config.contains("report")) {
    const json& report = config["report"];
    if (!report.is_object() || report.size() > 8) invalid("config.report: an object of at most 8 outputs");
    for (auto& [name, params] : report.items()) {
      if (!is_name(json(name)) || !params.is_object()) invalid("config.report: bad entry " + name);
      if (name == "label_counts") {
        if (!params.empty()) invalid("label_counts takes no parameters");
      } else if (name == "features") {
        for (auto& [k, v] : params.items()) {
          if (k == "samples") {
            if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > 4096) invalid("features.samples: 1..4096");
          } else if (k == "model") {
            model(v, "features.model");
          } else {
            invalid("features: unknown parameter " + k);
          }
        }
        if (!params.contains("samples")) invalid("features: samples is required");
      } else {
        throw CodedError("unsupported_task", "unknown output " + name);
      }
      plan.reports.push_back(name);
    }
  }
  return plan;
}

PteTrainer& TaskRunner::trainer_for(const BlobRef& program) {
  auto it = trainers_.find(program.id);
  if (it != trainers_.end()) return *it->second;
  puller_.fetch(program);  // stored under <work>/blobs/<id>, which ExecuTorch loads
  auto trainer = std::make_unique<PteTrainer>();
  trainer->load(dir_ + "/blobs/" + program.id);
  return *trainers_.emplace(program.id, std::move(trainer)).first->second;
}

double seconds_left(const json& task, double arrived_mono) {
  const double deadline = task["deadline"].get<double>();
  const json server_time = task.value("server_time", json());
  if (server_time.is_number()) return deadline - server_time.get<double>() - (mono_s() - arrived_mono);
  return deadline - now_s();
}

nlohmann::ordered_json TaskRunner::run(const json& task, const std::function<void(double)>& progress) {
  const std::string task_id = task["task_id"];
  if (seconds_left(task, task.value("_arrived_mono", mono_s())) <= 0)
    throw CodedError("deadline_passed", "task arrived after its deadline");
  std::vector<std::string> models;
  for (auto& [name, _] : task["programs"].items()) models.push_back(name);  // sorted: name order
  Plan plan = parse_plan(task["config"], models);
  std::set<std::string> trained;
  for (auto& step : plan.steps) {
    if (reads_teacher(step.recipe.loss))
      throw CodedError("unsupported_task", "loss " + step.recipe.loss + " reads a teacher; this client trains no teacher loss");
    trained.insert(step.train);
  }
  std::map<std::string, BlobRef> programs;
  for (auto& name : trained) {
    for (auto& ref : task["programs"][name])
      if (ref["format"] == "pte/1") programs[name] = blob_ref(ref);
    if (!programs.count(name)) throw CodedError("unsupported_task", "no pte/1 program for model " + name);
  }
  // Pull and load, per model in name order: its program (trained models), then its array record.
  std::map<std::string, PteTrainer*> trainers;
  std::map<std::string, std::string> sent;  // model -> the array record's bytes
  std::map<std::string, Record> sent_records;
  const double fetch_start = mono_s();
  try {
    for (auto& name : models) {
      const bool needed = trained.count(name) || std::count(plan.returns.begin(), plan.returns.end(), name);
      if (!needed) continue;  // neither trained nor returned: skipped (§5.5 allows it)
      if (trained.count(name)) trainers[name] = &trainer_for(programs[name]);
      sent[name] = puller_.fetch(blob_ref(task["arrays"][name]));
      sent_records[name] = decode_safetensors(sent[name]);
      if (trained.count(name)) trainers[name]->set_weights(sent_records[name]);
    }
  } catch (const CodedError& e) {
    if (e.code == "unsupported_kernels") throw;  // its own code: the server falls back to a portable program
    throw CodedError("bad_task", "could not load the task: " + e.code + ": " + e.what());
  } catch (const std::exception& e) {
    throw CodedError("bad_task", std::string("could not load the task: ") + e.what());
  }
  const double fetch_s = mono_s() - fetch_start, train_start = mono_s();
  nlohmann::ordered_json metrics;
  StepStats last;
  for (size_t i = 0; i < plan.steps.size(); ++i) {
    const Step& step = plan.steps[i];
    const double steps = static_cast<double>(plan.steps.size());
    StepStats stats = trainers.at(step.train)->train(data_, step.recipe, [&](double f) { progress((i + f) / steps); });
    if (i + 1 < plan.steps.size()) {
      metrics[step.train + "_loss"] = std::isfinite(stats.loss) ? json(stats.loss) : json();
      metrics[step.train + "_accuracy"] = stats.accuracy;
    }
    last = stats;
  }
  if (last.samples <= 0) throw CodedError("device_failure", "no local samples to train on");
  nlohmann::ordered_json arrays = nlohmann::ordered_json::object();
  for (auto& name : plan.returns) {
    std::string bytes = trained.count(name) ? encode_safetensors(trainers[name]->get_weights(sent_records[name].order))
                                            : sent[name];
    arrays[name] = to_json(holder_.offer(bytes, "weights", "safetensors"));
  }
  metrics["samples"] = last.samples;
  metrics["loss"] = std::isfinite(last.loss) ? json(last.loss) : json();
  metrics["accuracy"] = last.accuracy;
  if (std::count(plan.reports.begin(), plan.reports.end(), "label_counts")) {
    std::vector<int64_t> counts;
    for (auto y : data_.y) {
      if (y >= static_cast<int64_t>(counts.size())) counts.resize(y + 1, 0);
      ++counts[y];
    }
    metrics["label_counts"] = counts;
  }
  metrics["wall_time_s"] = mono_s() - train_start;
  metrics["fetch_s"] = fetch_s;
  metrics["runtime"] = "executorch";
  auto result = envelope("result");
  result["task_id"] = task_id;
  result["round"] = task["round"];
  result["arrays"] = arrays;
  result["metrics"] = metrics;
  return result;
}

}  // namespace fedsdk
