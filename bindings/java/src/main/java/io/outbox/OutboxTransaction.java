package io.outbox;

import java.lang.ref.Cleaner;
import java.lang.ref.Reference;
import java.math.BigDecimal;
import java.math.BigInteger;
import java.nio.charset.StandardCharsets;
import java.time.LocalDate;
import java.time.LocalDateTime;
import java.time.LocalTime;
import java.time.format.DateTimeFormatter;
import java.util.OptionalLong;
import java.util.UUID;
import java.util.concurrent.atomic.AtomicLong;

/**
 * A transaction on the library's own connection pool (the library-owned path, for hosts that do
 * not bring their own JDBC transaction): run the business statements with {@link #execute},
 * add events with {@link #enqueue}, then {@link #commit()} (which also wakes the relay).
 * Closing it without a commit rolls it back.
 *
 * <p>An {@link OutboxConsumer}'s handler gets one too: the consumer's transaction, which already
 * holds the message's inbox mark. There {@link #execute}, {@link #queryLong} and
 * {@link #lastInsertId} work as here (a statement that would end the transaction, such as
 * {@code COMMIT} or DDL, is refused), but only the consumer ends it: {@link #commit()},
 * {@link #rollback()}, {@link #close()} and {@link #enqueue} throw {@link IllegalStateException}
 * and change nothing, and it is usable only during the handler call that received it.
 *
 * <pre>{@code
 * try (OutboxTransaction tx = outbox.begin()) {
 *     tx.execute("INSERT INTO orders (order_no, amount) VALUES (?, ?)", "ORD-1", new BigDecimal("9.90"));
 *     tx.enqueue(Event.of("ORD-1", "ORDER_CREATED", json));
 *     tx.commit();
 * }
 * }</pre>
 *
 * Parameters may be {@code null}, {@link String}, integral numbers, {@link Boolean},
 * {@link Float}/{@link Double}, {@link BigDecimal}, {@link BigInteger}, {@code byte[]},
 * {@link LocalDate}, {@link LocalDateTime}, {@link LocalTime}, {@code java.sql.Date}/{@code Timestamp},
 * {@link UUID} and enums (by name). Meant for one thread at a time; concurrent calls are
 * serialised, never unsafe.
 */
public final class OutboxTransaction implements AutoCloseable {
    private static final DateTimeFormatter DATETIME = DateTimeFormatter.ofPattern("yyyy-MM-dd HH:mm:ss.SSSSSS");

    private static final class State implements Runnable {
        final AtomicLong handle;

        State(long h) {
            handle = new AtomicLong(h);
        }

        @Override
        public void run() {
            long h = handle.getAndSet(0);
            if (h != 0) {
                Native.txRollback(h);
            }
        }
    }

    private final State state;
    /** {@code null} for a consumer's transaction, which only the consumer ends. */
    private final Cleaner.Cleanable cleanable;

    OutboxTransaction(long handle) {
        this.state = new State(handle);
        this.cleanable = Outbox.CLEANER.register(this, state);
    }

    private OutboxTransaction(State lent) {
        this.state = lent;
        this.cleanable = null;
    }

    /** The consumer's transaction {@code handle}, lent to a handler for one call. */
    static OutboxTransaction lent(long handle) {
        return new OutboxTransaction(new State(handle));
    }

    /** Ends a lent transaction's use (the handler call returned); the native side revokes it too. */
    void revoke() {
        state.handle.set(0);
    }

    /**
     * Whether this is an {@link OutboxConsumer}'s transaction, lent to its handler.
     *
     * @return whether this is an {@link OutboxConsumer}'s transaction, lent to its handler
     */
    public boolean isConsumerTransaction() {
        return cleanable == null;
    }

    private long handle() {
        long h = state.handle.get();
        if (h == 0) {
            throw new IllegalStateException(isConsumerTransaction()
                    ? "the consumer's transaction is only usable during the handler call it was given to"
                    : "the transaction is finished (committed, rolled back or closed)");
        }
        return h;
    }

    private void refuseIfLent(String what) {
        if (isConsumerTransaction()) {
            throw new IllegalStateException(what + " is not allowed on the consumer's transaction: the consumer commits it "
                    + "when the handler returns and rolls it back when the handler throws");
        }
    }

    /**
     * Runs one statement; returns the number of affected rows.
     *
     * @param sql the statement, with {@code ?} placeholders
     * @param params the placeholders' values ({@code null}, numbers, booleans, strings, {@code byte[]}, dates and times, ...)
     * @return the number of affected rows
     */
    public long execute(String sql, Object... params) {
        Params p = Params.encode(params);
        try {
            return Native.txExecute(handle(), sql, p.kinds, p.ints, p.doubles, p.blobs);
        } finally {
            Reference.reachabilityFence(this);
        }
    }

    /**
     * The first column of the first row as a number; empty when there is no row or it is NULL.
     *
     * @param sql the query, with {@code ?} placeholders
     * @param params the placeholders' values, as for {@link #execute}
     * @return the value, or empty
     */
    public OptionalLong queryLong(String sql, Object... params) {
        Params p = Params.encode(params);
        try {
            long[] r = Native.txQueryLong(handle(), sql, p.kinds, p.ints, p.doubles, p.blobs);
            return r.length == 0 ? OptionalLong.empty() : OptionalLong.of(r[0]);
        } finally {
            Reference.reachabilityFence(this);
        }
    }

    /**
     * The AUTO_INCREMENT id generated by the last {@link #execute} (0 if none).
     *
     * @return the AUTO_INCREMENT id generated by the last {@link #execute} (0 if none)
     */
    public long lastInsertId() {
        try {
            return Native.txLastInsertId(handle());
        } finally {
            Reference.reachabilityFence(this);
        }
    }

    /**
     * Inserts {@code event} in this transaction, validated against the relay's config; returns its id.
     *
     * @param event the event
     * @return the new row's id
     */
    public long enqueue(Event event) {
        if (isConsumerTransaction()) {
            throw new IllegalStateException("enqueue() is not allowed on the consumer's transaction: it belongs to no relay, "
                    + "whose table and limits the event would need");
        }
        event = OutboxTracing.withCurrentContext(event);
        Event.checkText(event);
        try {
            return Native.txEnqueue(handle(), event.bizNo(), event.eventType(), event.payloadUnsafe(), event.topic(), event.tag(),
                    event.headerKeys(), event.headerValues(), event.deliverAtMs(), event.delayMs());
        } finally {
            Reference.reachabilityFence(this);
        }
    }

    /** Commits, then wakes the relay. The transaction is finished afterwards, whatever the outcome. */
    public void commit() {
        refuseIfLent("commit()");
        long h = state.handle.getAndSet(0);
        if (h == 0) {
            throw new IllegalStateException("the transaction is finished (committed, rolled back or closed)");
        }
        try {
            Native.txCommit(h);
        } finally {
            cleanable.clean();
            Reference.reachabilityFence(this);
        }
    }

    /** Rolls back; a no-op once the transaction is finished. */
    public void rollback() {
        refuseIfLent("rollback()");
        cleanable.clean();
    }

    /**
     * Whether neither commit nor rollback has happened yet.
     *
     * @return whether neither commit nor rollback has happened yet
     */
    public boolean isOpen() {
        return state.handle.get() != 0;
    }

    /** Rolls back unless committed. Idempotent. */
    @Override
    public void close() {
        refuseIfLent("close()");
        cleanable.clean();
    }

    /** Statement parameters in the form the native library takes. */
    static final class Params {
        static final byte NULL = 0;
        static final byte INT = 1;
        static final byte DOUBLE = 2;
        static final byte BYTES = 3;

        final byte[] kinds;
        final long[] ints;
        final double[] doubles;
        final Object[] blobs;

        private Params(int n) {
            kinds = new byte[n];
            ints = new long[n];
            doubles = new double[n];
            blobs = new Object[n];
        }

        static Params encode(Object[] params) {
            Object[] ps = params == null ? new Object[0] : params;
            Params p = new Params(ps.length);
            for (int i = 0; i < ps.length; i++) {
                p.put(i, ps[i]);
            }
            return p;
        }

        private void put(int i, Object v) {
            if (v == null) {
                kinds[i] = NULL;
            } else if (v instanceof Long || v instanceof Integer || v instanceof Short || v instanceof Byte) {
                kinds[i] = INT;
                ints[i] = ((Number) v).longValue();
            } else if (v instanceof Boolean) {
                kinds[i] = INT;
                ints[i] = ((Boolean) v) ? 1 : 0;
            } else if (v instanceof Double || v instanceof Float) {
                kinds[i] = DOUBLE;
                doubles[i] = ((Number) v).doubleValue();
            } else if (v instanceof BigInteger && ((BigInteger) v).bitLength() < 64) {
                kinds[i] = INT;
                ints[i] = ((BigInteger) v).longValue();
            } else if (v instanceof byte[]) {
                kinds[i] = BYTES;
                blobs[i] = v;
            } else if (v instanceof java.sql.Timestamp) {
                text(i, ((java.sql.Timestamp) v).toLocalDateTime().format(DATETIME));
            } else if (v instanceof java.sql.Date) {
                text(i, ((java.sql.Date) v).toLocalDate().toString());
            } else if (v instanceof LocalDateTime) {
                text(i, ((LocalDateTime) v).format(DATETIME));
            } else if (v instanceof BigDecimal) {
                text(i, ((BigDecimal) v).toPlainString());
            } else if (v instanceof CharSequence || v instanceof BigInteger || v instanceof LocalDate || v instanceof LocalTime
                    || v instanceof UUID || v instanceof Character) {
                text(i, v.toString());
            } else if (v instanceof Enum) {
                text(i, ((Enum<?>) v).name());
            } else {
                throw new IllegalArgumentException("parameter " + (i + 1) + " is a " + v.getClass().getName()
                        + ", which OutboxTransaction cannot bind; pass a String, a number, a Boolean, a byte[], a BigDecimal, "
                        + "a LocalDate/LocalDateTime/LocalTime, a UUID, an enum or null");
            }
        }

        private void text(int i, String s) {
            kinds[i] = BYTES;
            blobs[i] = s.getBytes(StandardCharsets.UTF_8);
        }
    }
}
