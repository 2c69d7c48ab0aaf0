package org.fedsdk.sample;

import android.app.Application;
import java.io.DataInputStream;
import java.io.IOException;
import java.io.InputStream;
import org.fedsdk.android.FedsdkApp;
import org.fedsdk.device.DataProvider;

/** The app's part: its samples (assets/samples.bin, the format of tests/integration/java_device.py). */
public final class SampleApp extends Application implements FedsdkApp {
    private float[] x;
    private long[] y;
    private int per;

    @Override
    public DataProvider fedsdkData() {
        load();
        return new DataProvider() {
            @Override
            public long count() {
                return y.length;
            }

            @Override
            public boolean batch(long start, int n, float[] xs, long[] ys) {
                System.arraycopy(x, (int) start * per, xs, 0, n * per);
                System.arraycopy(y, (int) start, ys, 0, n);
                return true;
            }
        };
    }

    @Override
    public int[] fedsdkInputShape() {
        return new int[] {1, 8, 8};
    }

    @Override
    public String fedsdkServer() {
        return getSharedPreferences("fedsdk", MODE_PRIVATE).getString("server", "");
    }

    private synchronized void load() {
        if (x != null) {
            return;
        }
        try (InputStream in = getAssets().open("samples.bin"); DataInputStream data = new DataInputStream(in)) {
            java.nio.ByteBuffer b = java.nio.ByteBuffer.wrap(data.readAllBytes()).order(java.nio.ByteOrder.LITTLE_ENDIAN);
            int n = (int) b.getLong();
            per = (int) (b.getLong() * b.getLong() * b.getLong());
            x = new float[n * per];
            b.asFloatBuffer().get(x);
            b.position(b.position() + 4 * x.length);
            y = new long[n];
            b.asLongBuffer().get(y);
        } catch (IOException e) {
            throw new IllegalStateException("assets/samples.bin: " + e.getMessage());
        }
    }
}
