// Control messages (docs/protocol.md §5): the envelope, encoding and full validation (§5.2).
#pragma once
#include <nlohmann/json.hpp>

#include "util.h"

namespace fedsdk {
using json = nlohmann::json;

constexpr size_t kMaxControlBytes = 65536;

// {"schema": 2, "type": type, "msg_id": 32 hex, "sent_at": now}; add the type's fields after.
nlohmann::ordered_json envelope(const std::string& type);
// Compact JSON, non-ASCII escaped; throws CodedError("too_large") over 64 KiB.
std::string encode(const nlohmann::ordered_json& message);

// Parses and validates one control message (§5.2 steps 1-7); throws CodedError with the
// envelope code (too_large, malformed, unsupported_schema, unknown_type, invalid_field).
json decode(const std::string& payload);

// A BlobRef (§5.3) as read from a validated message.
struct BlobRef {
  std::string id, kind, format;
  int64_t size = 0;
};
BlobRef blob_ref(const json& j);
nlohmann::ordered_json to_json(const BlobRef& ref);
}  // namespace fedsdk
