#include "mqtt.h"

#include <chrono>
#include <regex>
#include <thread>

namespace fedsdk {

namespace {
std::string percent_decode(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size()) {
      out.push_back(static_cast<char>(std::stoi(s.substr(i + 1, 2), nullptr, 16)));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

struct LibInit {
  LibInit() { mosquitto_lib_init(); }
};
}  // namespace

BrokerUrl parse_broker_url(const std::string& url) {
  std::smatch m;
  if (!std::regex_match(url, m, std::regex(R"(^(mqtts?)://(?:([^:@/]*)(?::([^@/]*))?@)?([^:/@?]+)(?::(\d+))?/?(\?retain=[01])?$)")))
    throw std::runtime_error("broker URL must be mqtt[s]://[user:password@]host[:port], got " + url);
  BrokerUrl out;
  out.tls = m[1] == "mqtts";
  out.user = percent_decode(m[2]);
  out.password = percent_decode(m[3]);
  out.host = m[4];
  out.port = m[5].matched ? std::stoi(m[5]) : (out.tls ? 8883 : 1883);
  out.retain = m[6] != "?retain=0";
  return out;
}

MqttLink::MqttLink(const std::string& client_id, const BrokerUrl& url, const std::string& ca_file,
                   const std::string& status_topic, std::vector<std::string> subscriptions,
                   bool clean_session, bool verify_tls)
    : url_(url), status_topic_(status_topic), subscriptions_(std::move(subscriptions)) {
  static LibInit init;
  mosq_ = mosquitto_new(client_id.c_str(), clean_session, this);
  if (!mosq_) throw std::runtime_error("mosquitto_new failed");
  mosquitto_int_option(mosq_, MOSQ_OPT_PROTOCOL_VERSION, MQTT_PROTOCOL_V311);
  mosquitto_int_option(mosq_, MOSQ_OPT_TCP_NODELAY, 1);
  mosquitto_max_inflight_messages_set(mosq_, 16);
  mosquitto_reconnect_delay_set(mosq_, 1, 30, true);
  if (!status_topic_.empty()) mosquitto_will_set(mosq_, status_topic_.c_str(), 7, "offline", 1, url.retain);
  if (!url.user.empty()) mosquitto_username_pw_set(mosq_, url.user.c_str(), url.password.c_str());
  if (url.tls && !verify_tls) {
    if (mosquitto_tls_set(mosq_, nullptr, "/etc/ssl/certs", nullptr, nullptr, nullptr) != MOSQ_ERR_SUCCESS ||
        mosquitto_tls_opts_set(mosq_, 0 /* SSL_VERIFY_NONE */, nullptr, nullptr) != MOSQ_ERR_SUCCESS)
      throw std::runtime_error("TLS setup failed");
    mosquitto_tls_insecure_set(mosq_, true);
  } else if (url.tls) {
    // The pinned CA: only certificates it signed are accepted, and the host name is checked.
    if (mosquitto_tls_set(mosq_, ca_file.empty() ? nullptr : ca_file.c_str(), ca_file.empty() ? "/etc/ssl/certs" : nullptr,
                          nullptr, nullptr, nullptr) != MOSQ_ERR_SUCCESS)
      throw std::runtime_error("TLS setup failed (CA file " + ca_file + ")");
    mosquitto_tls_insecure_set(mosq_, false);
  }
  mosquitto_connect_callback_set(mosq_, on_connect_cb);
  mosquitto_disconnect_callback_set(mosq_, on_disconnect_cb);
  mosquitto_message_callback_set(mosq_, on_message_cb);
  mosquitto_publish_callback_set(mosq_, on_publish_cb);
}

MqttLink::~MqttLink() {
  if (mosq_) {
    mosquitto_loop_stop(mosq_, true);
    mosquitto_destroy(mosq_);
  }
}

void MqttLink::start(OnConnect on_connect, OnMessage on_message) {
  on_connect_ = std::move(on_connect);
  on_message_ = std::move(on_message);
  int rc = mosquitto_connect_async(mosq_, url_.host.c_str(), url_.port, 30);
  if (rc != MOSQ_ERR_SUCCESS && rc != MOSQ_ERR_ERRNO) throw std::runtime_error(std::string("connect: ") + mosquitto_strerror(rc));
  mosquitto_loop_start(mosq_);
  for (int i = 0; i < 150 && !connected_; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  if (!connected_) throw std::runtime_error("no CONNACK from " + url_.host + ":" + std::to_string(url_.port) + " within 15 s");
}

bool MqttLink::publish(const std::string& topic, const std::string& payload, int qos, bool retain) {
  if (payload.size() > 4198400) {
    log("not publishing " + std::to_string(payload.size()) + " bytes on " + topic + ": over the limit");
    return false;
  }
  if (qos == 0 && !connected_) return false;
  int rc = mosquitto_publish(mosq_, nullptr, topic.c_str(), static_cast<int>(payload.size()), payload.data(), qos,
                             retain && url_.retain);
  return rc == MOSQ_ERR_SUCCESS;
}

void MqttLink::stop() {
  if (connected_ && !status_topic_.empty()) {
    int mid = 0;
    offline_acked_ = false;
    mosquitto_publish(mosq_, &mid, status_topic_.c_str(), 7, "offline", 1, url_.retain);
    offline_mid_ = mid;
    for (int i = 0; i < 30 && !offline_acked_; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  mosquitto_disconnect(mosq_);
  mosquitto_loop_stop(mosq_, false);
}

void MqttLink::on_connect_cb(struct mosquitto* m, void* self_v, int rc) {
  auto* self = static_cast<MqttLink*>(self_v);
  if (rc != 0) {
    log(std::string("CONNACK refused: ") + mosquitto_connack_string(rc));
    return;
  }
  std::vector<char*> topics;
  for (auto& t : self->subscriptions_) topics.push_back(const_cast<char*>(t.c_str()));
  // One SUBSCRIBE (§3). No need to wait for the SUBACK before publishing: the broker handles
  // one connection's packets in order, so the subscription exists before anything we publish.
  mosquitto_subscribe_multiple(m, nullptr, static_cast<int>(topics.size()), topics.data(), 1, 0, nullptr);
  if (!self->status_topic_.empty())
    mosquitto_publish(m, nullptr, self->status_topic_.c_str(), 6, "online", 1, self->url_.retain);
  int n = ++self->connects_;
  self->connected_ = true;
  if (self->on_connect_) self->on_connect_(n > 1);
}

void MqttLink::on_disconnect_cb(struct mosquitto*, void* self_v, int rc) {
  static_cast<MqttLink*>(self_v)->connected_ = false;
  if (rc != 0) log("connection lost; reconnecting");
}

void MqttLink::on_message_cb(struct mosquitto*, void* self_v, const struct mosquitto_message* msg) {
  auto* self = static_cast<MqttLink*>(self_v);
  std::string payload(static_cast<const char*>(msg->payload), static_cast<size_t>(msg->payloadlen));
  if (self->on_message_) self->on_message_(msg->topic, payload, msg->retain);
}

void MqttLink::on_publish_cb(struct mosquitto*, void* self_v, int mid) {
  auto* self = static_cast<MqttLink*>(self_v);
  if (mid == self->offline_mid_) self->offline_acked_ = true;
}

}  // namespace fedsdk
