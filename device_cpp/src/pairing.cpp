#include "pairing.h"

#include <openssl/pem.h>
#include <openssl/x509.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <thread>

#include "messages.h"

namespace fedsdk {

namespace {

// One pairing connection: the fedsdk-pair account, clean session, no will (§19.1).
class PairLink {
 public:
  PairLink(const BrokerUrl& url, const std::string& ca_file, bool verify)
      : cid_("pair-" + random_hex(32)),
        root_("fedsdk/v1/pair/" + cid_ + "/"),
        link_(cid_, url, ca_file, "", {root_ + "resp", root_ + "resp/chunk"}, true, verify) {
    link_.start([](bool) {}, [this](const std::string& t, const std::string& p, bool) {
      if (t != root_ + "resp") return;
      std::lock_guard<std::mutex> lock(mu_);
      inbox_.push_back(p);
      cv_.notify_one();
    });
  }
  ~PairLink() { link_.stop(); }

  // Sends `m` and returns the answer of type `want` (an `error` whose ref is `m` throws).
  json ask(nlohmann::ordered_json m, const std::string& want, double timeout_s) {
    const std::string msg_id = m["msg_id"];
    link_.publish(root_ + "req", encode(m));
    const double end = mono_s() + timeout_s;
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      if (!cv_.wait_for(lock, std::chrono::duration<double>(std::max(0.0, end - mono_s())), [&] { return !inbox_.empty(); }))
        throw std::runtime_error("pairing: no " + want + " from the server within " + std::to_string(int(timeout_s)) + " s");
      std::string payload = std::move(inbox_.front());
      inbox_.pop_front();
      json a;
      try {
        a = decode(payload);
      } catch (const CodedError& e) {
        log("pairing: ignoring an invalid answer (" + e.code + ")");
        continue;
      }
      if (a["type"] == "error" && (a["ref"] == msg_id || a["ref"].is_null()))
        throw std::runtime_error("pairing refused: " + a.value("code", "") + ": " + a.value("detail", ""));
      if (a["type"] == want) return a;
    }
  }

 private:
  std::string cid_, root_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> inbox_;
  MqttLink link_;
};

json profile(const PairInput& in) {
  struct utsname u {};
  uname(&u);
  const double page_mb = sysconf(_SC_PAGESIZE) / 1048576.0;
  return {{"arch", u.machine},
          {"system", u.sysname},
          {"release", u.release},
          {"client", "fedsdk-device-cpp"},
          {"cpu_count", std::thread::hardware_concurrency()},
          {"memory_mb", static_cast<int64_t>(sysconf(_SC_PHYS_PAGES) * page_mb)},
          {"memory_available_mb", static_cast<int64_t>(sysconf(_SC_AVPHYS_PAGES) * page_mb)},
          {"runtimes", {"executorch"}},
          {"num_samples", in.num_samples >= 0 ? json(in.num_samples) : json()}};
}

const std::string& need_string(const json& m, const std::string& key) {
  if (!m.contains(key) || !m[key].is_string()) throw std::runtime_error("pairing: the server's " + m.value("type", "") + " lacks " + key);
  return m[key].get_ref<const std::string&>();
}

}  // namespace

std::string ca_fingerprint(const std::string& pem) {
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  if (!cert) throw std::runtime_error("pairing: the server's CA is not a PEM certificate");
  unsigned char* der = nullptr;
  int n = i2d_X509(cert, &der);
  X509_free(cert);
  if (n <= 0) throw std::runtime_error("pairing: cannot encode the CA");
  std::string out = "sha256:" + sha256_hex(der, static_cast<size_t>(n));
  OPENSSL_free(der);
  return out;
}

json load_pairing(const std::string& work_dir) {
  struct stat st {};
  if (stat((work_dir + "/device.json").c_str(), &st) != 0) return json();
  return json::parse(read_file(work_dir + "/device.json"));
}

json pair_device(const PairInput& in) {
  BrokerUrl url = parse_broker_url(in.broker);
  url.user = url.password = "fedsdk-pair";
  mkdir(in.work_dir.c_str(), 0700);
  std::string ca_file;
  if (url.tls) {
    if (in.ca_fingerprint.size() != 71 || in.ca_fingerprint.rfind("sha256:", 0) != 0 || !is_hex(in.ca_fingerprint.substr(7), 64, 64))
      throw std::runtime_error("pairing over mqtts:// needs ca_fingerprint sha256:<64 hex digits>");
    std::string pem;
    {
      PairLink fetch(url, "", false);  // unverified: only the CA, checked against the pin (§19.3)
      pem = need_string(fetch.ask(envelope("pair_ca_request"), "pair_ca", in.timeout_s), "ca_pem");
    }
    const std::string got = ca_fingerprint(pem);
    if (got != in.ca_fingerprint)
      throw std::runtime_error("pairing: the broker's CA is " + got + ", not the pinned " + in.ca_fingerprint + "; nothing sent");
    ca_file = in.work_dir + "/ca.pem";
    write_file(ca_file, pem);
  }
  PairLink link(url, ca_file, true);
  auto request = envelope("pair_request");
  request["code"] = in.code;
  request["name"] = in.name;
  request["profile"] = profile(in);
  json offer = link.ask(request, "pair_offer", in.timeout_s);
  json tiers = json::object();
  if (offer.contains("models") && offer["models"].is_object())
    for (auto& [tier, _] : offer["models"].items())
      tiers[tier] = {{"runtimes", {{{"runtime", "executorch"}, {"format", "pte/1"}, {"ms_per_step", nullptr},
                                     {"error", "not timed by this client"}}}}};
  auto confirm = envelope("pair_confirm");
  confirm["session"] = need_string(offer, "session");
  confirm["name"] = in.name;
  json full = profile(in);
  full["bench"] = {{"tiers", tiers}, {"steps", 0}, {"measured_at", now_s()}};
  confirm["profile"] = full;
  json accept = link.ask(confirm, "pair_accept", in.timeout_s);
  json stored = {{"device_id", need_string(accept, "device_id")}, {"fleet", need_string(accept, "fleet")},
                 {"username", need_string(accept, "username")}, {"password", need_string(accept, "password")},
                 {"broker", in.broker}, {"ca_file", ca_file}, {"tier", accept.value("tier", json())}};
  const std::string path = in.work_dir + "/device.json";
  const std::string text = stored.dump(2);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);  // a password: never readable by others
  if (fd < 0 || fchmod(fd, 0600) != 0 || ::write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    if (fd >= 0) ::close(fd);
    throw std::runtime_error("pairing: cannot write " + path);
  }
  ::close(fd);
  log("paired as " + stored["device_id"].get<std::string>() + " in fleet " + stored["fleet"].get<std::string>());
  return stored;
}

}  // namespace fedsdk
