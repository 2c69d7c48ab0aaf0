/* fedsdk_device.h: the C ABI of libfedsdk_device, the fedsdk device client as a library
 * (docs/device_cpp.md "The C ABI"). An app links libfedsdk_device, creates a device from a
 * JSON config, hands it samples through a data provider, hears log lines and round outcomes
 * through an event callback, and starts / stops it. Plain C, no C++ types cross it.
 *
 * Versioning: FEDSDK_DEVICE_ABI_VERSION is the version this header describes; the library's
 * fedsdk_device_abi_version() is the one it implements. A caller MUST check that they are
 * equal before any other call. The number grows by one whenever a function, a type or the
 * meaning of a config key or event field changes or is removed; adding a config key or an
 * event field that old callers may ignore does not change it.
 *
 * Threads: every function may be called from any thread, except that fedsdk_device_free must
 * not race with another call on the same device. Callbacks run on the library's threads; they
 * must return quickly and must not call any fedsdk_device_* function (stop joins the threads
 * that run them: such a call could wait forever).
 * Strings returned by the library stay valid until the next call on the same device (or, for
 * fedsdk_device_last_error(NULL), on the same thread).
 */
#ifndef FEDSDK_DEVICE_H
#define FEDSDK_DEVICE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FEDSDK_DEVICE_ABI_VERSION 1

#if defined(__GNUC__)
#define FEDSDK_DEVICE_API __attribute__((visibility("default")))
#else
#define FEDSDK_DEVICE_API
#endif

/* Return codes of the int functions. */
#define FEDSDK_OK 0
#define FEDSDK_ERR_CONFIG 1  /* a bad config or argument: nothing was changed */
#define FEDSDK_ERR_STATE 2   /* e.g. start when running, pair when running */
#define FEDSDK_ERR_FAILED 3  /* the operation failed (no broker, pairing refused, ...) */

typedef struct fedsdk_device fedsdk_device;

/* The data provider: the device's local training samples, read again before every task.
 * count(user) returns N >= 0 (or -1 on error). batch(user, start, n, x, y) fills samples
 * [start, start + n): x with n * C * H * W float32 (C order, the model's input shape given as
 * "input_shape" [C, H, W] in the config, scaled as the server's evaluation data) and y with
 * n int64 labels; it returns the number filled (n) or -1 on error. */
typedef int64_t (*fedsdk_count_fn)(void* user);
typedef int64_t (*fedsdk_batch_fn)(void* user, int64_t start, int64_t n, float* x, int64_t* y);

/* Events, one JSON object per call (UTF-8, NUL-terminated):
 *   {"event": "log", "line": "..."}                                        a log line
 *   {"event": "round", "task_id": "...", "round": R, "outcome": "sent"|"accepted"|"rejected"|"refused",
 *    "code": "..." (rejected/refused), "metrics": {...} (sent)}            a round outcome
 *   {"event": "paired", "device_id": "...", "fleet": "..."}                pairing succeeded */
typedef void (*fedsdk_event_fn)(void* user, const char* event_json);

/* The ABI version this library implements (compare with FEDSDK_DEVICE_ABI_VERSION). */
FEDSDK_DEVICE_API int fedsdk_device_abi_version(void);

/* A device from a JSON config (keys in docs/device_cpp.md): "broker" and "work_dir" are
 * required; "fleet"/"device_id" (or a pairing stored in work_dir); "data_dir" (x.npy, y.npy)
 * or a data provider with "input_shape"; "ca_file", "ca_fingerprint", "heartbeat_s",
 * "announce_window_s", "name". Returns NULL on a bad config; fedsdk_device_last_error(NULL)
 * says why. Nothing connects before start or pair. */
FEDSDK_DEVICE_API fedsdk_device* fedsdk_device_create(const char* config_json);

/* Set before start; NULL callbacks remove them. */
FEDSDK_DEVICE_API int fedsdk_device_set_data_provider(fedsdk_device* d, fedsdk_count_fn count,
                                                      fedsdk_batch_fn batch, void* user);
FEDSDK_DEVICE_API int fedsdk_device_set_event_listener(fedsdk_device* d, fedsdk_event_fn on_event, void* user);

/* Pairs with a one-time code (docs/protocol.md §19) as `name`; blocks up to `timeout_s`.
 * On success the device's account is stored in work_dir/device.json (0600) and used by start.
 * Over mqtts:// the broker's CA must match config "ca_fingerprint" ("sha256:" + 64 hex). */
FEDSDK_DEVICE_API int fedsdk_device_pair(fedsdk_device* d, const char* code, const char* name, double timeout_s);

/* Connects (waits up to 15 s for the broker) and runs the device on its own threads. */
FEDSDK_DEVICE_API int fedsdk_device_start(fedsdk_device* d);

/* Stops the threads, publishes "offline" and disconnects; returns once stopped. Idempotent. */
FEDSDK_DEVICE_API int fedsdk_device_stop(fedsdk_device* d);

/* The device's status as a JSON object: {"state": "created"|"running"|"stopped", "connected",
 * "server_online", "fleet", "device_id", "num_samples", "tasks_done", "last_round"}. */
FEDSDK_DEVICE_API const char* fedsdk_device_status(fedsdk_device* d);

/* The last error on `d` (or of create on this thread when d is NULL), "" if none. */
FEDSDK_DEVICE_API const char* fedsdk_device_last_error(fedsdk_device* d);

/* Stops the device if running and frees it. */
FEDSDK_DEVICE_API void fedsdk_device_free(fedsdk_device* d);

#ifdef __cplusplus
}
#endif
#endif /* FEDSDK_DEVICE_H */
