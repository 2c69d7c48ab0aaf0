#include "chunks.h"

#include <nlohmann/json.hpp>

namespace fedsdk {

int64_t chunk_count(int64_t size, int64_t chunk_bytes) {
  return std::max<int64_t>(1, (size + chunk_bytes - 1) / chunk_bytes);
}

std::string encode_frame(const Frame& f) {
  nlohmann::ordered_json h;
  h["blob"] = f.blob;
  h["index"] = f.index;
  h["count"] = f.count;
  h["size"] = f.size;
  h["chunk_bytes"] = f.chunk_bytes;
  h["sha256"] = f.sha256;
  std::string header = h.dump();
  std::string out = "FSC1";
  uint32_t n = static_cast<uint32_t>(header.size());
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((n >> shift) & 0xff));
  return out + header + f.data;
}

bool decode_frame(const std::string& payload, Frame* f, std::string* why) {
  auto fail = [&](const std::string& reason) { *why = reason; return false; };
  if (payload.size() < 8 || payload.compare(0, 4, "FSC1") != 0) return fail("no FSC1 magic");
  uint32_t n = 0;
  for (int i = 4; i < 8; ++i) n = (n << 8) | static_cast<unsigned char>(payload[i]);
  if (n > 1024 || 8 + static_cast<size_t>(n) > payload.size()) return fail("bad header length");
  nlohmann::json h;
  try {
    h = nlohmann::json::parse(payload.substr(8, n));
  } catch (const std::exception&) {
    return fail("header is not JSON");
  }
  if (!h.is_object()) return fail("header is not an object");
  for (const char* key : {"blob", "index", "count", "size", "chunk_bytes", "sha256"})
    if (!h.contains(key)) return fail(std::string("header lacks ") + key);
  if (!h["blob"].is_string() || !is_hex(h["blob"], 64, 64) || !h["sha256"].is_string() || !is_hex(h["sha256"], 64, 64))
    return fail("blob/sha256 is not 64 lowercase hex digits");
  for (const char* key : {"index", "count", "size", "chunk_bytes"})
    if (!h[key].is_number_integer()) return fail(std::string(key) + " is not an integer");
  f->blob = h["blob"], f->sha256 = h["sha256"];
  f->index = h["index"], f->count = h["count"], f->size = h["size"], f->chunk_bytes = h["chunk_bytes"];
  if (f->chunk_bytes < 1 || f->chunk_bytes > kMaxChunkBytes) return fail("chunk_bytes out of range");
  if (f->size < 0 || f->count != chunk_count(f->size, f->chunk_bytes)) return fail("count does not fit size");
  if (f->index < 0 || f->index >= f->count) return fail("index out of range");
  const int64_t expected = std::min(f->chunk_bytes, f->size - f->index * f->chunk_bytes);
  f->data = payload.substr(8 + n);
  if (static_cast<int64_t>(f->data.size()) != expected) return fail("data length differs from the header");
  return true;
}

}  // namespace fedsdk
