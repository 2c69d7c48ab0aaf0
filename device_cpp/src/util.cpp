#include "util.h"

#include <openssl/evp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>

namespace fedsdk {

std::string sha256_hex(const void* data, size_t size) {
  unsigned char digest[32];
  unsigned int len = 0;
  EVP_Digest(data, size, digest, &len, EVP_sha256(), nullptr);
  static const char* hex = "0123456789abcdef";
  std::string out(64, '0');
  for (int i = 0; i < 32; ++i) {
    out[2 * i] = hex[digest[i] >> 4];
    out[2 * i + 1] = hex[digest[i] & 15];
  }
  return out;
}

std::string sha256_hex(const std::string& bytes) { return sha256_hex(bytes.data(), bytes.size()); }

bool is_hex(const std::string& s, size_t min_len, size_t max_len) {
  if (s.size() < min_len || s.size() > max_len) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

double now_s() {
  using namespace std::chrono;
  static const double offset = [] {  // test hook: simulate a device whose clock is wrong
    const char* v = std::getenv("FEDSDK_CLOCK_OFFSET_S");
    return v ? std::atof(v) : 0.0;
  }();
  return duration<double>(system_clock::now().time_since_epoch()).count() + offset;
}

double mono_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

std::string random_hex(size_t digits) {
  static std::mutex mu;
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard<std::mutex> lock(mu);
  static const char* hex = "0123456789abcdef";
  std::string out(digits, '0');
  for (auto& c : out) c = hex[rng() & 15];
  return out;
}

namespace {
std::mutex g_log_mu;
std::map<int, std::function<void(const std::string&)>> g_sinks;
int g_next_sink = 0;
}  // namespace

void log(const std::string& line) {
  std::lock_guard<std::mutex> lock(g_log_mu);
  std::fprintf(stderr, "[fedsdk-device %.3f] %s\n", now_s(), line.c_str());
  std::fflush(stderr);
  for (auto& [id, sink] : g_sinks) sink(line);
}

int add_log_sink(std::function<void(const std::string&)> sink) {
  std::lock_guard<std::mutex> lock(g_log_mu);
  g_sinks[++g_next_sink] = std::move(sink);
  return g_next_sink;
}

void remove_log_sink(int id) {
  std::lock_guard<std::mutex> lock(g_log_mu);
  g_sinks.erase(id);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw std::runtime_error("cannot write " + path);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace fedsdk
