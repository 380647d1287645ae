package io.outbox;

import java.sql.SQLException;

/**
 * The database refused or failed a statement: one the library ran on its own connection, or,
 * in {@link OutboxEvents}, the host's JDBC driver (then {@link #getCause()} is its
 * {@link SQLException}).
 */
public class OutboxDatabaseException extends OutboxException {
    private static final long serialVersionUID = 1L;

    /** The server's error number. */
    private final int errorCode;
    /** The SQLSTATE. */
    private final String sqlState;
    /** Whether the same call may succeed later. */
    private final boolean retriable;

    /** Called by the native library. */
    OutboxDatabaseException(String message, int errorCode, String sqlState, boolean retriable) {
        super(message);
        this.errorCode = errorCode;
        this.sqlState = sqlState;
        this.retriable = retriable;
    }

    OutboxDatabaseException(String message, SQLException cause) {
        super(message + ": " + cause.getMessage(), cause);
        this.errorCode = cause.getErrorCode();
        this.sqlState = cause.getSQLState();
        // Connection problems (class 08) and deadlocks/lock waits (40001, 1213, 1205) may pass.
        String s = sqlState == null ? "" : sqlState;
        this.retriable = s.startsWith("08") || s.equals("40001") || errorCode == 1213 || errorCode == 1205;
    }

    /**
     * The server's error number (1062 duplicate key, 1146 no such table, ...); 0 when not from the server.
     *
     * @return the server's error number (1062 duplicate key, 1146 no such table, ...); 0 when not from the server
     */
    public int errorCode() {
        return errorCode;
    }

    /**
     * The SQLSTATE, or {@code null}.
     *
     * @return the SQLSTATE, or {@code null}
     */
    public String sqlState() {
        return sqlState;
    }

    /**
     * Whether the same call may succeed later (a connection or lock problem, not a mistake in the call).
     *
     * @return whether the same call may succeed later (a connection or lock problem, not a mistake in the call)
     */
    public boolean isRetriable() {
        return retriable;
    }
}
