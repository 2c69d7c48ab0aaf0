// JNI glue of org.fedsdk.device.FedsdkDevice over the C ABI of libfedsdk_device
// (fedsdk_device.h). The library calls back on its own threads: each attaches to the JVM once
// (as a daemon) and detaches when it ends.
#include <jni.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fedsdk_device.h"

namespace {

JavaVM* g_vm = nullptr;

// The JNIEnv of this thread, attaching it on first use; detached when the thread exits.
JNIEnv* env() {
  struct Attached {
    JNIEnv* env = nullptr;
    bool attached = false;
    ~Attached() {
      if (attached) g_vm->DetachCurrentThread();
    }
  };
  thread_local Attached t;
  if (!t.env) {
    if (g_vm->GetEnv(reinterpret_cast<void**>(&t.env), JNI_VERSION_1_8) == JNI_EDETACHED) {
      g_vm->AttachCurrentThreadAsDaemon(reinterpret_cast<void**>(&t.env), nullptr);
      t.attached = true;
    }
  }
  return t.env;
}

// The Java objects a device calls (global references), owned with the device.
struct Binding {
  fedsdk_device* device = nullptr;
  jobject data = nullptr, listener = nullptr;
  jmethodID count = nullptr, batch = nullptr, on_log = nullptr, on_round = nullptr, on_paired = nullptr;
  int64_t per_sample = 0;
};

bool failed(JNIEnv* e) {
  if (!e->ExceptionCheck()) return false;
  e->ExceptionDescribe();  // a listener or provider threw: report it, keep the device alive
  e->ExceptionClear();
  return true;
}

int64_t count_cb(void* user) {
  auto* b = static_cast<Binding*>(user);
  JNIEnv* e = env();
  jlong n = e->CallLongMethod(b->data, b->count);
  return failed(e) ? -1 : n;
}

int64_t batch_cb(void* user, int64_t start, int64_t n, float* x, int64_t* y) {
  auto* b = static_cast<Binding*>(user);
  JNIEnv* e = env();
  jfloatArray jx = e->NewFloatArray(static_cast<jsize>(n * b->per_sample));
  jlongArray jy = e->NewLongArray(static_cast<jsize>(n));
  if (!jx || !jy) return -1;
  jboolean ok = e->CallBooleanMethod(b->data, b->batch, static_cast<jlong>(start), static_cast<jint>(n), jx, jy);
  int64_t out = -1;
  if (!failed(e) && ok) {
    e->GetFloatArrayRegion(jx, 0, static_cast<jsize>(n * b->per_sample), x);
    std::vector<jlong> tmp(n);
    e->GetLongArrayRegion(jy, 0, static_cast<jsize>(n), tmp.data());
    for (int64_t i = 0; i < n; ++i) y[i] = tmp[i];
    out = n;
  }
  e->DeleteLocalRef(jx);
  e->DeleteLocalRef(jy);
  return out;
}

jstring jstr(JNIEnv* e, const std::string& s) { return e->NewStringUTF(s.c_str()); }

void event_cb(void* user, const char* event_json) {
  auto* b = static_cast<Binding*>(user);
  JNIEnv* e = env();
  nlohmann::json ev = nlohmann::json::parse(event_json);
  const std::string kind = ev.value("event", "");
  e->PushLocalFrame(8);
  if (kind == "log") {
    e->CallVoidMethod(b->listener, b->on_log, jstr(e, ev.value("line", "")));
  } else if (kind == "round") {
    const jlong round = ev["round"].is_number_integer() ? ev["round"].get<jlong>() : -1;
    const std::string task = ev["task_id"].is_string() ? ev["task_id"].get<std::string>() : "";
    const std::string metrics = ev.contains("metrics") ? ev["metrics"].dump() : "";
    e->CallVoidMethod(b->listener, b->on_round, jstr(e, task), round, jstr(e, ev.value("outcome", "")),
                      jstr(e, ev.value("code", "")), jstr(e, metrics));
  } else if (kind == "paired") {
    e->CallVoidMethod(b->listener, b->on_paired, jstr(e, ev.value("device_id", "")), jstr(e, ev.value("fleet", "")));
  }
  failed(e);
  e->PopLocalFrame(nullptr);
}

Binding* binding(jlong handle) { return reinterpret_cast<Binding*>(handle); }

}  // namespace

extern "C" {

JNIEXPORT jint JNI_OnLoad(JavaVM* vm, void*) {
  g_vm = vm;
  return JNI_VERSION_1_8;
}

JNIEXPORT jint JNICALL Java_org_fedsdk_device_FedsdkDevice_nativeAbiVersion(JNIEnv*, jclass) {
  return fedsdk_device_abi_version();
}

JNIEXPORT jlong JNICALL Java_org_fedsdk_device_FedsdkDevice_nativeCreate(JNIEnv* e, jclass, jstring config, jobject data,
                                                                         jobject listener) {
  const char* text = e->GetStringUTFChars(config, nullptr);
  fedsdk_device* device = fedsdk_device_create(text);
  const nlohmann::json c = device ? nlohmann::json::parse(text) : nlohmann::json();
  e->ReleaseStringUTFChars(config, text);
  if (!device) return 0;
  auto* b = new Binding;
  b->device = device;
  b->per_sample = 1;
  for (auto& d : c["input_shape"]) b->per_sample *= d.get<int64_t>();
  b->data = e->NewGlobalRef(data);
  jclass dc = e->GetObjectClass(data);
  b->count = e->GetMethodID(dc, "count", "()J");
  b->batch = e->GetMethodID(dc, "batch", "(JI[F[J)Z");
  fedsdk_device_set_data_provider(device, count_cb, batch_cb, b);
  if (listener) {
    b->listener = e->NewGlobalRef(listener);
    jclass lc = e->GetObjectClass(listener);
    b->on_log = e->GetMethodID(lc, "onLog", "(Ljava/lang/String;)V");
    b->on_round = e->GetMethodID(lc, "onRound", "(Ljava/lang/String;JLjava/lang/String;Ljava/lang/String;Ljava/lang/String;)V");
    b->on_paired = e->GetMethodID(lc, "onPaired", "(Ljava/lang/String;Ljava/lang/String;)V");
    fedsdk_device_set_event_listener(device, event_cb, b);
  }
  return reinterpret_cast<jlong>(b);
}

JNIEXPORT jint JNICALL Java_org_fedsdk_device_FedsdkDevice_nativePair(JNIEnv* e, jclass, jlong h, jstring code, jstring name,
                                                                      jdouble timeout_s) {
  const char* c = e->GetStringUTFChars(code, nullptr);
  const char* n = e->GetStringUTFChars(name, nullptr);
  int rc = fedsdk_device_pair(binding(h)->device, c, n, timeout_s);
  e->ReleaseStringUTFChars(code, c);
  e->ReleaseStringUTFChars(name, n);
  return rc;
}

JNIEXPORT jint JNICALL Java_org_fedsdk_device_FedsdkDevice_nativeStart(JNIEnv*, jclass, jlong h) {
  return fedsdk_device_start(binding(h)->device);
}

JNIEXPORT jint JNICALL Java_org_fedsdk_device_FedsdkDevice_nativeStop(JNIEnv*, jclass, jlong h) {
  return fedsdk_device_stop(binding(h)->device);
}

JNIEXPORT jstring JNICALL Java_org_fedsdk_device_FedsdkDevice_nativeStatus(JNIEnv* e, jclass, jlong h) {
  return e->NewStringUTF(fedsdk_device_status(binding(h)->device));
}

JNIEXPORT jstring JNICALL Java_org_fedsdk_device_FedsdkDevice_nativeLastError(JNIEnv* e, jclass, jlong h) {
  return e->NewStringUTF(fedsdk_device_last_error(h ? binding(h)->device : nullptr));
}

JNIEXPORT void JNICALL Java_org_fedsdk_device_FedsdkDevice_nativeFree(JNIEnv* e, jclass, jlong h) {
  Binding* b = binding(h);
  fedsdk_device_free(b->device);  // joins the device's threads: no callback runs after this
  e->DeleteGlobalRef(b->data);
  if (b->listener) e->DeleteGlobalRef(b->listener);
  delete b;
}

}  // extern "C"
