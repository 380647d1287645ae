package io.outbox;

/**
 * Base of every exception thrown by the outbox binding. Unchecked, so that it rolls back a
 * Spring {@code @Transactional} method by default and passes through lambdas.
 */
public class OutboxException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    public OutboxException(String message) {
        super(message);
    }

    public OutboxException(String message, Throwable cause) {
        super(message, cause);
    }
}
