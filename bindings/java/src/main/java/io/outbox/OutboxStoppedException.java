package io.outbox;

/** The relay is closed: every call on a closed {@link Outbox} throws this. */
public class OutboxStoppedException extends OutboxException {
    private static final long serialVersionUID = 1L;

    /**
     * An exception with a message.
     *
     * @param message which call was refused
     */
    public OutboxStoppedException(String message) {
        super(message);
    }
}
