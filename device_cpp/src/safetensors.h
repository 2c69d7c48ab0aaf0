// safetensors array records (docs/protocol.md §13.1), F32 tensors only.
#pragma once
#include "util.h"

namespace fedsdk {
// Parses a safetensors file; throws CodedError("malformed") on a bad file or a non-F32 tensor.
Record decode_safetensors(const std::string& bytes);
// Encodes the tensors of `record` in `record.order` (no __metadata__).
std::string encode_safetensors(const Record& record);
}  // namespace fedsdk
