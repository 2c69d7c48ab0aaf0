package org.fedsdk.device;

/** What the device reports, on its own threads: keep the methods short. */
public interface DeviceListener {
    /** A log line of the device. */
    default void onLog(String line) {}

    /**
     * A round outcome: {@code outcome} is "sent" (the update went out; {@code metricsJson} holds
     * its metrics), "accepted" or "rejected" (the server's answer; {@code code} says why) or
     * "refused" (this device declined the task with {@code code}).
     */
    default void onRound(String taskId, long round, String outcome, String code, String metricsJson) {}

    /** Pairing gave this device its account. */
    default void onPaired(String deviceId, String fleet) {}
}
