package io.outbox;

import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.SQLIntegrityConstraintViolationException;
import java.sql.Types;
import java.util.Map;
import java.util.Objects;
import java.util.TreeSet;

/**
 * The consumer inbox on the service's own JDBC connection: effectively-once processing of the
 * events the relay delivers at least once. In the caller's transaction, the inbox marks
 * {@code (consumer group, event key)} as processed and runs the handler only for a key the group
 * has not processed, so the handler's writes and the mark commit together, or neither does
 * (docs/inbox.md; the table is {@code outbox_inbox}, created by {@link Outbox#migrate}).
 *
 * <pre>{@code
 * conn.setAutoCommit(false);
 * InboxResult<Void> r = OutboxInbox.DEFAULT.process(conn, "points-service", OutboxInbox.eventKey(msg.getProperties()),
 *         InboxMessage.of(msg.getTopic(), msg.getQueueId(), msg.getQueueOffset(), msg.getMsgId()),
 *         c -> { credit(c, order); return null; });
 * conn.commit();      // mark and credit commit together
 * // processed or r.isDuplicate(): either way, acknowledge the message now
 * }</pre>
 *
 * <p><b>Claim first.</b> The mark is inserted before the handler runs. A second copy of the event
 * handled at the same time on another connection waits on the mark's row lock until the first
 * transaction ends: if it commits, the second copy is a duplicate; if it rolls back, the second
 * copy marks the key and runs its handler. A duplicate-key error rolls back only the INSERT, so
 * the caller's transaction stays usable.
 *
 * <p>Every value is bound as a statement parameter; the table name is validated. Immutable and
 * thread-safe; each call uses only the connection it is given.
 */
public final class OutboxInbox {
    /** The inbox table's default name (the one migration V8 creates). */
    public static final String DEFAULT_TABLE = "outbox_inbox";

    /** The inbox on {@link #DEFAULT_TABLE}. */
    public static final OutboxInbox DEFAULT = new OutboxInbox(DEFAULT_TABLE);

    /** The message property the relay carries the event's key in: unique across outbox tables and databases. */
    public static final String EVENT_KEY_PROPERTY = "eventKey";

    /** The longest consumer group name, in characters (RocketMQ's limit; the column is {@code VARCHAR(255)}). */
    public static final int MAX_GROUP_CHARS = 255;

    /** The longest event key, in UTF-8 bytes (the column is {@code VARBINARY(255)}). */
    public static final int MAX_KEY_BYTES = 255;

    /** The longest topic stored with a mark, in characters. */
    public static final int MAX_TOPIC_CHARS = 127;

    /** The longest broker message id stored with a mark, in characters. */
    public static final int MAX_MSG_ID_CHARS = 128;

    /** MySQL/MariaDB "duplicate entry for key": only the failing statement is rolled back. */
    private static final int ER_DUP_ENTRY = 1062;

    /** How much of a refused value an error message shows. */
    private static final int SHOWN_CHARS = 40;

    private final String table;
    private final String markSql;
    private final String processedSql;

    private OutboxInbox(String table) {
        this.table = table;
        this.markSql = "INSERT INTO " + table
                + " (consumer_group, event_key, topic, queue_id, queue_offset, msg_id, processed_at) VALUES (?, ?, ?, ?, ?, ?, NOW(3))";
        this.processedSql = "SELECT 1 FROM " + table + " WHERE consumer_group = ? AND event_key = ?";
    }

    /**
     * The inbox on {@code table}, validated like the outbox table's name (1 to 64 letters, digits
     * or underscores, not starting with a digit); an {@link OutboxConfigException} names
     * {@code inbox.table} and the value otherwise. Nothing is read from the database: the table
     * must exist (migration V8 creates {@code outbox_inbox}; for another name, the same DDL, e.g.
     * {@code CREATE TABLE points_inbox LIKE outbox_inbox}).
     *
     * @param table the inbox table's name
     * @return the inbox
     */
    public static OutboxInbox of(String table) {
        Objects.requireNonNull(table, "table");
        boolean ok = !table.isEmpty() && table.length() <= 64 && !isAsciiDigit(table.charAt(0));
        for (int i = 0; ok && i < table.length(); i++) {
            char c = table.charAt(i);
            ok = isAsciiLetterOrDigit(c) || c == '_';
        }
        if (!ok) {
            String reason = "must be 1 to 64 letters, digits or underscores, not starting with a digit";
            throw new OutboxConfigException("INVALID_VALUE", new String[] {"inbox.table"}, table, reason,
                    "invalid value " + quote(table) + " for inbox.table: " + reason);
        }
        return DEFAULT_TABLE.equals(table) ? DEFAULT : new OutboxInbox(table);
    }

    /**
     * The table name.
     *
     * @return the table name
     */
    public String table() {
        return table;
    }

    /**
     * Runs {@code handler} on {@code conn} once per {@code (group, eventKey)}: marks the key first
     * (see {@link #mark}), then runs the handler only if the key was new. Commit {@code conn}
     * afterwards: the mark and the handler's writes commit together.
     *
     * <p>If the handler throws, its exception propagates unchanged and the mark stays in the
     * transaction: <b>roll the transaction back</b>, so that a later copy of the event runs the
     * handler again. Committing after a handler failure would keep the mark and lose the event's
     * effect. (Spring's {@code @Transactional} rolls back for unchecked exceptions only; for a
     * checked one, declare {@code rollbackFor = Exception.class}.)
     *
     * @param <T> what the handler returns
     * @param <E> what the handler may throw
     * @param conn a connection in a transaction ({@code setAutoCommit(false)}); one in autocommit
     *     mode is refused with {@link IllegalStateException}, before anything is written
     * @param group the consumer group: 1 to 255 characters of {@code [A-Za-z0-9_%|-]}
     * @param eventKey the event's key ({@link #eventKey(Map)}): 1 to 255 bytes of UTF-8, compared exactly
     * @param message where the message came from, stored with the mark; {@code null} for none
     * @param handler the event's effect, run on {@code conn} if the key is new
     * @return {@link InboxResult#isDuplicate()} if the group had already processed the key (the
     *     handler did not run), else the handler's value
     * @throws OutboxInvalidEventException a bad group, key or message field (named), before anything is sent
     * @throws OutboxDatabaseException the INSERT failed otherwise; a retriable one (a deadlock
     *     1213, which has rolled the whole transaction back, or a lock wait timeout 1205) means:
     *     roll back and handle the message again
     * @throws E what the handler threw
     */
    public <T, E extends Exception> InboxResult<T> process(Connection conn, String group, String eventKey, InboxMessage message,
            InboxHandler<T, E> handler) throws E {
        Objects.requireNonNull(handler, "handler");
        if (!mark("process", conn, group, eventKey, message)) {
            return InboxResult.duplicate();
        }
        return InboxResult.processed(handler.handle(conn));
    }

    /**
     * {@link #process(Connection, String, String, InboxMessage, InboxHandler)} without a message trace.
     *
     * @param <T> what the handler returns
     * @param <E> what the handler may throw
     * @param conn a connection in a transaction
     * @param group the consumer group
     * @param eventKey the event's key
     * @param handler the event's effect
     * @return as for the other {@code process}
     * @throws E what the handler threw
     */
    public <T, E extends Exception> InboxResult<T> process(Connection conn, String group, String eventKey, InboxHandler<T, E> handler)
            throws E {
        return process(conn, group, eventKey, null, handler);
    }

    /**
     * Marks {@code eventKey} as processed by {@code group} in {@code conn}'s transaction (claim
     * first), without running anything: for callers that run their handler themselves.
     * {@code true}: the key is new and now marked (the mark commits or rolls back with the
     * transaction); {@code false}: a committed mark exists, the key is a duplicate, and the
     * transaction stays usable.
     *
     * <p>If another transaction holds an uncommitted mark of the same key, this waits for it to end
     * (up to {@code innodb_lock_wait_timeout}, then a retriable {@link OutboxDatabaseException}
     * 1205): a commit makes this a duplicate, a rollback lets this mark the key.
     *
     * @param conn a connection in a transaction ({@code setAutoCommit(false)})
     * @param group the consumer group, as for {@link #process}
     * @param eventKey the event's key, as for {@link #process}
     * @param message where the message came from, stored with the mark; {@code null} for none
     * @return {@code true} if the key was new and is now marked, {@code false} for a duplicate
     * @throws IllegalStateException {@code conn} is in autocommit mode (the mark would commit
     *     alone); nothing is written
     * @throws OutboxInvalidEventException a bad group, key or message field (named), before anything is sent
     * @throws OutboxDatabaseException the INSERT failed with anything but a duplicate key
     */
    public boolean mark(Connection conn, String group, String eventKey, InboxMessage message) {
        return mark("mark", conn, group, eventKey, message);
    }

    /**
     * {@link #mark(Connection, String, String, InboxMessage)} without a message trace.
     *
     * @param conn a connection in a transaction
     * @param group the consumer group
     * @param eventKey the event's key
     * @return {@code true} if the key was new and is now marked, {@code false} for a duplicate
     */
    public boolean mark(Connection conn, String group, String eventKey) {
        return mark("mark", conn, group, eventKey, null);
    }

    /**
     * Whether {@code group} has a mark of {@code eventKey} visible to {@code conn} (its own
     * uncommitted mark, or a committed one). A pre-check only: two copies can both see
     * {@code false}; {@link #process} is what decides. Works in autocommit mode too.
     *
     * @param conn a connection
     * @param group the consumer group
     * @param eventKey the event's key
     * @return whether a mark is visible
     */
    public boolean isProcessed(Connection conn, String group, String eventKey) {
        Objects.requireNonNull(conn, "conn");
        checkGroup(group);
        byte[] key = checkKey(eventKey);
        try (PreparedStatement ps = conn.prepareStatement(processedSql)) {
            ps.setString(1, group);
            ps.setBytes(2, key);
            try (ResultSet rs = ps.executeQuery()) {
                return rs.next();
            }
        } catch (SQLException e) {
            throw new OutboxDatabaseException("inbox look-up in " + table + " failed", e);
        }
    }

    /**
     * The inbox key of a consumed message: its {@code eventKey} property, which the relay sets to
     * a key unique across outbox tables and databases. A message without it (or with it empty) is
     * refused with an {@link OutboxInvalidEventException} naming {@code event_key}; there is no
     * fallback: {@code eventId} is the row id, unique only within one outbox table, and the
     * broker's message id changes when the relay sends an event again.
     *
     * @param properties the message's user properties
     * @return the key
     */
    public static String eventKey(Map<String, String> properties) {
        Objects.requireNonNull(properties, "properties");
        String key = properties.get(EVENT_KEY_PROPERTY);
        if (key == null || key.isEmpty()) {
            String reason = (key == null ? "missing: the message has no " + EVENT_KEY_PROPERTY + " property"
                    : "missing: the message's " + EVENT_KEY_PROPERTY + " property is empty")
                    + " (the event's key, unique across outbox tables and databases, set by the relay); eventId is unique"
                    + " only within one outbox table and is not used in its place; properties present: "
                    + new TreeSet<>(properties.keySet());
            throw new OutboxInvalidEventException("event_key", reason, "invalid event: event_key " + reason);
        }
        return key;
    }

    private boolean mark(String call, Connection conn, String group, String eventKey, InboxMessage message) {
        Objects.requireNonNull(conn, "conn");
        InboxMessage m = message == null ? InboxMessage.NONE : message;
        checkGroup(group);
        byte[] key = checkKey(eventKey);
        checkMessage(m);
        try {
            if (conn.getAutoCommit()) {
                // The mark would commit alone at once: a handler that fails afterwards would leave
                // the event marked as processed without its effect.
                throw new IllegalStateException(call + " needs a connection in a transaction, but this one is in "
                        + "autocommit mode, so the inbox mark would commit alone: call conn.setAutoCommit(false) first "
                        + "(Spring: run it inside a @Transactional method); nothing was inserted"
                        + (call.equals("process") ? " and the handler did not run" : ""));
            }
        } catch (SQLException e) {
            throw new OutboxDatabaseException("could not read the connection's autocommit mode", e);
        }
        try (PreparedStatement ps = conn.prepareStatement(markSql)) {
            ps.setString(1, group);
            ps.setBytes(2, key);
            setNullable(ps, 3, m.topic());
            if (m.queueId() == null) {
                ps.setNull(4, Types.INTEGER);
            } else {
                ps.setInt(4, m.queueId());
            }
            if (m.queueOffset() == null) {
                ps.setNull(5, Types.BIGINT);
            } else {
                ps.setLong(5, m.queueOffset());
            }
            setNullable(ps, 6, m.msgId());
            ps.executeUpdate();
            return true;
        } catch (SQLException e) {
            if (isDuplicateKey(e)) {
                return false;
            }
            throw new OutboxDatabaseException("inbox mark in " + table + " failed", e);
        }
    }

    /**
     * Whether the INSERT failed on the primary key: error 1062 (on the exception or one it chains),
     * or an integrity violation from a driver that does not pass the server's error number (the
     * only constraint the mark can break is its key: every NOT NULL value is checked first).
     */
    static boolean isDuplicateKey(SQLException e) {
        Throwable t = e;
        for (int depth = 0; t != null && depth < 16; depth++, t = t.getCause()) {
            if (t instanceof SQLException && isDuplicateKeyError((SQLException) t)) {
                return true;
            }
        }
        SQLException n = e.getNextException();
        for (int depth = 0; n != null && depth < 16; depth++, n = n.getNextException()) {
            if (isDuplicateKeyError(n)) {
                return true;
            }
        }
        return false;
    }

    private static boolean isDuplicateKeyError(SQLException s) {
        return s.getErrorCode() == ER_DUP_ENTRY || (s.getErrorCode() == 0 && s instanceof SQLIntegrityConstraintViolationException);
    }

    private static void setNullable(PreparedStatement ps, int n, String v) throws SQLException {
        if (v == null) {
            ps.setNull(n, Types.VARCHAR);
        } else {
            ps.setString(n, v);
        }
    }

    private static void checkGroup(String group) {
        if (group == null) {
            throw invalid("consumer_group", "must not be null");
        }
        if (group.isEmpty()) {
            throw invalid("consumer_group", "must not be empty");
        }
        boolean ok = group.length() <= MAX_GROUP_CHARS;
        for (int i = 0; ok && i < group.length(); i++) {
            char c = group.charAt(i);
            ok = isAsciiLetterOrDigit(c) || c == '_' || c == '-' || c == '%' || c == '|';
        }
        if (!ok) {
            throw invalid("consumer_group", quote(shorten(group)) + " must be 1 to " + MAX_GROUP_CHARS
                    + " characters of [A-Za-z0-9_%|-] (a RocketMQ consumer group)");
        }
    }

    /** The key's UTF-8 bytes, once it is known to be storable as they are. */
    private static byte[] checkKey(String key) {
        if (key == null) {
            throw invalid("event_key", "must not be null");
        }
        if (key.isEmpty()) {
            throw invalid("event_key", "must not be empty");
        }
        // An unpaired surrogate would be encoded as '?', merging distinct keys.
        Event.checkString("event_key", key);
        byte[] bytes = key.getBytes(StandardCharsets.UTF_8);
        if (bytes.length > MAX_KEY_BYTES) {
            throw invalid("event_key", quote(shorten(key)) + " is " + bytes.length + " bytes, longer than the "
                    + MAX_KEY_BYTES + " the inbox holds");
        }
        return bytes;
    }

    private static void checkMessage(InboxMessage m) {
        String topic = m.topic();
        if (topic != null) {
            Event.checkString("topic", topic);
            int n = topic.codePointCount(0, topic.length());
            if (n > MAX_TOPIC_CHARS) {
                throw invalid("topic", quote(shorten(topic)) + " is " + n + " characters, longer than the "
                        + MAX_TOPIC_CHARS + " a topic can be");
            }
        }
        String id = m.msgId();
        if (id != null) {
            Event.checkString("msg_id", id);
            int n = id.codePointCount(0, id.length());
            if (n > MAX_MSG_ID_CHARS) {
                throw invalid("msg_id", quote(shorten(id)) + " is " + n + " characters, longer than the "
                        + MAX_MSG_ID_CHARS + " the inbox keeps");
            }
        }
        if (m.queueId() != null && m.queueId() < 0) {
            throw invalid("queue_id", m.queueId() + " is negative (a queue id is 0 or more)");
        }
        if (m.queueOffset() != null && m.queueOffset() < 0) {
            throw invalid("queue_offset", m.queueOffset() + " is negative (a queue offset is 0 or more)");
        }
    }

    private static OutboxInvalidEventException invalid(String field, String reason) {
        return new OutboxInvalidEventException(field, reason, "invalid event: " + field + " " + reason);
    }

    private static boolean isAsciiDigit(char c) {
        return c >= '0' && c <= '9';
    }

    private static boolean isAsciiLetterOrDigit(char c) {
        return isAsciiDigit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    }

    /** A value cut to a readable length for an error message. */
    private static String shorten(String s) {
        if (s.codePointCount(0, s.length()) <= SHOWN_CHARS) {
            return s;
        }
        return s.substring(0, s.offsetByCodePoints(0, SHOWN_CHARS)) + "\u2026";
    }

    /** {@code s} in double quotes, with quotes, backslashes and control characters escaped. */
    private static String quote(String s) {
        StringBuilder b = new StringBuilder(s.length() + 2).append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"':
                    b.append("\\\"");
                    break;
                case '\\':
                    b.append("\\\\");
                    break;
                case '\n':
                    b.append("\\n");
                    break;
                case '\r':
                    b.append("\\r");
                    break;
                case '\t':
                    b.append("\\t");
                    break;
                default:
                    if (c < 0x20 || c == 0x7f) {
                        b.append(String.format("\\u{%x}", (int) c));
                    } else {
                        b.append(c);
                    }
            }
        }
        return b.append('"').toString();
    }

    @Override
    public boolean equals(Object o) {
        return o instanceof OutboxInbox && table.equals(((OutboxInbox) o).table);
    }

    @Override
    public int hashCode() {
        return table.hashCode();
    }

    @Override
    public String toString() {
        return "OutboxInbox{" + table + "}";
    }
}
