package org.fedsdk.android;

import android.content.Context;
import androidx.annotation.NonNull;
import androidx.work.Constraints;
import androidx.work.ExistingPeriodicWorkPolicy;
import androidx.work.NetworkType;
import androidx.work.PeriodicWorkRequest;
import androidx.work.WorkManager;
import androidx.work.Worker;
import androidx.work.WorkerParameters;
import java.io.File;
import java.util.concurrent.TimeUnit;
import org.fedsdk.device.DeviceListener;
import org.fedsdk.device.FedsdkDevice;

/**
 * Runs the paired device for a while when the phone is charging, idle and on an unmetered
 * network (WorkManager's constraints), then stops it: the persistent MQTT session hands it the
 * tasks queued while it was away. {@link #schedule} enqueues it (every 60 min by default).
 */
public final class FedsdkWorker extends Worker {
    static final String WORK = "fedsdk-device";
    /** How long one run stays connected (WorkManager stops a worker after 10 minutes). */
    static final long RUN_MS = 8 * 60 * 1000;

    public FedsdkWorker(@NonNull Context context, @NonNull WorkerParameters params) {
        super(context, params);
    }

    /** Enqueue the periodic work with the charging / idle / unmetered constraints. */
    public static void schedule(Context context, long everyMinutes) {
        Constraints constraints = new Constraints.Builder()
            .setRequiresCharging(true)
            .setRequiresDeviceIdle(true)
            .setRequiredNetworkType(NetworkType.UNMETERED)
            .setRequiresBatteryNotLow(true)
            .build();
        PeriodicWorkRequest request = new PeriodicWorkRequest.Builder(FedsdkWorker.class, everyMinutes, TimeUnit.MINUTES)
            .setConstraints(constraints)
            .build();
        WorkManager.getInstance(context).enqueueUniquePeriodicWork(WORK, ExistingPeriodicWorkPolicy.KEEP, request);
    }

    /** The device's state directory (its pairing, device.json 0600, lives there). */
    public static File workDir(Context context) {
        return new File(context.getFilesDir(), "fedsdk");
    }

    @NonNull
    @Override
    public Result doWork() {
        FedsdkApp app = (FedsdkApp) getApplicationContext();
        int[] shape = app.fedsdkInputShape();
        if (!new File(workDir(getApplicationContext()), "device.json").exists()) {
            return Result.failure(); // not paired yet: the app pairs first (FedsdkDevice.pair)
        }
        try (FedsdkDevice device = FedsdkDevice.builder()
                .server(app.fedsdkServer())
                .paired()
                .workDir(workDir(getApplicationContext()).toPath())
                .dataProvider(app.fedsdkData(), shape[0], shape[1], shape[2])
                .heartbeatSeconds(60)
                .listener(new DeviceListener() {})
                .build()) {
            device.start();
            long end = System.currentTimeMillis() + RUN_MS;
            while (!isStopped() && System.currentTimeMillis() < end) {
                Thread.sleep(1000);
            }
            device.stop(); // publishes "offline": the server stops waiting for this device
            return Result.success();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            return Result.retry();
        } catch (RuntimeException e) {
            return Result.retry();
        }
    }
}
