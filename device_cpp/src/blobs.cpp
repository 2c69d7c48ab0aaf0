#include "blobs.h"

#include <openssl/evp.h>
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

namespace fedsdk {

namespace {

bool exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

// The in-order prefix hash of §7.3 step 7.
struct PrefixHash {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  int64_t next = 0;
  PrefixHash() { EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr); }
  ~PrefixHash() { EVP_MD_CTX_free(ctx); }
  void reset() {
    EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
    next = 0;
  }
  void advance(const std::map<int64_t, std::string>& have, const std::string& bytes, int64_t chunk_bytes, int64_t size) {
    while (have.count(next)) {
      const int64_t begin = next * chunk_bytes, len = std::min(chunk_bytes, size - begin);
      if (len > 0) EVP_DigestUpdate(ctx, bytes.data() + begin, static_cast<size_t>(len));
      ++next;
    }
  }
  std::string hex() {
    unsigned char d[32];
    unsigned int n = 0;
    EVP_DigestFinal_ex(ctx, d, &n);
    static const char* h = "0123456789abcdef";
    std::string out;
    for (int i = 0; i < 32; ++i) out += {h[d[i] >> 4], h[d[i] & 15]};
    return out;
  }
};

}  // namespace

std::string Puller::fetch(const BlobRef& ref, int64_t chunk_bytes, double total_timeout_s, double idle_s) {
  if (ref.size > kMaxBlobBytes) throw CodedError("too_large", "blob of " + std::to_string(ref.size) + " bytes");
  mkdir((dir_ + "/blobs").c_str(), 0700);
  mkdir((dir_ + "/partial").c_str(), 0700);
  const std::string stored = dir_ + "/blobs/" + ref.id;
  if (exists(stored)) {
    std::string bytes = read_file(stored);
    if (sha256_hex(bytes) == ref.id) return bytes;
  }
  const int64_t count = chunk_count(ref.size, chunk_bytes);
  const std::string base = dir_ + "/partial/" + ref.id + "-" + std::to_string(chunk_bytes);
  std::string bytes(static_cast<size_t>(ref.size), '\0');
  std::map<int64_t, std::string> have;  // index -> declared sha256
  if (exists(base + ".part") && exists(base + ".have")) {  // resume (§7.3 step 3)
    std::string part = read_file(base + ".part");
    std::istringstream lines(read_file(base + ".have"));
    int64_t i;
    std::string sha;
    while (lines >> i >> sha)
      if (i >= 0 && i < count && is_hex(sha, 64, 64)) have[i] = sha;
    part.resize(bytes.size());
    bytes = part;
  }
  auto save_have = [&]() {
    std::ofstream out(base + ".have", std::ios::trunc);
    for (auto& [i, sha] : have) out << i << ' ' << sha << '\n';
  };
  {
    std::lock_guard<std::mutex> lock(mu_);
    active_ = ref.id;
    abort_code_.clear();
    frames_.clear();
  }
  struct Done {
    Puller* p;
    ~Done() {
      std::lock_guard<std::mutex> lock(p->mu_);
      p->active_.clear();
    }
  } done{this};
  const double deadline = mono_s() + total_timeout_s;
  const int64_t window = 16;
  PrefixHash hash;
  for (int attempt = 1; attempt <= 3; ++attempt) {
    std::deque<int64_t> missing;
    for (int64_t i = 0; i < count; ++i) if (!have.count(i)) missing.push_back(i);
    std::set<int64_t> outstanding;
    hash.reset();
    hash.advance(have, bytes, chunk_bytes, ref.size);
    int idle = 0;
    while (!missing.empty() || !outstanding.empty()) {
      if (!missing.empty() && static_cast<int64_t>(outstanding.size()) <= window / 2) {
        std::vector<int64_t> ask;
        while (!missing.empty() && static_cast<int64_t>(outstanding.size()) < window) {
          ask.push_back(missing.front());
          outstanding.insert(missing.front());
          missing.pop_front();
        }
        send_(ref.id, ask, chunk_bytes);
      }
      if (mono_s() > deadline) throw CodedError("timeout", "pulling " + ref.id.substr(0, 12) + " took too long");
      Frame f;
      {
        std::unique_lock<std::mutex> lock(mu_);
        const double wait = std::min(idle_s, deadline - mono_s());
        cv_.wait_for(lock, std::chrono::duration<double>(std::max(0.0, wait)),
                     [&] { return !frames_.empty() || !abort_code_.empty(); });
        if (!abort_code_.empty()) throw CodedError(abort_code_, "the holder refused " + ref.id.substr(0, 12));
        if (frames_.empty()) {
          if (++idle >= 5) throw CodedError("timeout", "no chunk of " + ref.id.substr(0, 12) + " for 25 s");
          for (auto it = outstanding.rbegin(); it != outstanding.rend(); ++it) missing.push_front(*it);
          outstanding.clear();
          continue;
        }
        f = std::move(frames_.front());
        frames_.pop_front();
      }
      idle = 0;
      if (!outstanding.count(f.index) || f.size != ref.size || f.chunk_bytes != chunk_bytes) continue;
      outstanding.erase(f.index);
      bytes.replace(static_cast<size_t>(f.index * chunk_bytes), f.data.size(), f.data);
      have[f.index] = f.sha256;
      {  // persist the chunk, then its line (resume after a restart)
        std::fstream part(base + ".part", std::ios::in | std::ios::out | std::ios::binary);
        if (!part) part.open(base + ".part", std::ios::out | std::ios::binary);
        part.seekp(f.index * chunk_bytes);
        part.write(f.data.data(), static_cast<std::streamsize>(f.data.size()));
        std::ofstream(base + ".have", std::ios::app) << f.index << ' ' << f.sha256 << '\n';
      }
      hash.advance(have, bytes, chunk_bytes, ref.size);
    }
    if (hash.hex() == ref.id) {
      write_file(stored, bytes);
      std::remove((base + ".part").c_str());
      std::remove((base + ".have").c_str());
      return bytes;
    }
    int corrupt = 0;  // only now compare chunks with their declared hashes (§7.3 step 5)
    for (auto it = have.begin(); it != have.end();) {
      const int64_t begin = it->first * chunk_bytes, len = std::min(chunk_bytes, ref.size - begin);
      if (sha256_hex(bytes.data() + begin, static_cast<size_t>(len)) != it->second) {
        it = have.erase(it);
        ++corrupt;
      } else {
        ++it;
      }
    }
    save_have();
    if (!corrupt) break;
    log("blob " + ref.id.substr(0, 12) + ": " + std::to_string(corrupt) + " corrupt chunk(s), fetching again");
  }
  std::remove((base + ".part").c_str());
  std::remove((base + ".have").c_str());
  throw CodedError("checksum_mismatch", "blob " + ref.id.substr(0, 12) + " does not hash to its id");
}

void Puller::on_frame(Frame frame) {
  std::lock_guard<std::mutex> lock(mu_);
  if (frame.blob != active_) return;  // frames of a blob not being pulled are dropped
  frames_.push_back(std::move(frame));
  cv_.notify_all();
}

void Puller::on_error(const std::string& ref, const std::string& code) {
  std::lock_guard<std::mutex> lock(mu_);
  if (ref != active_ || active_.empty()) return;
  abort_code_ = code;
  cv_.notify_all();
}

BlobRef Holder::offer(const std::string& bytes, const std::string& kind, const std::string& format) {
  BlobRef ref{sha256_hex(bytes), kind, format, static_cast<int64_t>(bytes.size())};
  std::lock_guard<std::mutex> lock(mu_);
  offered_[ref.id] = std::make_shared<const std::string>(bytes);
  return ref;
}

void Holder::withdraw_all() {
  std::lock_guard<std::mutex> lock(mu_);
  offered_.clear();
}

bool Holder::offered(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  return offered_.count(id) > 0;
}

void Holder::serve(const json& request) {
  const std::string id = request["blob"];
  std::shared_ptr<const std::string> blob;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = offered_.find(id);
    if (it != offered_.end()) blob = it->second;
  }
  if (!blob) return error_("not_offered", "blob " + id.substr(0, 12) + " was not offered to the server", id);
  const int64_t chunk_bytes = request["chunk_bytes"];
  if (chunk_bytes < 1 || chunk_bytes > kMaxChunkBytes) return error_("invalid_field", "chunk_bytes out of range", id);
  const int64_t size = static_cast<int64_t>(blob->size()), count = chunk_count(size, chunk_bytes);
  for (auto& index_j : request["indices"]) {
    const int64_t index = index_j.get<int64_t>();
    if (index < 0 || index >= count) return error_("invalid_field", "chunk index " + std::to_string(index) + " out of range", id);
    Frame f;
    f.blob = id, f.index = index, f.count = count, f.size = size, f.chunk_bytes = chunk_bytes;
    f.data = blob->substr(static_cast<size_t>(index * chunk_bytes), static_cast<size_t>(std::min(chunk_bytes, size - index * chunk_bytes)));
    f.sha256 = sha256_hex(f.data);
    publish_(encode_frame(f));
  }
}

}  // namespace fedsdk
