package io.outbox;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertTrue;
import static org.junit.Assume.assumeTrue;

import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.sql.Connection;
import java.time.Duration;
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
                .set("rocketmq.producer.group", topic + "_pg").set("topic", topic).set("scan.interval.ms", 200);
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
}
