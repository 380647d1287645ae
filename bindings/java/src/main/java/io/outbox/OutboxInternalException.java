package io.outbox;

/**
 * A bug: the native library panicked (the panic was caught at the JNI boundary, the JVM is
 * intact) or a JNI call failed. Please report it with the message.
 */
public class OutboxInternalException extends OutboxException {
    private static final long serialVersionUID = 1L;

    OutboxInternalException(String message) {
        super(message);
    }
}
