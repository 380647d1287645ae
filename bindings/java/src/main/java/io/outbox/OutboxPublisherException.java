package io.outbox;

/** The broker client could not be created or started. */
public class OutboxPublisherException extends OutboxException {
    private static final long serialVersionUID = 1L;

    OutboxPublisherException(String message) {
        super(message);
    }
}
