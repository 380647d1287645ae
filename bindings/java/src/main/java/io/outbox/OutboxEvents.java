package io.outbox;

import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.sql.Types;
import java.util.Objects;
import java.util.concurrent.ConcurrentHashMap;

/**
 * Enqueue with the host's own JDBC connection: the event row is inserted through {@code conn},
 * so it commits or rolls back with whatever transaction {@code conn} is in (a Spring
 * {@code @Transactional} method's, for one). The INSERT text and its parameter order come from
 * the native library (fetched once per table), so the schema has one source of truth.
 *
 * <pre>{@code
 * conn.setAutoCommit(false);
 * insertOrder(conn, order);
 * long id = OutboxEvents.enqueue(conn, Event.of(order.no(), "ORDER_CREATED", json));
 * conn.commit();
 * outbox.notifyCommitted();   // optional: relay now rather than at the next scan
 * }</pre>
 */
public final class OutboxEvents {
    /** The library's default table. */
    public static final String DEFAULT_TABLE = "t_event_record";

    private static final ConcurrentHashMap<String, Insert> INSERTS = new ConcurrentHashMap<>();
    private static volatile long defaultPayloadMax = -1;

    private OutboxEvents() {}

    /** A table's two INSERTs: for an event due now, and for a scheduled one. */
    private static final class Insert {
        final String sql;
        final String[] params;
        final String scheduledSql;
        final String[] scheduledParams;

        Insert(String table) {
            this.sql = Native.insertStatement(table, false);
            this.params = Native.insertParams(false);
            this.scheduledSql = Native.insertStatement(table, true);
            this.scheduledParams = Native.insertParams(true);
        }
    }

    /**
     * Inserts {@code event} into {@code t_event_record} through {@code conn}; returns the new row's id.
     *
     * @param conn the host's connection, in its transaction
     * @param event the event
     * @return the new row's id
     */
    public static long enqueue(Connection conn, Event event) {
        return enqueue(conn, DEFAULT_TABLE, event);
    }

    /**
     * Inserts {@code event} into {@code table} through {@code conn}; returns the new row's id.
     *
     * @param conn the host's connection, in its transaction
     * @param table the outbox table
     * @param event the event
     * @return the new row's id
     */
    public static long enqueue(Connection conn, String table, Event event) {
        return enqueue(conn, table, defaultPayloadMax(), event);
    }

    /**
     * The INSERT statement the library uses for an event due now in {@code table} (its
     * parameters: {@link #insertParameters()}).
     *
     * @param table the outbox table
     * @return the statement
     */
    public static String insertStatement(String table) {
        return insert(table).sql;
    }

    /**
     * The names of the INSERT's parameters, in order.
     *
     * @return the names of the INSERT's parameters, in order
     */
    public static String[] insertParameters() {
        return insert(DEFAULT_TABLE).params.clone();
    }

    /**
     * The INSERT statement the library uses for a scheduled event in {@code table} (its
     * parameters: {@link #insertScheduledParameters()}).
     *
     * @param table the outbox table
     * @return the statement
     */
    public static String insertScheduledStatement(String table) {
        return insert(table).scheduledSql;
    }

    /**
     * The names of the scheduled INSERT's parameters, in order: those of
     * {@link #insertParameters()}, then {@code deliver_at_ms} and {@code delay_ms}.
     *
     * @return the names of the scheduled INSERT's parameters, in order
     */
    public static String[] insertScheduledParameters() {
        return insert(DEFAULT_TABLE).scheduledParams.clone();
    }

    static long enqueue(Connection conn, String table, long payloadMax, Event event) {
        Objects.requireNonNull(conn, "conn");
        Objects.requireNonNull(table, "table");
        Objects.requireNonNull(event, "event");
        Insert ins = insert(table);
        event = OutboxTracing.withCurrentContext(event);
        Event.checkText(event);
        // Validated by the library's own rules; also gives the headers column's JSON.
        String headers = Native.checkEvent(event.bizNo(), event.eventType(), event.payloadUnsafe(), event.topic(), event.tag(),
                event.headerKeys(), event.headerValues(), event.deliverAtMs(), event.delayMs(), payloadMax);
        try {
            if (conn.getAutoCommit()) {
                // The row would commit alone at once: the business write that follows could fail
                // and the event would still be published without it.
                throw new IllegalStateException("enqueue needs a connection in a transaction, but this one is in "
                        + "autocommit mode, so the event would commit alone: call conn.setAutoCommit(false) first "
                        + "(Spring: run it inside a @Transactional method); nothing was inserted");
            }
        } catch (SQLException e) {
            throw new OutboxDatabaseException("could not read the connection's autocommit mode", e);
        }
        // An event due now takes the INSERT without the due time's expression (cheaper for the
        // database); a scheduled one the INSERT with it.
        boolean scheduled = event.deliverAtMs() != 0 || event.delayMs() != 0;
        String sql = scheduled ? ins.scheduledSql : ins.sql;
        String[] params = scheduled ? ins.scheduledParams : ins.params;
        try (PreparedStatement ps = conn.prepareStatement(sql, Statement.RETURN_GENERATED_KEYS)) {
            for (int i = 0; i < params.length; i++) {
                int n = i + 1;
                switch (params[i]) {
                    case "biz_no":
                        ps.setString(n, event.bizNo());
                        break;
                    case "event_type":
                        ps.setString(n, event.eventType());
                        break;
                    case "payload":
                        ps.setBytes(n, event.payloadUnsafe());
                        break;
                    case "topic":
                        setNullable(ps, n, event.topic());
                        break;
                    case "tag":
                        setNullable(ps, n, event.tag());
                        break;
                    case "headers":
                        setNullable(ps, n, headers);
                        break;
                    case "deliver_at_ms":
                        setNullableLong(ps, n, event.deliverAtMs());
                        break;
                    case "delay_ms":
                        setNullableLong(ps, n, event.delayMs());
                        break;
                    default:
                        throw new OutboxInternalException("the library's INSERT has a parameter " + params[i]
                                + " that this outbox.jar does not know: use the jar and library of one release");
                }
            }
            ps.executeUpdate();
            try (ResultSet keys = ps.getGeneratedKeys()) {
                if (!keys.next()) {
                    throw new OutboxDatabaseException("the INSERT into " + table + " returned no generated id", 0, null, false);
                }
                return keys.getLong(1);
            }
        } catch (SQLException e) {
            throw new OutboxDatabaseException("enqueue into " + table + " failed", e);
        }
    }

    private static void setNullable(PreparedStatement ps, int n, String v) throws SQLException {
        if (v == null) {
            ps.setNull(n, Types.VARCHAR);
        } else {
            ps.setString(n, v);
        }
    }

    /** 0 (not set) is bound as NULL. */
    private static void setNullableLong(PreparedStatement ps, int n, long v) throws SQLException {
        if (v == 0) {
            ps.setNull(n, Types.BIGINT);
        } else {
            ps.setLong(n, v);
        }
    }

    private static Insert insert(String table) {
        Insert ins = INSERTS.get(table);
        if (ins != null) {
            return ins;
        }
        Native.ensureLoaded();
        // Outside computeIfAbsent: a bad table name throws OutboxConfigException naming it.
        ins = new Insert(table);
        Insert prev = INSERTS.putIfAbsent(table, ins);
        return prev != null ? prev : ins;
    }

    private static long defaultPayloadMax() {
        long m = defaultPayloadMax;
        if (m < 0) {
            Native.ensureLoaded();
            m = Long.parseLong(Native.configDefault("payload.max.bytes"));
            defaultPayloadMax = m;
        }
        return m;
    }
}
