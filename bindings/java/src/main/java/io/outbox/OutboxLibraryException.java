package io.outbox;

/** The native library could not be found or loaded, or does not match this jar. The message says where it looked. */
public class OutboxLibraryException extends OutboxException {
    private static final long serialVersionUID = 1L;

    OutboxLibraryException(String message, Throwable cause) {
        super(message, cause);
    }
}
