import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

import org.fedsdk.device.DataProvider;
import org.fedsdk.device.DeviceListener;
import org.fedsdk.device.FedsdkDevice;
import org.fedsdk.device.FedsdkException;

/**
 * The Java binding's integration test program (tests/integration/test_java_device.py). The
 * samples come from this program's DataProvider, read from a little-endian file: int64 N, C,
 * H, W, then N*C*H*W float32, then N int64 labels.
 *
 *   pair SERVER FINGERPRINT CODE SAMPLES WORK_DIR ROUNDS: pairs with the code, checks that a
 *       wrong pin is refused, and runs until ROUNDS updates are accepted (one line per event)
 *   run SERVER FLEET DEVICE_ID SAMPLES WORK_DIR: a registered device, until killed
 */
public final class DigitsDevice {
    static final class Samples implements DataProvider {
        final int n;
        final int c;
        final int h;
        final int w;
        final float[] x;
        final long[] y;

        Samples(Path file) throws IOException {
            ByteBuffer b = ByteBuffer.wrap(Files.readAllBytes(file)).order(ByteOrder.LITTLE_ENDIAN);
            n = (int) b.getLong();
            c = (int) b.getLong();
            h = (int) b.getLong();
            w = (int) b.getLong();
            x = new float[n * c * h * w];
            b.asFloatBuffer().get(x);
            b.position(b.position() + 4 * x.length);
            y = new long[n];
            b.asLongBuffer().get(y);
        }

        @Override
        public long count() {
            return n;
        }

        @Override
        public boolean batch(long start, int k, float[] xs, long[] ys) {
            int per = c * h * w;
            System.arraycopy(x, (int) start * per, xs, 0, k * per);
            System.arraycopy(y, (int) start, ys, 0, k);
            return true;
        }
    }

    static final class Printer implements DeviceListener {
        final AtomicInteger accepted = new AtomicInteger();
        final CountDownLatch done;

        Printer(int rounds) {
            done = new CountDownLatch(rounds);
        }

        @Override
        public void onRound(String taskId, long round, String outcome, String code, String metricsJson) {
            System.out.println("ROUND " + round + " " + outcome + " " + code + " " + metricsJson);
            if (outcome.equals("accepted")) {
                accepted.incrementAndGet();
                done.countDown();
            }
        }

        @Override
        public void onPaired(String deviceId, String fleet) {
            System.out.println("PAIRED " + deviceId + " " + fleet);
        }
    }

    public static void main(String[] args) throws Exception {
        Samples samples = new Samples(Path.of(args[4]));
        if (args[0].equals("pair")) {
            pairAndTrain(args, samples);
        } else {
            FedsdkDevice device = FedsdkDevice.builder().server(args[1]).credentials(args[2], args[3], null, null)
                .workDir(Path.of(args[5])).dataProvider(samples, samples.c, samples.h, samples.w)
                .heartbeatSeconds(1).listener(new Printer(0)).build();
            Runtime.getRuntime().addShutdownHook(new Thread(device::close));
            device.start();
            System.out.println("STARTED " + device.status());
            Thread.sleep(Long.MAX_VALUE);
        }
    }

    /** Pinning a CA other than the broker's: pairing stops after fetching the CA, nothing sent. */
    static void refuseForeignCa(String[] args, Samples samples) {
        String foreign = "sha256:" + "ab".repeat(32);
        try (FedsdkDevice wrong = FedsdkDevice.builder().server(args[1]).caFingerprint(foreign).pairCode(args[3], "java-phone")
                .workDir(Path.of(args[5] + "-foreign")).dataProvider(samples, samples.c, samples.h, samples.w).build()) {
            wrong.pair(120);
            System.out.println("FOREIGN CA ACCEPTED");
            System.exit(3);
        } catch (FedsdkException e) {
            System.out.println("FOREIGN CA REFUSED: " + e.getMessage());
        }
    }

    static void pairAndTrain(String[] args, Samples samples) throws Exception {
        int rounds = Integer.parseInt(args[6]);
        Printer printer = new Printer(rounds);
        try (FedsdkDevice device = FedsdkDevice.builder().server(args[1]).caFingerprint(args[2]).pairCode(args[3], "java-phone")
                .workDir(Path.of(args[5])).dataProvider(samples, samples.c, samples.h, samples.w)
                .heartbeatSeconds(1).listener(printer).build()) {
            device.pair(600); // the server exports the pte/1 program before it offers (minutes on a busy machine)
            refuseForeignCa(args, samples); // now the pairing service answers at once
            device.start();
            System.out.println("STARTED " + device.status());
            boolean all = printer.done.await(600, TimeUnit.SECONDS);
            System.out.println("STATUS " + device.status());
            device.stop();
            System.exit(all ? 0 : 4);
        }
    }
}
