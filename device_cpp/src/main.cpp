// fedsdk-device: the C++ device client (docs/device_cpp.md).
//   fedsdk-device run --broker URL --fleet F --device-id D --data DIR --work-dir DIR [--ca-file PEM]
//                     [--heartbeat S] [--announce-window S]
//   fedsdk-device train-once PROGRAM.pte WEIGHTS.safetensors DATA_DIR RECIPE.json OUT.safetensors
//     (one optimizer step on the first recipe.batch_size samples, in order, no dropout: parity tests)
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <map>
#include <regex>
#include <string>
#include <thread>

#include "npy.h"
#include "pte_trainer.h"
#include "safetensors.h"
#include "task.h"

#include "fedsdk_device.h"

using namespace fedsdk;

namespace {
std::atomic<bool> g_stop{false};

// `run`'s options as the C ABI's JSON config (docs/device_cpp.md); throws on a bad option.
json run_config(int argc, char** argv) {
  json c = json::object();
  const std::map<std::string, std::string> keys = {
      {"--broker", "broker"},     {"--fleet", "fleet"},         {"--device-id", "device_id"},
      {"--data", "data_dir"},     {"--work-dir", "work_dir"},   {"--ca-file", "ca_file"},
      {"--heartbeat", "heartbeat_s"}, {"--announce-window", "announce_window_s"}};
  for (int i = 1; i < argc; ++i) {
    std::string key = argv[i];
    if (key == "--help") {
      std::printf("fedsdk-device run --broker URL --fleet F --device-id D --data DIR --work-dir DIR\n"
                  "  [--ca-file PEM] (mqtts: the only CA trusted)  [--heartbeat S] (default 10)\n"
                  "  [--announce-window S] (hello spread after a server restart; default: the server's)\n"
                  "DIR of --data holds x.npy (float32 N,C,H,W) and y.npy (int64 N).\n");
      std::exit(0);
    }
    auto it = keys.find(key);
    if (it == keys.end()) throw std::runtime_error("unknown option " + key);
    if (i + 1 >= argc) throw std::runtime_error(key + " needs a value");
    std::string v = argv[++i];
    if (key == "--heartbeat" || key == "--announce-window") c[it->second] = std::stod(v);
    else c[it->second] = v;
  }
  const std::regex name("^[A-Za-z0-9_.-]{1,64}$");
  if (!std::regex_match(c.value("fleet", ""), name) || !std::regex_match(c.value("device_id", ""), name))
    throw std::runtime_error("--fleet and --device-id must match [A-Za-z0-9_.-]{1,64}");
  if (!c.contains("broker") || !c.contains("data_dir") || !c.contains("work_dir"))
    throw std::runtime_error("--broker, --data and --work-dir are required");
  return c;
}

// `fedsdk-device run ...`: a device of libfedsdk_device until SIGTERM / SIGINT.
int run_client(int argc, char** argv) {
  fedsdk_device* device = nullptr;
  try {
    if (fedsdk_device_abi_version() != FEDSDK_DEVICE_ABI_VERSION) throw std::runtime_error("libfedsdk_device ABI mismatch");
    device = fedsdk_device_create(run_config(argc, argv).dump().c_str());
    if (!device) throw std::runtime_error(fedsdk_device_last_error(nullptr));
    std::signal(SIGTERM, [](int) { g_stop = true; });
    std::signal(SIGINT, [](int) { g_stop = true; });
    if (fedsdk_device_start(device) != FEDSDK_OK) throw std::runtime_error(fedsdk_device_last_error(device));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fedsdk-device: %s\n", e.what());
    fedsdk_device_free(device);
    return 1;
  }
  while (!g_stop) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  fedsdk_device_free(device);
  return 0;
}
}  // namespace

static int train_once(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr, "usage: fedsdk-device train-once PROGRAM WEIGHTS DATA_DIR RECIPE_JSON OUT\n");
    return 2;
  }
  PteTrainer trainer;
  trainer.load(argv[2]);
  Record weights = decode_safetensors(read_file(argv[3]));
  trainer.set_weights(weights);
  Dataset data = load_dataset_dir(argv[4]);
  Recipe recipe = parse_recipe(nlohmann::json::parse(read_file(argv[5])));
  std::vector<int64_t> idx;
  for (int64_t i = 0; i < std::min<int64_t>(recipe.batch_size, data.n); ++i) idx.push_back(i);
  double loss = trainer.train_one_batch(data, idx, recipe);
  write_file(argv[6], encode_safetensors(trainer.get_weights(weights.order)));
  std::printf("{\"loss\": %.9g}\n", loss);
  return 0;
}

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "train-once") == 0) {
    try {
      return train_once(argc, argv);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "train-once: %s\n", e.what());
      return 1;
    }
  }
  if (argc >= 2 && std::strcmp(argv[1], "run") == 0) return run_client(argc - 1, argv + 1);
  std::fprintf(stderr, "usage: fedsdk-device run ... | train-once ... (see --help in docs/device_cpp.md)\n");
  return 2;
}
