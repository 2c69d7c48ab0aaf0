// fedsdk-device: the C++ device client (docs/device_cpp.md).
//   fedsdk-device run --broker URL --fleet F --device-id D --data DIR --work-dir DIR [--ca-file PEM]
//                     [--heartbeat S] [--announce-window S]
//   fedsdk-device train-once PROGRAM.pte WEIGHTS.safetensors DATA_DIR RECIPE.json OUT.safetensors
//     (one optimizer step on the first recipe.batch_size samples, in order, no dropout: parity tests)
#include <cstdio>
#include <cstring>
#include <string>

#include "npy.h"
#include "pte_trainer.h"
#include "safetensors.h"
#include "task.h"

#ifndef FEDSDK_NO_CLIENT
#include "client.h"
#endif

using namespace fedsdk;

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
