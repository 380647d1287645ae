package io.outbox;

/**
 * Base of every exception thrown by the outbox binding. Unchecked, so that it rolls back a
 * Spring {@code @Transactional} method by default and passes through lambdas.
 */
public class OutboxException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    /**
     * An exception with a message.
     *
     * @param message what went wrong
     */
    public OutboxException(String message) {
        super(message);
    }

    /**
     * An exception with a message and its cause.
     *
     * @param message what went wrong
     * @param cause the underlying failure
     */
    public OutboxException(String message, Throwable cause) {
        super(message, cause);
    }
}
