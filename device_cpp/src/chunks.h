// Chunk frames (docs/protocol.md §6.3): "FSC1", a big-endian header length, a JSON header, data.
#pragma once
#include "util.h"

namespace fedsdk {
constexpr int64_t kMaxChunkBytes = 4194304;

struct Frame {
  std::string blob, sha256, data;
  int64_t index = 0, count = 0, size = 0, chunk_bytes = 0;
};

int64_t chunk_count(int64_t size, int64_t chunk_bytes);  // max(1, ceil(size / chunk_bytes))
std::string encode_frame(const Frame& frame);
// Parses and checks a frame (§6.3); returns false (and says why) for a malformed one.
bool decode_frame(const std::string& payload, Frame* frame, std::string* why);
}  // namespace fedsdk
