// Blob transfer (docs/protocol.md §7): pulling with windowed requests, resume and re-fetch of
// corrupt chunks (Puller), and serving offered blobs (Holder).
#pragma once
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>

#include "chunks.h"
#include "messages.h"

namespace fedsdk {

constexpr int64_t kMaxBlobBytes = 536870912;  // 512 MiB

class Puller {
 public:
  using SendRequest = std::function<void(const std::string& blob, const std::vector<int64_t>& indices, int64_t chunk_bytes)>;
  Puller(std::string work_dir, SendRequest send) : dir_(std::move(work_dir)), send_(std::move(send)) {}
  // The verified bytes of `ref`, from the store or pulled; throws CodedError (too_large,
  // timeout, checksum_mismatch, or the holder's error code).
  std::string fetch(const BlobRef& ref, int64_t chunk_bytes = 262144, double total_timeout_s = 120, double idle_s = 5);
  void on_frame(Frame frame);                                       // network thread
  void on_error(const std::string& ref, const std::string& code);  // network thread

 private:
  std::string dir_;
  SendRequest send_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string active_, abort_code_;
  std::deque<Frame> frames_;
};

class Holder {
 public:
  using Publish = std::function<void(const std::string& payload)>;       // a frame on up/chunk
  using SendError = std::function<void(const std::string& code, const std::string& detail, const std::string& ref)>;
  Holder(Publish publish, SendError error) : publish_(std::move(publish)), error_(std::move(error)) {}
  BlobRef offer(const std::string& bytes, const std::string& kind, const std::string& format);
  void withdraw_all();
  bool offered(const std::string& id);
  // Answers one validated blob_request (§7.2).
  void serve(const json& request);

 private:
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<const std::string>> offered_;
  Publish publish_;
  SendError error_;
};

}  // namespace fedsdk
