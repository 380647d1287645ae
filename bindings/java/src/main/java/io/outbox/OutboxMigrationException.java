package io.outbox;

/** A schema migration could not be applied. */
public class OutboxMigrationException extends OutboxException {
    private static final long serialVersionUID = 1L;

    /** The migration that failed. */
    private final int version;
    /** What the failed migration does. */
    private final String description;

    /** Called by the native library. */
    OutboxMigrationException(String message, int version, String description) {
        super(message);
        this.version = version;
        this.description = description;
    }

    /**
     * The migration that failed (0 when the migration lock could not be taken).
     *
     * @return the migration that failed (0 when the migration lock could not be taken)
     */
    public int version() {
        return version;
    }

    /**
     * The failed migration's description, such as {@code create t_event_record}.
     *
     * @return the failed migration's description
     */
    public String description() {
        return description;
    }
}
