// The client's local training data: a directory with x.npy (float32, shape (N, C, H, W))
// and y.npy (int64 or int32, shape (N,)), little-endian, C order (what numpy.save writes).
#pragma once
#include "util.h"

namespace fedsdk {
struct Dataset {
  int64_t n = 0, c = 0, h = 0, w = 0;
  std::vector<float> x;     // (N, C, H, W)
  std::vector<int64_t> y;   // (N,)
};
// Throws std::runtime_error with a one-line reason on any other layout.
Dataset load_dataset_dir(const std::string& dir);
}  // namespace fedsdk
