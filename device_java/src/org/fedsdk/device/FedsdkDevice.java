package org.fedsdk.device;

import java.nio.file.Path;

/**
 * A fedsdk device in this process: the Java face of libfedsdk_device's C ABI
 * (fedsdk_device.h, docs/device_cpp.md). Build one with {@link #builder()}, {@link #pair} it
 * once with a code (or give it credentials), {@link #start()} it; it trains the server's tasks
 * on the samples of its {@link DataProvider} until {@link #stop()}.
 *
 * <p>The native library is loaded from the system property {@code fedsdk.jni} (a path), else
 * {@code System.loadLibrary("fedsdk_device_jni")}.
 */
public final class FedsdkDevice implements AutoCloseable {
    /** The C ABI version this binding was written for (FEDSDK_DEVICE_ABI_VERSION). */
    public static final int ABI_VERSION = 1;

    static {
        String path = System.getProperty("fedsdk.jni");
        if (path != null) {
            System.load(path);
        } else {
            System.loadLibrary("fedsdk_device_jni");
        }
        int abi = nativeAbiVersion();
        if (abi != ABI_VERSION) {
            throw new UnsatisfiedLinkError("libfedsdk_device ABI " + abi + ", this binding needs " + ABI_VERSION);
        }
    }

    private long handle;
    private final String pairCode;
    private final String name;

    private FedsdkDevice(long handle, String pairCode, String name) {
        this.handle = handle;
        this.pairCode = pairCode;
        this.name = name;
    }

    public static Builder builder() {
        return new Builder();
    }

    /** Pairs with the builder's code (blocks up to {@code timeoutSeconds}); throws on a refusal. */
    public synchronized void pair(double timeoutSeconds) {
        if (pairCode == null) {
            throw new IllegalStateException("no pair code: use Builder.pairCode");
        }
        check(nativePair(live(), pairCode, name, timeoutSeconds));
    }

    /** Connects and runs the device on its own threads; throws if the broker does not answer. */
    public synchronized void start() {
        check(nativeStart(live()));
    }

    /** Stops training, says "offline" and disconnects. */
    public synchronized void stop() {
        if (handle != 0) {
            nativeStop(handle);
        }
    }

    /** The device's status as a JSON object (state, connected, fleet, device_id, tasks_done, last_round, ...). */
    public synchronized String status() {
        return nativeStatus(live());
    }

    @Override
    public synchronized void close() {
        if (handle != 0) {
            nativeFree(handle);
            handle = 0;
        }
    }

    private long live() {
        if (handle == 0) {
            throw new IllegalStateException("the device is closed");
        }
        return handle;
    }

    private void check(int code) {
        if (code != 0) {
            throw new FedsdkException(nativeLastError(handle));
        }
    }

    /** The device's configuration; {@link #build()} validates it. */
    public static final class Builder {
        private String server;
        private String caFingerprint;
        private String caFile;
        private String fleet;
        private String deviceId;
        private String username;
        private String password;
        private String pairCode;
        private boolean paired;
        private String name = "java-device";
        private Path workDir;
        private DataProvider data;
        private int[] inputShape;
        private DeviceListener listener;
        private double heartbeatSeconds = 10;
        private double announceWindowSeconds = -1;

        /** The broker: mqtt://host[:port] or mqtts://host[:port]. */
        public Builder server(String url) {
            this.server = url;
            return this;
        }

        /** The pinned CA for pairing over mqtts ("sha256:" + 64 hex, printed by fedsdk-server pair-code). */
        public Builder caFingerprint(String fingerprint) {
            this.caFingerprint = fingerprint;
            return this;
        }

        /** The CA file to trust over mqtts (with credentials; pairing stores its own). */
        public Builder caFile(Path file) {
            this.caFile = file.toString();
            return this;
        }

        /** A device registered by hand: its fleet and id, and its broker account (null: anonymous). */
        public Builder credentials(String fleet, String deviceId, String username, String password) {
            this.fleet = fleet;
            this.deviceId = deviceId;
            this.username = username;
            this.password = password;
            return this;
        }

        /** Pair with this one-time code (then call {@link FedsdkDevice#pair}) as {@code name}. */
        public Builder pairCode(String code, String name) {
            this.pairCode = code;
            this.name = name;
            return this;
        }

        /** Use the account an earlier {@link FedsdkDevice#pair} stored in the work directory. */
        public Builder paired() {
            this.paired = true;
            return this;
        }

        /** Where the device keeps its blobs and its pairing (device.json, 0600). */
        public Builder workDir(Path dir) {
            this.workDir = dir;
            return this;
        }

        /** The samples, of shape [channels, height, width] each. */
        public Builder dataProvider(DataProvider provider, int channels, int height, int width) {
            this.data = provider;
            this.inputShape = new int[] {channels, height, width};
            return this;
        }

        public Builder listener(DeviceListener listener) {
            this.listener = listener;
            return this;
        }

        /** Seconds between idle heartbeats (default 10). */
        public Builder heartbeatSeconds(double seconds) {
            this.heartbeatSeconds = seconds;
            return this;
        }

        /** The hello spread after a server restart (default: the server's). */
        public Builder announceWindowSeconds(double seconds) {
            this.announceWindowSeconds = seconds;
            return this;
        }

        public FedsdkDevice build() {
            if (server == null || workDir == null || data == null) {
                throw new IllegalArgumentException("server, workDir and dataProvider are required");
            }
            if (pairCode == null && fleet == null && !paired) {
                throw new IllegalArgumentException("credentials, pairCode or paired() is required");
            }
            StringBuilder json = new StringBuilder("{");
            field(json, "broker", withAccount(server));
            field(json, "work_dir", workDir.toString());
            field(json, "fleet", fleet);
            field(json, "device_id", deviceId);
            field(json, "ca_fingerprint", caFingerprint);
            field(json, "ca_file", caFile);
            json.append("\"heartbeat_s\":").append(heartbeatSeconds);
            if (announceWindowSeconds >= 0) {
                json.append(",\"announce_window_s\":").append(announceWindowSeconds);
            }
            json.append(",\"input_shape\":[").append(inputShape[0]).append(',').append(inputShape[1])
                .append(',').append(inputShape[2]).append("]}");
            long handle = nativeCreate(json.toString(), data, listener);
            if (handle == 0) {
                throw new FedsdkException(nativeLastError(0));
            }
            return new FedsdkDevice(handle, pairCode, name);
        }

        private String withAccount(String url) {
            if (username == null) {
                return url;
            }
            int at = url.indexOf("://") + 3;
            return url.substring(0, at) + encode(username) + ":" + encode(password) + "@" + url.substring(at);
        }

        private static String encode(String s) {
            return java.net.URLEncoder.encode(s, java.nio.charset.StandardCharsets.UTF_8).replace("+", "%20");
        }

        private static void field(StringBuilder json, String key, String value) {
            if (value == null) {
                return;
            }
            json.append('"').append(key).append("\":\"");
            for (char c : value.toCharArray()) {
                if (c == '"' || c == '\\') {
                    json.append('\\').append(c);
                } else if (c < 0x20) {
                    json.append(String.format("\\u%04x", (int) c));
                } else {
                    json.append(c);
                }
            }
            json.append("\",");
        }
    }

    private static native int nativeAbiVersion();

    private static native long nativeCreate(String configJson, DataProvider data, DeviceListener listener);

    private static native int nativePair(long handle, String code, String name, double timeoutSeconds);

    private static native int nativeStart(long handle);

    private static native int nativeStop(long handle);

    private static native String nativeStatus(long handle);

    private static native String nativeLastError(long handle);

    private static native void nativeFree(long handle);
}
