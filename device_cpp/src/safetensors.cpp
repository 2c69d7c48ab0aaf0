#include "safetensors.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

namespace fedsdk {

Record decode_safetensors(const std::string& bytes) {
  if (bytes.size() < 8) throw CodedError("malformed", "safetensors shorter than 8 bytes");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  if (n > bytes.size() - 8) throw CodedError("malformed", "safetensors header runs past the end");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.substr(8, n));
  } catch (const std::exception& e) {
    throw CodedError("malformed", std::string("safetensors header: ") + e.what());
  }
  if (!header.is_object()) throw CodedError("malformed", "safetensors header is not an object");
  const size_t base = 8 + n, data_len = bytes.size() - base;
  Record record;
  // nlohmann's object is sorted by key; the file's order is recovered from the data offsets.
  std::vector<std::pair<uint64_t, std::string>> by_offset;
  for (auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    if (!info.is_object() || info.value("dtype", "") != "F32")
      throw CodedError("malformed", name + ": only F32 tensors are supported");
    Tensor t;
    uint64_t numel = 1;
    for (auto& d : info.at("shape")) {
      t.shape.push_back(d.get<int64_t>());
      numel *= d.get<uint64_t>();
    }
    auto begin = info.at("data_offsets").at(0).get<uint64_t>();
    auto end = info.at("data_offsets").at(1).get<uint64_t>();
    if (end < begin || end > data_len || end - begin != numel * 4)
      throw CodedError("malformed", name + ": data offsets do not fit its shape");
    t.data.resize(numel);
    if (numel) std::memcpy(t.data.data(), bytes.data() + base + begin, numel * 4);
    record.tensors[name] = std::move(t);
    by_offset.emplace_back(begin, name);
  }
  std::sort(by_offset.begin(), by_offset.end());
  for (auto& p : by_offset) record.order.push_back(p.second);
  return record;
}

std::string encode_safetensors(const Record& record) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  uint64_t offset = 0;
  for (const auto& name : record.order) {
    const Tensor& t = record.tensors.at(name);
    header[name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.data.size() * 4}}};
    offset += t.data.size() * 4;
  }
  std::string head = header.dump();
  while (head.size() % 8) head.push_back(' ');
  std::string out(8, '\0');
  uint64_t n = head.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out += head;
  for (const auto& name : record.order) {
    const Tensor& t = record.tensors.at(name);
    out.append(reinterpret_cast<const char*>(t.data.data()), t.data.size() * 4);
  }
  return out;
}

}  // namespace fedsdk
