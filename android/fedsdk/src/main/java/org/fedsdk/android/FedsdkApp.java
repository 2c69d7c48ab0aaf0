package org.fedsdk.android;

import org.fedsdk.device.DataProvider;

/**
 * Implemented by the app's {@code Application}: where {@link FedsdkWorker} gets the samples
 * and the device's configuration. The app writes no federated-learning code beyond this.
 */
public interface FedsdkApp {
    /** The local samples (read again before every task). */
    DataProvider fedsdkData();

    /** The model's input shape [C, H, W]. */
    int[] fedsdkInputShape();

    /** The broker URL, e.g. "mqtts://fl.example.org:8883". */
    String fedsdkServer();
}
