// The MQTT connection (docs/protocol.md §4) on libmosquitto: 3.1.1, persistent session, will,
// keepalive 30 s, TCP_NODELAY, reconnect 1-30 s, TLS verified against a pinned CA file.
#pragma once
#include <mosquitto.h>

#include <atomic>
#include <functional>
#include <mutex>

#include "util.h"

namespace fedsdk {

struct BrokerUrl {
  bool tls = false;
  std::string host, user, password;
  int port = 1883;
  bool retain = true;  // false: "?retain=0", a broker without retained messages (§4)
};
// mqtt://[user:password@]host[:port][?retain=0|1] or mqtts://...; throws std::runtime_error otherwise.
BrokerUrl parse_broker_url(const std::string& url);

class MqttLink {
 public:
  using OnMessage = std::function<void(const std::string& topic, const std::string& payload, bool retained)>;
  using OnConnect = std::function<void(bool reconnect)>;  // runs on the network thread after CONNACK

  // An empty `status_topic`: no will and no status (the pairing client, §19.1). `verify_tls`
  // false: TLS without certificate checks (only to fetch the CA a pin is checked against, §19.3).
  MqttLink(const std::string& client_id, const BrokerUrl& url, const std::string& ca_file,
           const std::string& status_topic, std::vector<std::string> subscriptions,
           bool clean_session = false, bool verify_tls = true);
  ~MqttLink();
  // Connects; throws if no CONNACK arrives within 15 s. Then subscribes and publishes "online"
  // (retained) after every CONNACK, before on_connect.
  void start(OnConnect on_connect, OnMessage on_message);
  // QoS 0 publishes are dropped while disconnected (heartbeats are never queued).
  bool publish(const std::string& topic, const std::string& payload, int qos = 1, bool retain = false);
  bool connected() const { return connected_; }
  // Publishes "offline" (retained, waits up to 3 s), then DISCONNECT (no will).
  void stop();

 private:
  static void on_connect_cb(struct mosquitto*, void* self, int rc);
  static void on_disconnect_cb(struct mosquitto*, void* self, int rc);
  static void on_message_cb(struct mosquitto*, void* self, const struct mosquitto_message* m);
  static void on_publish_cb(struct mosquitto*, void* self, int mid);

  struct mosquitto* mosq_ = nullptr;
  BrokerUrl url_;
  std::string status_topic_;
  std::vector<std::string> subscriptions_;
  OnConnect on_connect_;
  OnMessage on_message_;
  std::atomic<bool> connected_{false};
  std::atomic<int> connects_{0};
  std::atomic<int> offline_mid_{-1};
  std::atomic<bool> offline_acked_{false};
};

}  // namespace fedsdk
