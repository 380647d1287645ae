package io.outbox;

/**
 * A failure that is not the message's fault, thrown by an {@link OutboxConsumer}'s handler: the
 * consumer rolls the transaction back and handles the message again after a backoff <b>without
 * using an attempt</b> (so it is never parked for it). For a dependency that is down for a while.
 * A handler that keeps throwing it keeps its queue waiting (the consumer warns every 10 s and
 * counts it in {@code db_errors}).
 *
 * <p>{@link java.sql.SQLTransientException}s and retriable {@link OutboxDatabaseException}s
 * (a lock wait timeout, a deadlock, a lost connection) are treated the same way, also as the
 * cause of another exception.
 */
public class OutboxTransientException extends OutboxException {
    private static final long serialVersionUID = 1L;

    /**
     * A transient failure with a message.
     *
     * @param message what is unavailable
     */
    public OutboxTransientException(String message) {
        super(message);
    }

    /**
     * A transient failure with a message and its cause.
     *
     * @param message what is unavailable
     * @param cause the underlying failure
     */
    public OutboxTransientException(String message, Throwable cause) {
        super(message, cause);
    }
}
