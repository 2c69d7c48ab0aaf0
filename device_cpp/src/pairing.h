// Pairing (docs/protocol.md §19): a one-time code becomes the device's own broker account.
// Decision: this client does not time training steps (no blobs are pulled); its pair_confirm's
// bench lists the executorch runtime untimed, so the server picks the tier from memory alone.
#pragma once
#include <nlohmann/json.hpp>

#include "mqtt.h"

namespace fedsdk {

struct PairInput {
  std::string broker;          // mqtt[s]://host[:port] (credentials in it are ignored: fedsdk-pair)
  std::string ca_fingerprint;  // "sha256:" + 64 hex of the CA's DER; required for mqtts://
  std::string code, name, work_dir;
  int64_t num_samples = -1;    // -1: unknown (null in the profile)
  double timeout_s = 60;
};

// Pairs; writes <work_dir>/ca.pem (mqtts) and <work_dir>/device.json (0600: device_id, fleet,
// username, password, broker, ca_file) and returns that JSON. Throws std::runtime_error with a
// one-line reason (a refused code, a CA that does not match the pin, no answer in time).
nlohmann::json pair_device(const PairInput& in);

// The stored pairing of `work_dir` (device.json), or null when the device is not paired.
nlohmann::json load_pairing(const std::string& work_dir);

// "sha256:<hex>" of the first certificate of `pem` (its DER bytes); throws on a bad PEM.
std::string ca_fingerprint(const std::string& pem);

}  // namespace fedsdk
