// The device agent (docs/protocol.md §3.1, §9): hello, the server epoch, tasks one at a time on
// a worker thread, blob serving on its own thread, heartbeats, and the result re-offer.
// libfedsdk_device's C ABI (capi.cpp) and through it the executable drive it.
#pragma once
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>

#include "npy.h"

namespace fedsdk {

struct Options {
  std::string broker, fleet, device_id, work_dir, ca_file;
  double heartbeat_s = 10.0, announce_window_s = -1.0;  // < 0: the server epoch's window
};

struct ClientHooks {
  // Refills the dataset before a task (and at start); false (with a log line) keeps the old one.
  std::function<bool(Dataset*)> load_data;
  // One event object (see fedsdk_device.h), on the client's threads.
  std::function<void(const nlohmann::json&)> on_event;
};

class Agent;

class Client {
 public:
  Client(const Options& o, ClientHooks hooks);
  ~Client();
  // Loads the data, connects (throws if the broker does not answer within 15 s), says hello
  // and starts the threads.
  void start();
  // Stops the threads, publishes "offline", disconnects. Idempotent.
  void stop();
  nlohmann::json status() const;

 private:
  std::unique_ptr<Agent> agent_;
};
}  // namespace fedsdk
