package org.fedsdk.device;

/** A device call failed; the message is the library's one-line reason. */
public final class FedsdkException extends RuntimeException {
    public FedsdkException(String message) {
        super(message);
    }
}
