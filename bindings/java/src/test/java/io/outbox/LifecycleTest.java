package io.outbox;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertNotEquals;
import static org.junit.Assert.assertNotNull;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;
import static org.junit.Assert.fail;

import java.sql.Connection;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.AfterClass;
import org.junit.BeforeClass;
import org.junit.Test;

/** Start, stats, stop, close: idempotent, thread-safe, and never a use after free. */
public class LifecycleTest {
    private static TestDb db;

    @BeforeClass
    public static void setUp() {
        db = new TestDb();
        Outbox.migrate(db.config());
    }

    @AfterClass
    public static void tearDown() {
        if (db != null) {
            db.close();
        }
    }

    @Test
    public void enqueue_only_relay_reports_stats() {
        try (Outbox outbox = Outbox.start(db.config().set("service.name", "lifecycle"))) {
            assertFalse(outbox.isRelaying());
            assertTrue(outbox.instanceId(), outbox.instanceId().startsWith("lifecycle-"));
            assertEquals("t_event_record", outbox.table());
            outbox.notifyCommitted();
            OutboxStats s = outbox.stats();
            assertEquals(outbox.instanceId(), s.instanceId());
            assertEquals(0, s.sent());
            assertEquals("closed", s.breakerState());
            assertTrue(s.json(), s.gauges().isPresent());
            assertFalse(outbox.counters().gauges().isPresent());
            assertTrue(s.json().startsWith("{"));
        }
    }

    @Test
    public void migrate_on_a_relay_is_idempotent() {
        try (Outbox outbox = Outbox.start(db.config())) {
            MigrationReport r = outbox.migrate();
            assertTrue(r.applied().isEmpty());
            assertTrue(r.current() >= 2);
        }
    }

    @Test
    public void start_on_a_database_without_the_table_is_a_database_exception() {
        OutboxDatabaseException e = assertThrows(OutboxDatabaseException.class, () -> Outbox.start(db.config().set("table", "not_migrated")));
        assertEquals(1146, e.errorCode());
        assertTrue(e.getMessage(), e.getMessage().contains("not_migrated"));
    }

    @Test
    public void unreachable_database_is_a_retriable_database_exception() {
        OutboxConfig c = new OutboxConfig().set("db.url", "mysql://root@127.0.0.1:1/nothing").set("publisher", "none");
        OutboxDatabaseException e = assertThrows(OutboxDatabaseException.class, () -> Outbox.start(c));
        assertTrue(e.getMessage(), e.isRetriable());
    }

    @Test
    public void dead_letters_reach_the_java_listener_from_a_relay_thread() throws Exception {
        java.util.concurrent.BlockingQueue<DeadLetter> got = new java.util.concurrent.LinkedBlockingQueue<>();
        java.util.concurrent.BlockingQueue<String> threads = new java.util.concurrent.LinkedBlockingQueue<>();
        try (Outbox outbox = Outbox.start(db.config(), letter -> {
            threads.add(Thread.currentThread().getName());
            got.add(letter);
        })) {
            // The hook runs on a native thread the JVM has never seen, as a relay worker's would.
            assertTrue(Native.selfTestDeadLetter(outbox.handleForTest()));
            DeadLetter d = got.poll(10, java.util.concurrent.TimeUnit.SECONDS);
            assertNotNull(d);
            assertEquals(42, d.id());
            assertEquals("SELF-TEST", d.bizNo());
            assertEquals("SELF_TEST", d.eventType());
            assertEquals(3, d.retryCount());
            assertEquals("self-test dead letter", d.lastError());
            assertNotEquals(Thread.currentThread().getName(), threads.poll());
        }
        // A listener that throws is reported and ignored: the relay and the JVM go on.
        try (Outbox outbox = Outbox.start(db.config(), letter -> {
            throw new IllegalStateException("listener failure (expected by the test)");
        })) {
            assertTrue(Native.selfTestDeadLetter(outbox.handleForTest()));
            assertTrue(Native.selfTestDeadLetter(outbox.handleForTest()));
            assertNotNull(outbox.stats());
        }
        try (Outbox outbox = Outbox.start(db.config())) {
            assertFalse(Native.selfTestDeadLetter(outbox.handleForTest()));
        }
    }

    @Test
    public void close_twice_is_safe() {
        Outbox outbox = Outbox.start(db.config());
        outbox.close();
        assertTrue(outbox.isClosed());
        outbox.close();
        outbox.close();
    }

    @Test
    public void stop_is_idempotent_and_stats_work_until_close() {
        try (Outbox outbox = Outbox.start(db.config())) {
            StopReport first = outbox.stop(Duration.ofSeconds(2));
            assertFalse(first.timedOut());
            assertTrue(outbox.stop(Duration.ofSeconds(2)).alreadyStopped());
            assertNotNull(outbox.stats());
        }
    }

    @Test
    public void every_call_after_close_but_notify_throws_stopped() throws Exception {
        Outbox outbox = Outbox.start(db.config());
        outbox.close();
        outbox.notifyCommitted(); // follows a commit that happened: harmless, never throws
        List<Runnable> calls = new ArrayList<>();
        calls.add(outbox::stats);
        calls.add(outbox::counters);
        calls.add(outbox::instanceId);
        calls.add(outbox::isRelaying);
        calls.add(outbox::migrate);
        calls.add(outbox::begin);
        calls.add(() -> outbox.stop(Duration.ofSeconds(1)));
        try (Connection c = db.connect()) {
            calls.add(() -> outbox.enqueue(c, Event.of("ORD-after-close", "T", "{}")));
            for (Runnable call : calls) {
                assertThrows(OutboxStoppedException.class, call::run);
            }
        }
        assertEquals(0, db.count("biz_no = 'ORD-after-close'"));
    }

    @Test
    public void stale_handles_are_refused_by_the_native_side_too() {
        Outbox outbox = Outbox.start(db.config());
        outbox.close();
        // Handles are registry ids, never pointers: a closed, unknown or forged one throws.
        for (long h : new long[] {0, -1, 42_000_000L, Long.MAX_VALUE}) {
            assertThrows(OutboxStoppedException.class, () -> Native.stats(h, false));
            assertThrows(OutboxStoppedException.class, () -> Native.notifyRelay(h));
            assertThrows(OutboxStoppedException.class, () -> Native.txBegin(h));
            assertEquals(null, Native.close(h, 0));
        }
        assertThrows(IllegalStateException.class, () -> Native.txCommit(-5));
        Native.txRollback(-5); // a no-op
    }

    @Test
    public void concurrent_close_and_calls_never_crash() throws Exception {
        for (int round = 0; round < 5; round++) {
            Outbox outbox = Outbox.start(db.config());
            int threads = 8;
            CountDownLatch go = new CountDownLatch(1);
            AtomicInteger stopped = new AtomicInteger();
            AtomicReference<Throwable> unexpected = new AtomicReference<>();
            List<Thread> ts = new ArrayList<>();
            for (int t = 0; t < threads; t++) {
                int me = t;
                Thread th = new Thread(() -> {
                    try {
                        go.await();
                        for (int i = 0; i < 200; i++) {
                            try {
                                if (me == 0 && i == 20) {
                                    outbox.close();
                                } else if (me % 2 == 0) {
                                    outbox.counters();
                                } else {
                                    outbox.notifyCommitted();
                                }
                            } catch (OutboxStoppedException e) {
                                stopped.incrementAndGet();
                            }
                        }
                        outbox.close();
                    } catch (Throwable e) {
                        unexpected.compareAndSet(null, e);
                    }
                });
                ts.add(th);
                th.start();
            }
            go.countDown();
            for (Thread th : ts) {
                th.join(30_000);
            }
            if (unexpected.get() != null) {
                throw new AssertionError(unexpected.get());
            }
            assertTrue(outbox.isClosed());
            assertTrue(stopped.get() > 0);
        }
    }

    @Test
    public void cleaner_closes_an_unreachable_relay() throws Exception {
        long before = Native.liveHandles()[0];
        startAndForget();
        assertEquals(before + 1, Native.liveHandles()[0]);
        long deadline = System.nanoTime() + Duration.ofSeconds(30).toNanos();
        while (Native.liveHandles()[0] > before) {
            if (System.nanoTime() > deadline) {
                fail("the Cleaner did not close the unreachable relay");
            }
            System.gc();
            Thread.sleep(50);
        }
    }

    private static void startAndForget() {
        Outbox.start(db.config()).notifyCommitted();
    }
}
