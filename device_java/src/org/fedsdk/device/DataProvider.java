package org.fedsdk.device;

/**
 * The app's local training samples. The device asks for them before every task, on one of
 * its own threads. Samples have the model's input shape [C, H, W] (given to the builder),
 * float32, scaled as the server's evaluation data (docs/protocol.md §13.3).
 */
public interface DataProvider {
    /** The number of samples now (>= 0); a negative number keeps the previous samples. */
    long count();

    /**
     * Fills samples [start, start + n): {@code x} with n * C * H * W floats (C order) and
     * {@code y} with n class labels. Return false on an error (the previous samples are kept).
     */
    boolean batch(long start, int n, float[] x, long[] y);
}
