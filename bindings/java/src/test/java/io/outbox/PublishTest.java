package io.outbox;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertTrue;
import static org.junit.Assume.assumeTrue;

import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.sql.Connection;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.ThreadLocalRandom;
import org.junit.AfterClass;
import org.junit.BeforeClass;
import org.junit.Test;

/**
 * The relay publishes: rows enqueued through JDBC reach SUCCESS. Needs a library built with
 * {@code --features jni,rocketmq} and a RocketMQ name server on {@code $OUTBOX_TEST_NAMESRV}
 * (default 127.0.0.1:9876) with a broker; skipped otherwise.
 */
public class PublishTest {
    private static final String NAMESRV = System.getenv().getOrDefault("OUTBOX_TEST_NAMESRV", "127.0.0.1:9876");
    private static TestDb db;

    @BeforeClass
    public static void setUp() {
        assumeTrue("the native library was built without the rocketmq feature (" + Outbox.features() + "); skipping publish tests",
                Outbox.features().contains("rocketmq"));
        assumeTrue("no RocketMQ name server on " + NAMESRV + "; skipping publish tests", reachable(NAMESRV));
        db = new TestDb();
        Outbox.migrate(db.config());
    }

    @AfterClass
    public static void tearDown() {
        if (db != null) {
            db.close();
        }
    }

    private static boolean reachable(String hostPort) {
        int colon = hostPort.lastIndexOf(':');
        try (Socket s = new Socket()) {
            s.connect(new InetSocketAddress(hostPort.substring(0, colon), Integer.parseInt(hostPort.substring(colon + 1))), 1000);
            return true;
        } catch (IOException | RuntimeException e) {
            return false;
        }
    }

    @Test
    public void committed_events_reach_success_and_rolled_back_ones_never_exist() throws Exception {
        String topic = String.format("OUTBOX_JAVA_%08x", ThreadLocalRandom.current().nextInt());
        OutboxConfig config = new OutboxConfig().set("db.url", db.url()).set("publisher", "rocketmq").set("rocketmq.namesrv", NAMESRV)
                .set("rocketmq.producer.group", topic + "_pg").set("topic", topic).set("scan.interval.ms", 200)
                // Sent rows stay SUCCESS for this test to read (the default deletes them).
                .set("sent.rows", "keep");
        try (Outbox outbox = Outbox.start(config)) {
            assertTrue(outbox.isRelaying());
            long committed;
            long rolledBack;
            try (Connection c = db.connect()) {
                c.setAutoCommit(false);
                committed = outbox.enqueue(c, Event.of("ORD-pub-1", "ORDER_CREATED", "{\"n\":1}"));
                c.commit();
                outbox.notifyCommitted();
                rolledBack = outbox.enqueue(c, Event.of("ORD-pub-2", "ORDER_CREATED", "{\"n\":2}"));
                c.rollback();
            }
            long txEvent;
            try (OutboxTransaction tx = outbox.begin()) {
                txEvent = tx.enqueue(Event.of("ORD-pub-3", "ORDER_PAID", "{\"n\":3}"));
                tx.commit();
            }
            long deadline = System.nanoTime() + Duration.ofSeconds(60).toNanos();
            while (!("SUCCESS".equals(db.status(committed)) && "SUCCESS".equals(db.status(txEvent))) && System.nanoTime() < deadline) {
                Thread.sleep(100);
            }
            assertEquals(outbox.stats().json(), "SUCCESS", db.status(committed));
            assertEquals("SUCCESS", db.status(txEvent));
            assertEquals(null, db.status(rolledBack));
            assertTrue(outbox.stats().sent() >= 2);
            StopReport r = outbox.stop(Duration.ofSeconds(5));
            assertEquals(r.toString(), false, r.timedOut());
        }
    }

    /**
     * A message the broker refuses (larger than its 4 MiB maxMessageSize, though within the
     * relay's payload.max.bytes) ends FAIL after its last attempt, and the Java listener hears of
     * it once, from a relay thread, with the row's fields.
     */
    @Test
    public void a_message_the_broker_refuses_reaches_the_dead_letter_listener_once() throws Exception {
        String topic = String.format("OUTBOX_JAVA_DL_%08x", ThreadLocalRandom.current().nextInt());
        OutboxConfig config = new OutboxConfig().set("db.url", db.url()).set("publisher", "rocketmq").set("rocketmq.namesrv", NAMESRV)
                .set("rocketmq.producer.group", topic + "_pg").set("topic", topic).set("scan.interval.ms", 100)
                .set("send.timeout.ms", 10000).set("payload.max.bytes", 8 * 1024 * 1024).set("max.retry", 0);
        List<DeadLetter> letters = new CopyOnWriteArrayList<>();
        List<String> threads = new CopyOnWriteArrayList<>(); // where the listener ran
        // Incompressible, so the client's body compression cannot bring it under the limit.
        byte[] payload = new byte[5 * 1024 * 1024];
        ThreadLocalRandom.current().nextBytes(payload);
        try (Outbox outbox = Outbox.start(config, letter -> {
            letters.add(letter);
            threads.add(Thread.currentThread().getName());
        })) {
            long id;
            try (Connection c = db.connect()) {
                c.setAutoCommit(false);
                id = outbox.enqueue(c, Event.of("ORD-dl-1", "ORDER_CREATED", payload));
                c.commit();
                outbox.notifyCommitted();
            }
            long deadline = System.nanoTime() + Duration.ofSeconds(60).toNanos();
            while (!("FAIL".equals(db.status(id)) && !letters.isEmpty()) && System.nanoTime() < deadline) {
                Thread.sleep(100);
            }
            assertEquals(outbox.stats().json(), "FAIL", db.status(id));
            outbox.stop(Duration.ofSeconds(10));
            assertEquals(letters.toString(), 1, letters.size());
            DeadLetter d = letters.get(0);
            assertEquals(id, d.id());
            assertEquals("ORD-dl-1", d.bizNo());
            assertEquals("ORDER_CREATED", d.eventType());
            assertEquals(1, d.retryCount());
            assertTrue(d.lastError(), d.lastError() != null && !d.lastError().isEmpty());
            assertTrue(threads.toString(), !threads.get(0).equals(Thread.currentThread().getName()));
        }
    }
}
