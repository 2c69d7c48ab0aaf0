#include "client.h"

#include <sys/stat.h>

#include <atomic>
#include <cstring>
#include <random>
#include <regex>
#include <thread>

#include "blobs.h"
#include "mqtt.h"
#include "task.h"

namespace fedsdk {

namespace {

// A blocking queue of validated control messages.
class Queue {
 public:
  void push(json m) {
    std::lock_guard<std::mutex> lock(mu_);
    items_.push_back(std::move(m));
    cv_.notify_one();
  }
  bool pop(json* out, double timeout_s) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return !items_.empty(); })) return false;
    *out = std::move(items_.front());
    items_.pop_front();
    return true;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<json> items_;
};

}  // namespace

class Agent {
 public:
  Agent(const Options& o, ClientHooks hooks)
      : hooks_(std::move(hooks)),
        o_(o),
        root_("fedsdk/v1/" + o.fleet + "/"),
        dev_(root_ + "dev/" + o.device_id + "/"),
        link_("fedsdk-dev-" + o.fleet + "-" + o.device_id, parse_broker_url(o.broker), o.ca_file, dev_ + "status",
              {dev_ + "down", dev_ + "down/chunk", root_ + "broadcast/epoch", root_ + "server/status"}),
        puller_(o.work_dir, [this](const std::string& blob, const std::vector<int64_t>& idx, int64_t cb) {
          auto m = envelope("blob_request");
          m["blob"] = blob;
          m["indices"] = idx;
          m["chunk_bytes"] = cb;
          send(m);
        }),
        holder_([this](const std::string& frame) { link_.publish(dev_ + "up/chunk", frame); },
                [this](const std::string& code, const std::string& detail, const std::string& ref) { send_error(code, detail, ref); }),
        runner_(o.work_dir, puller_, holder_, data_) {}

  void start() {
    if (!hooks_.load_data(&data_)) throw std::runtime_error("no training data");
    num_samples_ = data_.n;
    log("device " + o_.device_id + " of fleet " + o_.fleet + ": " + std::to_string(data_.n) + " samples");
    link_.start([this](bool reconnect) { if (reconnect) { request_status(); reoffer(); } },
                [this](const std::string& t, const std::string& p, bool r) { on_message(t, p, r); });
    say_hello();
    request_status();
    running_ = true;
    server_ = std::thread([this] { serve_loop(); });
    timer_ = std::thread([this] { timer_loop(); });
    worker_ = std::thread([this] { work_loop(); });
  }

  void stop() {
    if (!running_.exchange(false)) return;
    stop_ = true;
    serve_.push(json());
    worker_.join();
    server_.join();
    timer_.join();
    link_.stop();
  }

  json status() const {
    std::lock_guard<std::mutex> lock(mu_);
    return {{"state", running_ ? "running" : (stop_ ? "stopped" : "created")}, {"connected", link_.connected()},
            {"server_online", server_online_.load()}, {"fleet", o_.fleet}, {"device_id", o_.device_id},
            {"num_samples", num_samples_.load()}, {"tasks_done", tasks_done_}, {"last_round", last_round_}};
  }

 private:
  void event(const json& e) {
    if (hooks_.on_event) hooks_.on_event(e);
  }

  void outcome(const json& task_id, const json& round, const std::string& what, const std::string& code = "",
               const json& metrics = json()) {
    json e = {{"event", "round"}, {"task_id", task_id}, {"round", round}, {"outcome", what}};
    if (!code.empty()) e["code"] = code;
    if (!metrics.is_null()) e["metrics"] = metrics;
    {
      std::lock_guard<std::mutex> lock(mu_);
      last_round_ = e;
      if (what != "sent") ++tasks_done_;
    }
    event(e);
  }

  void work_loop() {
    double last_beat = 0;
    while (!stop_) {
      json m;
      if (!work_.pop(&m, 0.5)) {
        if (mono_s() - last_beat >= o_.heartbeat_s) {
          heartbeat("idle", json(), 0.0);
          last_beat = mono_s();
        }
        continue;
      }
      const std::string type = m["type"];
      if (type == "task") {
        run_task(m);
        last_beat = mono_s();
      } else if ((type == "ack" || type == "error") && m.value("ref", json()).is_string()) {
        json round;
        {
          std::lock_guard<std::mutex> lock(mu_);
          if (m["ref"] != awaited_) continue;  // not the answer to our result
          log(type + " for task " + awaited_ + (type == "error" ? " (" + m["code"].get<std::string>() + ")" : ""));
          round = awaited_round_;  // the answer to our result: the task is over
          awaited_.clear();
          result_.clear();
          holder_.withdraw_all();
        }
        outcome(m["ref"], round, type == "ack" ? "accepted" : "rejected", type == "error" ? m["code"].get<std::string>() : "");
      }
    }
  }

  void send(const nlohmann::ordered_json& m, int qos = 1) { link_.publish(dev_ + "up", encode(m), qos); }

  void send_error(const std::string& code, const std::string& detail, const json& ref) {
    auto m = envelope("error");
    m["code"] = code;
    m["detail"] = detail.substr(0, 500);
    m["ref"] = ref.is_string() && ref.get<std::string>().empty() ? json() : ref;
    send(m);
  }

  void heartbeat(const std::string& state, const json& task_id, double progress) {
    if (!server_online_) return;  // none while the server is offline (§9.4)
    auto m = envelope("heartbeat");
    m["state"] = state;
    m["task_id"] = task_id;
    m["progress"] = progress;
    send(m, 0);
  }

  void say_hello() {
    auto m = envelope("hello");
    m["device_id"] = o_.device_id;
    m["runtimes"] = {"executorch"};
    m["num_samples"] = num_samples_.load();
    m["profile"] = {{"system", "Linux"}, {"client", "fedsdk-device-cpp"}, {"runtimes", {"executorch"}}};
    send(m);
  }

  // §3.2: ask the server's status and epoch after the start hello and every reconnect; the
  // timer loop asks again 10 s and 30 s later while no epoch of any kind has arrived.
  void request_status() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      status_attempts_ = 1;
      status_next_at_ = mono_s() + 10.0;
      epoch_since_request_ = false;
    }
    send(envelope("status_request"));
  }

  void reoffer() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!result_.empty()) link_.publish(dev_ + "up", result_);
  }

  void run_task(const json& task) {
    const std::string task_id = task["task_id"];
    log("task " + task_id + " round " + task["round"].dump());
    if (hooks_.load_data(&data_)) num_samples_ = data_.n;  // the provider's current samples
    double last = 0;
    try {
      auto result = runner_.run(task, [&](double f) {
        if (mono_s() - last >= o_.heartbeat_s || f >= 1.0) {
          heartbeat("training", task_id, f);
          last = mono_s();
        }
      });
      std::string payload = encode(result);
      {
        std::lock_guard<std::mutex> lock(mu_);
        awaited_ = task_id;
        awaited_round_ = task["round"];
        result_ = payload;
      }
      link_.publish(dev_ + "up", payload);
      log("result for task " + task_id + " sent");
      outcome(task_id, task["round"], "sent", "", json(result["metrics"]));
    } catch (const CodedError& e) {
      log("refusing task " + task_id + ": " + e.code + ": " + e.what());
      send_error(e.code, e.what(), task_id);
      outcome(task_id, task["round"], "refused", e.code);
    } catch (const std::exception& e) {
      send_error("device_failure", e.what(), task_id);
      outcome(task_id, task["round"], "refused", "device_failure");
    }
  }

  // Network thread: parse, answer invalid messages, route the rest.
  void on_message(const std::string& topic, const std::string& payload, bool retained) {
    if (topic == dev_ + "down/chunk") {
      Frame f;
      std::string why;
      if (decode_frame(payload, &f, &why)) puller_.on_frame(std::move(f));
      else log("dropping a malformed chunk frame: " + why);
    } else if (topic == dev_ + "down") {
      json m;
      try {
        m = decode(payload);
      } catch (const CodedError& e) {
        bool is_error = payload.find("\"error\"") != std::string::npos;  // never answer an error (§5.2)
        try {
          is_error = json::parse(payload).value("type", "") == "error";
        } catch (...) {
        }
        log("invalid control message (" + e.code + "): " + e.what());
        if (!is_error) send_error(e.code, e.what(), json());
        return;
      }
      const std::string type = m["type"];
      if (type == "blob_request") serve_.push(m);
      else if (type == "error" && m.value("ref", json()).is_string()) puller_.on_error(m["ref"], m["code"]), work_.push(m);
      else if (type == "task") {
        m["_arrived_mono"] = mono_s();  // the deadline counts from now (the clock rule, §9.6)
        work_.push(m);
      } else if (type == "ack" || type == "error") work_.push(m);
      else if (type == "server_status") {  // the answer to status_request: as a retained epoch and status (§3.2)
        server_online_ = true;
        on_epoch(m.dump(), true);
      }
    } else if (topic == root_ + "server/status") {
      on_status(payload, retained);
    } else if (topic == root_ + "broadcast/epoch") {
      on_epoch(payload, retained);
    }
  }

  void on_status(const std::string& payload, bool retained) {
    if (payload == "offline") {
      server_online_ = false;
    } else if (payload == "online") {
      server_online_ = true;
      if (retained) return;
      bool no_epoch;
      {
        std::lock_guard<std::mutex> lock(mu_);
        no_epoch = !seen_epoch_;
      }
      if (no_epoch) say_hello();  // a server without epochs (§3)
      reoffer();
    }
  }

  void on_epoch(const std::string& payload, bool retained) {
    json e;
    try {
      e = json::parse(payload);
    } catch (...) {
      return log("ignoring an epoch that is not JSON");
    }
    if (payload.size() > 1024 || !e.is_object() || !e.contains("epoch") || !e["epoch"].is_string() || !is_hex(e["epoch"], 1, 64) ||
        (e.contains("started_at") && !e["started_at"].is_number()) ||
        (e.contains("announce_window_s") && !e["announce_window_s"].is_number()))
      return log("ignoring an invalid epoch");
    const std::string epoch = e["epoch"];
    double window = o_.announce_window_s >= 0 ? o_.announce_window_s : e.value("announce_window_s", 30.0);
    window = std::min(300.0, std::max(0.0, window));
    std::lock_guard<std::mutex> lock(mu_);
    const bool first = !seen_epoch_;
    seen_epoch_ = true;
    epoch_since_request_ = true;
    if (first && retained) {
      announced_ = epoch;  // the start hello went to this server
      return;
    }
    if (epoch == announced_) return;
    static std::mt19937_64 rng{std::random_device{}()};
    hello_at_ = mono_s() + std::uniform_real_distribution<double>(0.0, window)(rng);
    hello_epoch_ = epoch;
  }

  void timer_loop() {
    while (!stop_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      std::string epoch;
      bool ask = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!epoch_since_request_ && status_attempts_ > 0 && status_attempts_ < 3 && mono_s() >= status_next_at_) {
          status_next_at_ = mono_s() + 30.0;
          ++status_attempts_;
          ask = true;
        }
      }
      if (ask) send(envelope("status_request"));
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (hello_epoch_.empty() || mono_s() < hello_at_) continue;
        epoch = hello_epoch_;
        hello_epoch_.clear();
        announced_ = epoch;
      }
      say_hello();
      reoffer();
    }
  }

  void serve_loop() {
    json m;
    while (!stop_) {
      if (!serve_.pop(&m, 0.5)) continue;
      if (m.is_null()) return;
      holder_.serve(m);
    }
  }

  ClientHooks hooks_;
  Dataset data_;  // refilled by hooks_.load_data on the worker thread only
  Options o_;
  std::string root_, dev_;
  MqttLink link_;
  Puller puller_;
  Holder holder_;
  TaskRunner runner_;
  Queue work_, serve_;
  mutable std::mutex mu_;
  std::string awaited_, result_;  // the result awaiting the server's answer (§9.5)
  json awaited_round_, last_round_;
  int64_t tasks_done_ = 0;
  std::atomic<int64_t> num_samples_{0};
  std::atomic<bool> server_online_{true}, stop_{false}, running_{false};
  std::thread server_, timer_, worker_;
  bool seen_epoch_ = false;
  bool epoch_since_request_ = false;  // an epoch arrived since the last status_request (§3.2)
  int status_attempts_ = 0;           // status_requests of this connection (at most 3)
  double status_next_at_ = 0;
  std::string announced_, hello_epoch_;
  double hello_at_ = 0;
};

Client::Client(const Options& o, ClientHooks hooks) {
  mkdir(o.work_dir.c_str(), 0700);
  agent_ = std::make_unique<Agent>(o, std::move(hooks));
}
Client::~Client() { stop(); }
void Client::start() { agent_->start(); }
void Client::stop() { agent_->stop(); }
nlohmann::json Client::status() const { return agent_->status(); }

}  // namespace fedsdk
