package io.outbox;

import java.lang.ref.Cleaner;
import java.lang.ref.Reference;
import java.util.Arrays;
import java.util.Collections;
import java.util.IdentityHashMap;
import java.util.Map;
import java.util.Objects;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicLong;

/**
 * The consuming half, embedded in this JVM: subscribes a RocketMQ topic with a consumer group
 * (through the native library: no RocketMQ client of the service's own) and runs the service's
 * handler on each message <b>in a database transaction that also holds the message's inbox
 * mark</b>, so each event's effects commit once per group however many copies arrive.
 *
 * <pre>{@code
 * OutboxConfig config = new OutboxConfig()
 *         .set("db.url", "mysql://app:secret@127.0.0.1:3306/points")
 *         .set("rocketmq.namesrv", "127.0.0.1:9876")
 *         .set("consumer.max.attempts", 5);
 * OutboxConsumer.migrate(config);               // the inbox and dead-letter tables, nothing else
 * try (OutboxConsumer consumer = OutboxConsumer.start(config, "ORDER_EVENTS", "points-service",
 *         (tx, msg) -> tx.execute("UPDATE points SET balance = balance + 10 WHERE order_no = ?", msg.bizNo()))) {
 *     ... consumer.stats() ...
 * }                                             // stops: finishes the messages in hand, commits offsets
 * }</pre>
 *
 * It is the library's consumer runtime (the one the C ABI and Rust use): the messages of one
 * route value ({@code consumer.route}: by default, of one queue) are handled in order on one of
 * {@code consumer.threads} threads; a message's offset is
 * committed only after its transaction; failures are retried with backoff and parked in the
 * dead-letter table after {@code consumer.max.attempts} (see {@link ConsumerHandler}); dead
 * letters an operator asks to replay ({@code outboxd dead-letters replay --consumer-group}) are
 * handled again by the running consumer, with the same handler.
 *
 * <p>Thread-safe. {@link #stop()} and {@link #close()} block until the runtime stopped, are
 * idempotent, and are refused (with {@link IllegalStateException}) inside a handler, which they
 * would wait for. {@link #stats()} works before and after the stop, and after {@code close} (the
 * final counts). A consumer that becomes unreachable without being closed is closed by a
 * {@link Cleaner} (a backstop, not a substitute for {@code close}): keep a reference while it
 * should run.
 */
public final class OutboxConsumer implements AutoCloseable {
    /** The native handle and the final counts, shared with the Cleaner action: it must not refer to the consumer. */
    private static final class State implements Runnable {
        final AtomicLong handle;
        volatile String finalJson;
        final CountDownLatch closed = new CountDownLatch(1);

        State(long handle) {
            this.handle = new AtomicLong(handle);
        }

        /** Closes the native consumer (at most once: the Cleaner's action). */
        @Override
        public void run() {
            long h = handle.get();
            try {
                if (h != 0) {
                    String json = Native.consumerClose(h);
                    if (json != null) {
                        finalJson = json;
                    }
                }
            } finally {
                handle.set(0);
                closed.countDown();
            }
        }
    }

    private final State state;
    private final Cleaner.Cleanable cleanable;
    private final String topic;
    private final String group;

    private OutboxConsumer(long handle, String topic, String group) {
        this.state = new State(handle);
        this.cleanable = Outbox.CLEANER.register(this, state);
        this.topic = topic;
        this.group = group;
    }

    /**
     * Applies the consuming half's pending migrations alone: the inbox and the consumer
     * dead-letter tables, none of the relay's ({@link Outbox#migrate} is for a database that
     * relays). Safe to run from many instances at once; applied versions are skipped.
     *
     * @param config the configuration ({@code db.url} is used)
     * @return the versions applied and the last consumer migration's version
     * @throws OutboxConfigException {@code db.url} missing or bad
     * @throws OutboxDatabaseException the database is unreachable or a statement failed
     */
    public static MigrationReport migrate(OutboxConfig config) {
        Native.ensureLoaded();
        return new MigrationReport(Native.migrateConsumerConfig(config.keyArray(), config.valueArray()));
    }

    /**
     * Starts a consumer of {@code topic} for the consumer group {@code group}, running
     * {@code handler} on each message. Reads {@code db.url}, {@code rocketmq.namesrv} and the
     * {@code consumer.*} and {@code inbox.*} keys of {@code config}. The database is checked first
     * (reachable; the inbox and dead-letter tables present: run {@link #migrate} first), so a
     * start that cannot work fails at once, naming why; a name server or broker that cannot be
     * reached does not fail it (the consumer keeps trying and says so in {@link #stats()}).
     *
     * @param config the configuration
     * @param topic the topic to subscribe
     * @param group the consumer group
     * @param handler the service's code for one message
     * @return the running consumer; stop or close it when done
     * @throws NullPointerException a {@code null} argument (the message names it)
     * @throws OutboxInvalidEventException a bad {@code topic} or {@code consumer_group} (the field is named)
     * @throws OutboxConfigException a bad or missing key ({@code db.url}, {@code consumer.*}, {@code inbox.*})
     * @throws OutboxDatabaseException the database is unreachable or a table is missing
     * @throws OutboxPublisherException the library was built without the {@code rocketmq} feature,
     *     or the RocketMQ client could not start
     */
    public static OutboxConsumer start(OutboxConfig config, String topic, String group, ConsumerHandler handler) {
        Objects.requireNonNull(handler, "handler must not be null");
        // Called once per batch (the dispatcher runs the handler on each message in turn, the
        // first exception ending the call): one JNI crossing per batch, not per message.
        return start(config, topic, group, new Dispatcher(handler, null), true);
    }

    /**
     * Like {@link #start}, with a handler given each batch's new messages at once (up to
     * {@code consumer.batch.max} per transaction).
     *
     * @param config the configuration
     * @param topic the topic to subscribe
     * @param group the consumer group
     * @param handler the service's code for a batch
     * @return the running consumer; stop or close it when done
     */
    public static OutboxConsumer startBatch(OutboxConfig config, String topic, String group, BatchConsumerHandler handler) {
        Objects.requireNonNull(handler, "handler must not be null");
        return start(config, topic, group, new Dispatcher(null, handler), true);
    }

    private static OutboxConsumer start(OutboxConfig config, String topic, String group, Dispatcher dispatcher, boolean batch) {
        Objects.requireNonNull(config, "config must not be null");
        Objects.requireNonNull(topic, "topic must not be null");
        Objects.requireNonNull(group, "group must not be null");
        Native.ensureLoaded();
        long h = Native.consumerStart(config.keyArray(), config.valueArray(), topic, group, dispatcher, batch);
        try {
            return new OutboxConsumer(h, topic, group);
        } catch (RuntimeException | Error e) {
            Native.consumerClose(h);
            throw e;
        }
    }

    /**
     * The topic this consumer subscribed.
     *
     * @return the topic
     */
    public String topic() {
        return topic;
    }

    /**
     * Its consumer group.
     *
     * @return the consumer group
     */
    public String group() {
        return group;
    }

    /**
     * The counters now; after {@link #stop()} or {@link #close()}, the final ones ({@link OutboxConsumerStats#isStopped()}).
     *
     * @return the counters
     */
    public OutboxConsumerStats stats() {
        long h = state.handle.get();
        if (h != 0) {
            try {
                return new OutboxConsumerStats(Native.consumerStats(h));
            } catch (OutboxStoppedException closedMeanwhile) {
                // The final counts below.
            } finally {
                Reference.reachabilityFence(this);
            }
        }
        return finalStats();
    }

    /**
     * Stops the consumer: no new messages; each handler thread finishes the messages in hand
     * (the others are not acknowledged: the broker delivers them again), offsets are committed
     * and stored, the consumer leaves its group. Blocks until then, also when another thread is
     * stopping it. Returns the final counts; later calls return them again.
     *
     * @return the final counts
     * @throws IllegalStateException called from a consumer's handler
     */
    public OutboxConsumerStats stop() {
        refuseInHandler("stop");
        long h = state.handle.get();
        if (h != 0) {
            try {
                String json = Native.consumerStop(h);
                state.finalJson = json;
                return new OutboxConsumerStats(json);
            } catch (OutboxStoppedException closedMeanwhile) {
                // The final counts below.
            } finally {
                Reference.reachabilityFence(this);
            }
        }
        return finalStats();
    }

    /**
     * Whether {@link #close()} has completed.
     *
     * @return whether {@link #close()} has completed
     */
    public boolean isClosed() {
        return state.handle.get() == 0;
    }

    /**
     * Stops the consumer as {@link #stop()} does (if it was not) and frees it. Idempotent and
     * thread-safe; {@link #stats()} still returns the final counts afterwards.
     *
     * @throws IllegalStateException called from a consumer's handler
     */
    @Override
    public void close() {
        refuseInHandler("close");
        cleanable.clean();
        awaitClosed();
    }

    @Override
    public String toString() {
        return "OutboxConsumer{topic=" + topic + ", group=" + group + (isClosed() ? ", closed" : "") + "}";
    }

    private OutboxConsumerStats finalStats() {
        awaitClosed();
        String json = state.finalJson;
        if (json == null) {
            throw new OutboxStoppedException("the consumer is closed, and its final counts are unknown (its stop failed)");
        }
        return new OutboxConsumerStats(json);
    }

    /** Waits for a close under way on another thread (it ends once the runtime stopped). */
    private void awaitClosed() {
        boolean interrupted = false;
        while (true) {
            try {
                state.closed.await();
                break;
            } catch (InterruptedException e) {
                interrupted = true;
            }
        }
        if (interrupted) {
            Thread.currentThread().interrupt();
        }
    }

    private static void refuseInHandler(String what) {
        if (Dispatcher.IN_HANDLER.get() != null) {
            throw new IllegalStateException("OutboxConsumer." + what + "() cannot be called from a consumer's handler: it waits "
                    + "for the handler threads to finish, this one included");
        }
    }

    /**
     * What the native library calls on the consumer's threads: runs the service's handler with
     * the lent transaction and tells how it went. Must not refer to the {@link OutboxConsumer}
     * (the native side holds it as long as the consumer runs).
     */
    static final class Dispatcher {
        /** Set on a thread while it runs a handler. */
        static final ThreadLocal<Boolean> IN_HANDLER = new ThreadLocal<>();

        private final ConsumerHandler each;
        private final BatchConsumerHandler batch;

        Dispatcher(ConsumerHandler each, BatchConsumerHandler batch) {
            this.each = each;
            this.batch = batch;
        }

        /**
         * Runs the handler on {@code messages} with the lent transaction {@code tx}. Returns
         * {@code null} when it returned normally (commit), else {@code "T"} (transient: retried
         * without using an attempt) or {@code "F"} (uses an attempt) followed by what it threw.
         * Never throws.
         */
        String dispatch(long tx, ConsumerMessage[] messages) {
            OutboxTransaction t = OutboxTransaction.lent(tx);
            IN_HANDLER.set(Boolean.TRUE);
            try {
                if (each != null) {
                    for (ConsumerMessage m : messages) {
                        each.handle(t, m);
                    }
                } else {
                    batch.handle(t, Collections.unmodifiableList(Arrays.asList(messages)));
                }
                return null;
            } catch (Throwable e) {
                return (isTransient(e) ? "T" : "F") + describe(e);
            } finally {
                t.revoke();
                IN_HANDLER.remove();
            }
        }

        /**
         * Whether {@code e}, or one of its causes, is an {@link OutboxTransientException}, a
         * {@link java.sql.SQLTransientException} or a retriable {@link OutboxDatabaseException}.
         */
        static boolean isTransient(Throwable e) {
            Map<Throwable, Boolean> seen = new IdentityHashMap<>();
            for (Throwable c = e; c != null && seen.put(c, Boolean.TRUE) == null; c = c.getCause()) {
                if (c instanceof OutboxTransientException || c instanceof java.sql.SQLTransientException) {
                    return true;
                }
                if (c instanceof OutboxDatabaseException && ((OutboxDatabaseException) c).isRetriable()) {
                    return true;
                }
            }
            return false;
        }

        /** The exception's class and message, and its root cause's when it has one. */
        static String describe(Throwable e) {
            try {
                Throwable root = e;
                Map<Throwable, Boolean> seen = new IdentityHashMap<>();
                while (root.getCause() != null && seen.put(root, Boolean.TRUE) == null) {
                    root = root.getCause();
                }
                return root == e ? e.toString() : e + " (caused by " + root + ")";
            } catch (Throwable failed) {
                return e.getClass().getName();
            }
        }
    }
}
