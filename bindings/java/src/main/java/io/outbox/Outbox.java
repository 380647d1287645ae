package io.outbox;

import java.lang.ref.Cleaner;
import java.lang.ref.Reference;
import java.nio.file.Path;
import java.sql.Connection;
import java.time.Duration;
import java.util.Arrays;
import java.util.Collections;
import java.util.LinkedHashSet;
import java.util.Set;
import java.util.concurrent.atomic.AtomicLong;

/**
 * A relay embedded in this JVM: it claims committed outbox rows and publishes them (with
 * {@code publisher=rocketmq}), or only opens the pool for enqueueing (with {@code publisher=none}).
 *
 * <pre>{@code
 * try (Outbox outbox = Outbox.start(config)) {
 *     // in the service's own JDBC transaction:
 *     outbox.enqueue(connection, Event.of("ORD-1", "ORDER_CREATED", json));
 *     connection.commit();
 *     outbox.notifyCommitted();   // relay now instead of at the next scan
 * }
 * }</pre>
 *
 * Thread-safe. {@link #close()} is idempotent and may race with other calls: once it has begun,
 * every call throws {@link OutboxStoppedException}. A relay that becomes unreachable without
 * being closed is closed by a {@link Cleaner} (a backstop, not a substitute for {@code close}).
 */
public final class Outbox implements AutoCloseable {
    /** How long {@link #close()} lets sends in flight finish when {@link #stop} was not called. */
    public static final Duration DEFAULT_CLOSE_TIMEOUT = Duration.ofSeconds(10);

    static final Cleaner CLEANER = Cleaner.create(r -> {
        Thread t = new Thread(r, "outbox-cleaner");
        t.setDaemon(true);
        return t;
    });

    /** The native handle, shared with the Cleaner action; it must not refer to the Outbox. */
    private static final class State implements Runnable {
        final AtomicLong handle;

        State(long handle) {
            this.handle = new AtomicLong(handle);
        }

        @Override
        public void run() {
            long h = handle.getAndSet(0);
            if (h != 0) {
                Native.close(h, DEFAULT_CLOSE_TIMEOUT.toMillis());
            }
        }
    }

    private final State state;
    private final Cleaner.Cleanable cleanable;
    private final String table;
    private final long payloadMaxBytes;

    private Outbox(long handle) {
        this.state = new State(handle);
        this.cleanable = CLEANER.register(this, state);
        this.table = Native.relayConfigGet(handle, "table");
        this.payloadMaxBytes = Long.parseLong(Native.relayConfigGet(handle, "payload.max.bytes"));
    }

    // ------------------------------------------------------------------------------------ static

    /**
     * Starts a relay: validates the configuration, opens the pool, checks that the table exists
     * (run {@link #migrate(OutboxConfig)} first on a new database) and starts the relay threads.
     *
     * @param config the configuration
     * @return the running relay; close it when done
     * @throws OutboxConfigException a key or value is wrong, or values do not work together
     * @throws OutboxDatabaseException the database is unreachable or the table is missing
     * @throws OutboxPublisherException the broker client could not start
     */
    public static Outbox start(OutboxConfig config) {
        return start(config, null);
    }

    /**
     * Like {@link #start(OutboxConfig)}, telling {@code deadLetters} (if not {@code null}) of every
     * event that ends FAIL.
     *
     * @param config the configuration
     * @param deadLetters told of every dead letter, or {@code null}
     * @return the running relay; close it when done
     */
    public static Outbox start(OutboxConfig config, DeadLetterListener deadLetters) {
        Native.ensureLoaded();
        long h = Native.start(config.keyArray(), config.valueArray(), deadLetters);
        try {
            return new Outbox(h);
        } catch (RuntimeException | Error e) {
            Native.close(h, 0);
            throw e;
        }
    }

    /**
     * Applies the pending schema migrations to the configured table (safe to run from many instances at once).
     *
     * @param config the configuration ({@code db.url} and {@code table} are used)
     * @return the versions applied and the schema version after the call
     */
    public static MigrationReport migrate(OutboxConfig config) {
        Native.ensureLoaded();
        return new MigrationReport(Native.migrateConfig(config.keyArray(), config.valueArray()));
    }

    /**
     * Loads the native library from {@code path} (the file, or a directory holding
     * {@code liboutbox.so}) instead of {@code java.library.path}. Call it before anything else.
     *
     * @param path the library file, or a directory holding {@code liboutbox.so}
     * @throws OutboxLibraryException nothing loadable there (the message names the path)
     * @throws IllegalStateException the library is already loaded from elsewhere
     */
    public static void loadLibrary(Path path) {
        Native.load(path, "Outbox.loadLibrary");
    }

    /**
     * The native library's version.
     *
     * @return the native library's version
     */
    public static String version() {
        Native.ensureLoaded();
        return Native.version();
    }

    /**
     * Where the library was loaded from ({@code null} before it was).
     *
     * @return where the library was loaded from ({@code null} before it was)
     */
    public static String libraryLocation() {
        return Native.loadedFrom();
    }

    /**
     * Sets the native library's log threshold for this process (default {@code INFO}: start,
     * stop and state changes, no line per event). Records at or above it go to
     * {@code System.Logger} under {@code outbox.*} names ({@code outbox.relay}, ...), where the
     * usual backend configuration applies too. The key {@code log.level} does the same at
     * {@link #start}. {@code OFF} silences the library; {@code ALL} is {@code TRACE}.
     *
     * @param level the threshold
     */
    public static void setLogLevel(System.Logger.Level level) {
        java.util.Objects.requireNonNull(level, "level");
        Native.ensureLoaded();
        int code;
        switch (level) {
            case OFF:
                code = 0;
                break;
            case ERROR:
                code = 1;
                break;
            case WARNING:
                code = 2;
                break;
            case INFO:
                code = 3;
                break;
            case DEBUG:
                code = 4;
                break;
            default:
                code = 5;
                break;
        }
        Native.setLogLevel(code);
    }

    /**
     * Cargo features the library was built with: {@code jni}, and {@code rocketmq} when it can publish.
     *
     * @return the features, unmodifiable
     */
    public static Set<String> features() {
        Native.ensureLoaded();
        return Collections.unmodifiableSet(new LinkedHashSet<>(Arrays.asList(Native.features())));
    }

    // ---------------------------------------------------------------------------------- instance

    private long handle() {
        long h = state.handle.get();
        if (h == 0) {
            throw new OutboxStoppedException("the outbox relay is closed");
        }
        return h;
    }

    /**
     * Wakes the relay after a commit that enqueued events, so they go out now. Cheap, never
     * blocks, never throws: after {@link #close()} (or {@link #stop}) it does nothing, because the
     * commit it follows has happened and the events are relayed at the next scan of a running
     * relay.
     */
    public void notifyCommitted() {
        // After close (or a racing close) this is a no-op: it runs after a commit that already
        // happened, and the events are relayed at the next scan of whichever relay runs then.
        long h = state.handle.get();
        if (h == 0) {
            return;
        }
        try {
            Native.notifyRelay(h);
        } catch (OutboxStoppedException closedMeanwhile) {
            // Same: harmless after the commit.
        } finally {
            Reference.reachabilityFence(this);
        }
    }

    /**
     * Cancels the event {@code eventId} if it has not left yet (docs/scheduling.md). A cancel
     * racing the relay waits for a round sending it to end, so the outcome is exact: cancelled,
     * or sent (or in flight, and then sent). Audited in {@code outbox_audit} with this instance's id.
     *
     * @param eventId the event's id, as {@code enqueue} returned it
     * @return what became of the event
     * @throws OutboxInvalidEventException for an id the table never issued (nothing changes)
     */
    public CancelOutcome cancel(long eventId) {
        try {
            return CancelOutcome.values()[Native.cancel(handle(), eventId)];
        } finally {
            Reference.reachabilityFence(this);
        }
    }

    /**
     * Cancels the pending events of {@code bizNo}, of type {@code eventType} only when it is not
     * {@code null}, like {@link #cancel(long)}.
     *
     * @param bizNo the business key
     * @param eventType the event type, or {@code null} for every type
     * @return how many were cancelled (the others had left, or were in flight)
     */
    public long cancelByBizNo(String bizNo, String eventType) {
        java.util.Objects.requireNonNull(bizNo, "bizNo");
        try {
            return Native.cancelByBizNo(handle(), bizNo, eventType);
        } finally {
            Reference.reachabilityFence(this);
        }
    }

    /**
     * Counters and database gauges (one small query).
     *
     * @return the snapshot, with the gauges
     */
    public OutboxStats stats() {
        try {
            return new OutboxStats(Native.stats(handle(), true));
        } finally {
            Reference.reachabilityFence(this);
        }
    }

    /**
     * Counters only, without touching the database.
     *
     * @return the snapshot, without the gauges
     */
    public OutboxStats counters() {
        try {
            return new OutboxStats(Native.stats(handle(), false));
        } finally {
            Reference.reachabilityFence(this);
        }
    }

    /**
     * This instance's id, as written to {@code claim_owner}.
     *
     * @return this instance's id, as written to {@code claim_owner}
     */
    public String instanceId() {
        try {
            return Native.instanceId(handle());
        } finally {
            Reference.reachabilityFence(this);
        }
    }

    /**
     * Whether this relay publishes (false with {@code publisher=none}, and after {@link #stop}).
     *
     * @return whether this relay publishes (false with {@code publisher=none}, and after {@link #stop})
     */
    public boolean isRelaying() {
        try {
            return Native.isRelaying(handle());
        } finally {
            Reference.reachabilityFence(this);
        }
    }

    /**
     * The outbox table this relay works on.
     *
     * @return the outbox table this relay works on
     */
    public String table() {
        return table;
    }

    /**
     * Applies the pending migrations to this relay's table.
     *
     * @return the versions applied and the schema version after the call
     */
    public MigrationReport migrate() {
        try {
            return new MigrationReport(Native.migrate(handle()));
        } finally {
            Reference.reachabilityFence(this);
        }
    }

    /**
     * Stops relaying: no new claims, sends in flight may finish until {@code timeout}, claimed but
     * unsent events go back to WAIT, threads are joined. If threads were still running at the
     * deadline ({@code timedOut}), a later call waits for them again up to its own deadline.
     * Later calls report {@code alreadyStopped}. Enqueueing and {@link #stats()} still work until
     * {@link #close()}.
     *
     * @param timeout how long to let sends in flight finish
     * @return what the stop did
     */
    public StopReport stop(Duration timeout) {
        try {
            return new StopReport(Native.stop(handle(), timeout.toMillis()));
        } finally {
            Reference.reachabilityFence(this);
        }
    }

    /**
     * Inserts {@code event} through {@code conn}, in whatever transaction {@code conn} is in, into
     * this relay's table, validated against this relay's {@code payload.max.bytes}. After the
     * host commits, call {@link #notifyCommitted()}.
     *
     * @param conn the host's JDBC connection, in its transaction
     * @param event the event
     * @return the new row's id
     */
    public long enqueue(Connection conn, Event event) {
        handle();
        return OutboxEvents.enqueue(conn, table, payloadMaxBytes, event);
    }

    /**
     * Opens a transaction on the library's own pool (the library-owned path). Close it to roll back.
     *
     * @return the transaction
     */
    public OutboxTransaction begin() {
        try {
            long h = handle();
            return new OutboxTransaction(Native.txBegin(h));
        } finally {
            Reference.reachabilityFence(this);
        }
    }

    /** The native handle, for the binding's tests (0 once closed). */
    long handleForTest() {
        return state.handle.get();
    }

    /**
     * Whether {@link #close()} has been called.
     *
     * @return whether {@link #close()} has been called
     */
    public boolean isClosed() {
        return state.handle.get() == 0;
    }

    /**
     * Stops the relay (waiting up to {@link #DEFAULT_CLOSE_TIMEOUT} unless {@link #stop} was
     * called) and frees it. Idempotent and thread-safe.
     */
    @Override
    public void close() {
        cleanable.clean();
    }

    @Override
    public String toString() {
        long h = state.handle.get();
        return h == 0 ? "Outbox{closed}" : "Outbox{table=" + table + "}";
    }

    /**
     * {@code java -jar outbox.jar}: prints the library's version, features and location.
     *
     * @param args ignored
     */
    public static void main(String[] args) {
        try {
            System.out.println("outbox " + version() + " " + features() + " loaded from " + libraryLocation());
        } catch (OutboxException e) {
            System.err.println(e.getMessage());
            System.exit(2);
        }
    }
}
