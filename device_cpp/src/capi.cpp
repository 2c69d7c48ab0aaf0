// The C ABI of libfedsdk_device (include/fedsdk_device.h) over Client and pair_device.
#include <mutex>
#include <set>

#include "client.h"
#include "fedsdk_device.h"
#include "pairing.h"

using json = nlohmann::json;

struct fedsdk_device {
  json config;
  fedsdk::Options options;
  std::string data_dir;
  std::vector<int64_t> input_shape;  // [C, H, W] of the data provider's samples
  fedsdk_count_fn count = nullptr;
  fedsdk_batch_fn batch = nullptr;
  void* data_user = nullptr;
  fedsdk_event_fn on_event = nullptr;
  void* event_user = nullptr;
  int log_sink = 0;
  std::mutex mu;  // guards client and the strings below
  std::unique_ptr<fedsdk::Client> client;
  bool stopped = false;
  std::string status, error;
};

namespace {

thread_local std::string g_create_error;

int fail(fedsdk_device* d, int code, const std::string& why) {
  d->error = why;
  return code;
}

void emit(fedsdk_device* d, const json& e) {
  if (d->on_event) d->on_event(d->event_user, e.dump().c_str());
}

// Reads the samples from the provider (or x.npy / y.npy once, from data_dir).
bool load_data(fedsdk_device* d, fedsdk::Dataset* out) {
  if (!d->count) {
    if (out->n > 0) return true;  // a directory is read once
    *out = fedsdk::load_dataset_dir(d->data_dir);
    return true;
  }
  const int64_t n = d->count(d->data_user);
  if (n < 0) {
    fedsdk::log("the data provider failed (count); keeping the previous samples");
    return false;
  }
  fedsdk::Dataset data;
  data.n = n, data.c = d->input_shape[0], data.h = d->input_shape[1], data.w = d->input_shape[2];
  const int64_t per = data.c * data.h * data.w;
  data.x.resize(n * per);
  data.y.resize(n);
  for (int64_t start = 0; start < n; start += 256) {
    const int64_t k = std::min<int64_t>(256, n - start);
    if (d->batch(d->data_user, start, k, data.x.data() + start * per, data.y.data() + start) != k) {
      fedsdk::log("the data provider failed (batch at " + std::to_string(start) + "); keeping the previous samples");
      return false;
    }
  }
  *out = std::move(data);
  return true;
}

std::string str(const json& c, const char* key) { return c.contains(key) ? c[key].get<std::string>() : ""; }

const std::set<std::string> kKeys = {"broker", "fleet", "device_id", "work_dir", "data_dir", "input_shape", "ca_file",
                                     "ca_fingerprint", "heartbeat_s", "announce_window_s", "name"};

void parse_config(fedsdk_device* d, const char* text) {
  if (!text) throw std::runtime_error("config is NULL");
  json c = json::parse(text);
  if (!c.is_object()) throw std::runtime_error("config must be a JSON object");
  for (auto& [key, v] : c.items()) {
    if (!kKeys.count(key)) throw std::runtime_error("config: unknown key " + key);
    const bool number = key == "heartbeat_s" || key == "announce_window_s";
    if (key == "input_shape") {
      if (!v.is_array() || v.size() != 3) throw std::runtime_error("config.input_shape must be [C, H, W]");
      for (auto& e : v)
        if (!e.is_number_integer() || e.get<int64_t>() < 1) throw std::runtime_error("config.input_shape must be [C, H, W]");
    } else if (number ? !v.is_number() : !v.is_string()) {
      throw std::runtime_error("config." + key + (number ? " must be a number" : " must be a string"));
    }
  }
  if (str(c, "broker").empty() || str(c, "work_dir").empty()) throw std::runtime_error("config: broker and work_dir are required");
  fedsdk::parse_broker_url(str(c, "broker"));  // a clear error now rather than at start
  d->config = c;
  d->options.broker = str(c, "broker");
  d->options.fleet = str(c, "fleet");
  d->options.device_id = str(c, "device_id");
  d->options.work_dir = str(c, "work_dir");
  d->options.ca_file = str(c, "ca_file");
  d->options.heartbeat_s = c.value("heartbeat_s", 10.0);
  d->options.announce_window_s = c.value("announce_window_s", -1.0);
  d->data_dir = str(c, "data_dir");
  if (c.contains("input_shape")) d->input_shape = c["input_shape"].get<std::vector<int64_t>>();
}

// The broker account: the config's, or the pairing stored in work_dir.
void apply_pairing(fedsdk_device* d) {
  if (!d->options.fleet.empty() && !d->options.device_id.empty()) return;
  json p = fedsdk::load_pairing(d->options.work_dir);
  if (p.is_null()) throw std::runtime_error("config: fleet and device_id are required (or pair first)");
  fedsdk::BrokerUrl url = fedsdk::parse_broker_url(d->options.broker);
  d->options.broker = (url.tls ? "mqtts://" : "mqtt://") + p["username"].get<std::string>() + ":" +
                      p["password"].get<std::string>() + "@" + url.host + ":" + std::to_string(url.port) +
                      (url.retain ? "" : "?retain=0");
  d->options.fleet = p["fleet"];
  d->options.device_id = p["device_id"];
  if (d->options.ca_file.empty()) d->options.ca_file = p["ca_file"];
}

}  // namespace

extern "C" {

int fedsdk_device_abi_version(void) { return FEDSDK_DEVICE_ABI_VERSION; }

fedsdk_device* fedsdk_device_create(const char* config_json) {
  auto d = std::make_unique<fedsdk_device>();
  try {
    parse_config(d.get(), config_json);
  } catch (const std::exception& e) {
    g_create_error = e.what();
    return nullptr;
  }
  g_create_error.clear();
  return d.release();
}

int fedsdk_device_set_data_provider(fedsdk_device* d, fedsdk_count_fn count, fedsdk_batch_fn batch, void* user) {
  std::lock_guard<std::mutex> lock(d->mu);
  if (d->client) return fail(d, FEDSDK_ERR_STATE, "set the data provider before start");
  if ((count == nullptr) != (batch == nullptr)) return fail(d, FEDSDK_ERR_CONFIG, "count and batch go together");
  if (count && d->input_shape.empty()) return fail(d, FEDSDK_ERR_CONFIG, "a data provider needs config.input_shape [C, H, W]");
  d->count = count, d->batch = batch, d->data_user = user;
  return FEDSDK_OK;
}

int fedsdk_device_set_event_listener(fedsdk_device* d, fedsdk_event_fn on_event, void* user) {
  std::lock_guard<std::mutex> lock(d->mu);
  if (d->client) return fail(d, FEDSDK_ERR_STATE, "set the event listener before start");
  d->on_event = on_event, d->event_user = user;
  return FEDSDK_OK;
}

int fedsdk_device_pair(fedsdk_device* d, const char* code, const char* name, double timeout_s) {
  std::lock_guard<std::mutex> lock(d->mu);
  if (d->client) return fail(d, FEDSDK_ERR_STATE, "pair before start");
  if (!code || !*code || !name || !*name) return fail(d, FEDSDK_ERR_CONFIG, "pairing needs a code and a name");
  fedsdk::PairInput in{d->options.broker, str(d->config, "ca_fingerprint"), code, name, d->options.work_dir, -1,
                       timeout_s > 0 ? timeout_s : 60};
  if (d->count) in.num_samples = d->count(d->data_user);
  try {
    json p = fedsdk::pair_device(in);
    emit(d, {{"event", "paired"}, {"device_id", p["device_id"]}, {"fleet", p["fleet"]}});
  } catch (const std::exception& e) {
    return fail(d, FEDSDK_ERR_FAILED, e.what());
  }
  return FEDSDK_OK;
}

int fedsdk_device_start(fedsdk_device* d) {
  std::lock_guard<std::mutex> lock(d->mu);
  if (d->client || d->stopped) return fail(d, FEDSDK_ERR_STATE, "a device starts once");
  if (d->data_dir.empty() && !d->count) return fail(d, FEDSDK_ERR_CONFIG, "no data: config.data_dir or a data provider");
  try {
    apply_pairing(d);
  } catch (const std::exception& e) {
    return fail(d, FEDSDK_ERR_CONFIG, e.what());
  }
  if (d->on_event) d->log_sink = fedsdk::add_log_sink([d](const std::string& line) { emit(d, {{"event", "log"}, {"line", line}}); });
  fedsdk::ClientHooks hooks{[d](fedsdk::Dataset* out) { return load_data(d, out); }, [d](const json& e) { emit(d, e); }};
  try {
    auto client = std::make_unique<fedsdk::Client>(d->options, hooks);
    client->start();
    d->client = std::move(client);
  } catch (const std::exception& e) {
    if (d->log_sink) fedsdk::remove_log_sink(d->log_sink), d->log_sink = 0;
    d->stopped = true;
    return fail(d, FEDSDK_ERR_FAILED, e.what());
  }
  return FEDSDK_OK;
}

int fedsdk_device_stop(fedsdk_device* d) {
  std::lock_guard<std::mutex> lock(d->mu);
  if (d->client) d->client->stop();
  if (d->log_sink) fedsdk::remove_log_sink(d->log_sink), d->log_sink = 0;
  d->stopped = true;
  return FEDSDK_OK;
}

const char* fedsdk_device_status(fedsdk_device* d) {
  std::lock_guard<std::mutex> lock(d->mu);
  json s = d->client ? d->client->status()
                     : json{{"state", d->stopped ? "stopped" : "created"}, {"connected", false}, {"server_online", false},
                            {"fleet", d->options.fleet}, {"device_id", d->options.device_id}, {"num_samples", 0},
                            {"tasks_done", 0}, {"last_round", nullptr}};
  d->status = s.dump();
  return d->status.c_str();
}

const char* fedsdk_device_last_error(fedsdk_device* d) { return d ? d->error.c_str() : g_create_error.c_str(); }

void fedsdk_device_free(fedsdk_device* d) {
  if (!d) return;
  fedsdk_device_stop(d);
  d->client.reset();
  delete d;
}

}  // extern "C"
