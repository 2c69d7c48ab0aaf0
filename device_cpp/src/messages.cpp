#include "messages.h"

#include <cmath>

namespace fedsdk {

nlohmann::ordered_json envelope(const std::string& type) {
  nlohmann::ordered_json m;
  m["schema"] = 2;
  m["type"] = type;
  m["msg_id"] = random_hex(32);
  m["sent_at"] = now_s();
  return m;
}

std::string encode(const nlohmann::ordered_json& message) {
  std::string out = message.dump(-1, ' ', true);
  if (out.size() > kMaxControlBytes) throw CodedError("too_large", "control message of " + std::to_string(out.size()) + " bytes");
  return out;
}

namespace {

[[noreturn]] void invalid(const std::string& what) { throw CodedError("invalid_field", what); }

bool finite_everywhere(const json& j) {
  if (j.is_number_float()) return std::isfinite(j.get<double>());
  if (j.is_structured())
    for (auto& v : j) if (!finite_everywhere(v)) return false;
  return true;
}

bool is_int(const json& j) { return j.is_number_integer(); }          // never true for booleans
bool is_num(const json& j) { return j.is_number(); }

void check_string(const json& j, const std::string& where) {
  if (!j.is_string()) invalid(where + ": expected a string");
  if (j.get_ref<const std::string&>().size() > 4096) invalid(where + ": longer than 4096 characters");
}

void check_blob_ref(const json& j, const std::string& where) {
  if (!j.is_object()) invalid(where + ": a BlobRef must be an object");
  for (const char* key : {"id", "size", "kind", "format"})
    if (!j.contains(key)) invalid(where + ": BlobRef lacks " + key);
  check_string(j["id"], where + ".id");
  if (!is_hex(j["id"], 64, 64)) invalid(where + ".id: not 64 lowercase hex digits");
  if (!is_int(j["size"]) || j["size"].get<int64_t>() < 0) invalid(where + ".size: not an integer >= 0");
  check_string(j["kind"], where + ".kind");
  check_string(j["format"], where + ".format");
}

void check_record_object(const json& j, const std::string& where) {
  if (!j.is_object()) invalid(where + ": not an object");
  if (j.size() > 16) invalid(where + ": more than 16 records");
  for (auto& [key, _] : j.items())
    if (key.empty() || key.size() > 64) invalid(where + ": a record key must have 1-64 characters");
}

// One field: kind is s(tring), S(tring or null), i(nteger), n(umber), N(umber or null), o(bject),
// a(rray of strings),
// I (array of integers), R (record of BlobRef lists), B (record of BlobRefs).
void check_field(const json& msg, const std::string& type, const std::string& name, char kind, bool required) {
  const std::string where = type + "." + name;
  if (!msg.contains(name)) {
    if (required) invalid(where + ": missing field");
    return;
  }
  const json& v = msg[name];
  switch (kind) {
    case 's': check_string(v, where); break;
    case 'S': if (!v.is_null()) check_string(v, where); break;
    case 'i': if (!is_int(v)) invalid(where + ": expected an integer"); break;
    case 'n': if (!is_num(v)) invalid(where + ": expected a number"); break;
    case 'N': if (!v.is_null() && !is_num(v)) invalid(where + ": expected a number or null"); break;
    case 'o': if (!v.is_object()) invalid(where + ": expected an object"); break;
    case 'a':
      if (!v.is_array()) invalid(where + ": expected an array");
      for (auto& e : v) check_string(e, where + "[]");
      break;
    case 'I':
      if (!v.is_array()) invalid(where + ": expected an array");
      for (auto& e : v) if (!is_int(e)) invalid(where + ": expected integers");
      break;
    case 'R':
      check_record_object(v, where);
      for (auto& [key, list] : v.items()) {
        if (!list.is_array()) invalid(where + "." + key + ": expected a list of BlobRefs");
        for (auto& ref : list) check_blob_ref(ref, where + "." + key);
      }
      break;
    case 'B':
      check_record_object(v, where);
      for (auto& [key, ref] : v.items()) check_blob_ref(ref, where + "." + key);
      break;
  }
}

struct Field { const char* name; char kind; bool required; };
const std::map<std::string, std::vector<Field>>& catalogue() {
  static const std::map<std::string, std::vector<Field>> fields = {
      {"hello", {{"device_id", 's', true}, {"runtimes", 'a', true}, {"num_samples", 'i', true}, {"profile", 'o', true}}},
      {"task", {{"task_id", 's', true}, {"round", 'i', true}, {"programs", 'R', true}, {"arrays", 'B', true},
                {"config", 'o', true}, {"deadline", 'n', true}, {"server_time", 'N', false}}},
      {"blob_request", {{"blob", 's', true}, {"indices", 'I', true}, {"chunk_bytes", 'i', true}}},
      {"heartbeat", {{"state", 's', true}, {"task_id", 'S', false}, {"progress", 'n', false}}},
      {"result", {{"task_id", 's', true}, {"round", 'i', true}, {"arrays", 'B', true}, {"metrics", 'o', true}}},
      {"ack", {{"ref", 's', true}, {"detail", 's', false}}},
      {"error", {{"code", 's', true}, {"detail", 's', true}, {"ref", 'S', false}}},
      {"status_request", {}},  // §3.2
      {"server_status", {{"epoch", 's', true}, {"started_at", 'n', false}, {"announce_window_s", 'n', false}}},
      // Pairing (§19.2): known types; this client never receives them on its own topics.
      {"pair_ca_request", {}}, {"pair_ca", {}}, {"pair_request", {}}, {"pair_offer", {}},
      {"pair_confirm", {}}, {"pair_accept", {}}, {"unpair_request", {}},
  };
  return fields;
}

}  // namespace

json decode(const std::string& payload) {
  if (payload.size() > kMaxControlBytes) throw CodedError("too_large", "control message of " + std::to_string(payload.size()) + " bytes");
  if (payload.size() >= 3 && payload.compare(0, 3, "\xEF\xBB\xBF") == 0) throw CodedError("malformed", "byte-order mark");
  json msg;
  try {
    msg = json::parse(payload);
  } catch (const std::exception& e) {
    throw CodedError("malformed", std::string("not JSON: ") + e.what());
  }
  if (!msg.is_object()) throw CodedError("malformed", "a control message must be a JSON object");
  if (!finite_everywhere(msg)) throw CodedError("malformed", "a number is not finite");
  if (!msg.contains("schema") || !is_int(msg["schema"]) || msg["schema"].get<int64_t>() != 2)
    throw CodedError("unsupported_schema", "schema " + (msg.contains("schema") ? msg["schema"].dump() : std::string("missing")) +
                                               " is not supported (this side speaks 2)");
  if (!msg.contains("type") || !msg["type"].is_string() || !catalogue().count(msg["type"].get<std::string>()))
    throw CodedError("unknown_type", "unknown message type " + (msg.contains("type") ? msg["type"].dump() : std::string("(none)")));
  const std::string type = msg["type"];
  check_field(msg, type, "msg_id", 's', false);  // §5.2: envelope fields are checked like any other
  check_field(msg, type, "sent_at", 'n', false);
  for (const Field& f : catalogue().at(type)) check_field(msg, type, f.name, f.kind, f.required);
  if (type == "task") {
    const json& programs = msg["programs"];
    const json& arrays = msg["arrays"];
    if (programs.empty()) invalid("task: no models");
    if (programs.size() != arrays.size()) invalid("task: programs and arrays name different models");
    for (auto& [name, list] : programs.items()) {
      if (!arrays.contains(name)) invalid("task: programs and arrays name different models");
      if (list.empty()) invalid("task.programs." + name + ": no program");
    }
  }
  if (type == "server_status" && !is_hex(msg["epoch"], 1, 64)) invalid("server_status.epoch: 1 to 64 lowercase hex digits");
  if (type == "blob_request" && (msg["indices"].empty() || msg["indices"].size() > 64))
    invalid("blob_request.indices: 1 to 64 entries");
  return msg;
}

BlobRef blob_ref(const json& j) {
  return BlobRef{j["id"].get<std::string>(), j["kind"].get<std::string>(), j["format"].get<std::string>(),
                 j["size"].get<int64_t>()};
}

nlohmann::ordered_json to_json(const BlobRef& ref) {
  nlohmann::ordered_json j;
  j["id"] = ref.id;
  j["size"] = ref.size;
  j["kind"] = ref.kind;
  j["format"] = ref.format;
  return j;
}

}  // namespace fedsdk
