// Small shared helpers: SHA-256 (OpenSSL), clocks, random ids, logging, an F32 tensor type.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace fedsdk {

// A float32 tensor, row-major (C order). Every array record this client handles is F32.
struct Tensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
};

// Tensors by name, plus the order they came in (a result returns the task's names).
struct Record {
  std::vector<std::string> order;
  std::map<std::string, Tensor> tensors;
};

// An error that carries a protocol error code (docs/protocol.md §11), e.g. "bad_task".
struct CodedError : std::runtime_error {
  std::string code;
  CodedError(std::string c, const std::string& what) : std::runtime_error(what), code(std::move(c)) {}
};

std::string sha256_hex(const void* data, size_t size);
std::string sha256_hex(const std::string& bytes);
bool is_hex(const std::string& s, size_t min_len, size_t max_len);
double now_s();                // wall clock, Unix seconds (+ $FEDSDK_CLOCK_OFFSET_S, a test hook)
double mono_s();               // monotonic seconds
std::string random_hex(size_t digits);
void log(const std::string& line);  // to stderr and to every log sink
// Log sinks (the C ABI's event listeners): every log line is handed to each, in this process.
int add_log_sink(std::function<void(const std::string&)> sink);  // returns its id
void remove_log_sink(int id);
std::string read_file(const std::string& path);
void write_file(const std::string& path, const std::string& bytes);

}  // namespace fedsdk
