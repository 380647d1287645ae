package io.outbox;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertNull;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;
import static org.junit.Assume.assumeTrue;

import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.sql.Connection;
import java.sql.ResultSet;
import java.sql.Statement;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import org.junit.After;
import org.junit.AfterClass;
import org.junit.BeforeClass;
import org.junit.Test;

/**
 * The trace context from a Java host (docs/tracing.md): the registered supplier's current context
 * is added at enqueue on every path, an event's own wins, a malformed one is refused naming the
 * header, and the consumer sees it unchanged as message properties through the broker.
 */
public class TracingTest {
    private static final String NAMESRV = System.getenv().getOrDefault("OUTBOX_TEST_NAMESRV", "127.0.0.1:9876");
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

    @After
    public void noSupplier() {
        OutboxTracing.setContextSupplier(null);
    }

    private static String traceparent() {
        ThreadLocalRandom r = ThreadLocalRandom.current();
        return String.format("00-%016x%016x-%016x-01", r.nextLong() | 1, r.nextLong(), r.nextLong() | 1);
    }

    private static String headersOf(long id) throws Exception {
        try (Connection c = db.connect(); Statement s = c.createStatement();
                ResultSet rs = s.executeQuery("SELECT headers FROM t_event_record WHERE id = " + id)) {
            assertTrue(rs.next());
            return rs.getString(1);
        }
    }

    private static long enqueueJdbc(Event e) throws Exception {
        try (Connection c = db.connect()) {
            c.setAutoCommit(false);
            long id = OutboxEvents.enqueue(c, e);
            c.commit();
            return id;
        }
    }

    @Test
    public void the_supplier_s_context_is_stored_and_an_event_s_own_wins() throws Exception {
        String current = traceparent();
        OutboxTracing.setContextSupplier(() -> OutboxTracing.TraceContext.of(current, "vendor=java"));
        long id = enqueueJdbc(Event.of("ORD-J1", "ORDER_PAID", "{}"));
        String h = headersOf(id);
        assertTrue(h, h.contains("\"traceparent\":\"" + current + "\""));
        assertTrue(h, h.contains("\"tracestate\":\"vendor=java\""));

        String own = traceparent();
        long id2 = enqueueJdbc(Event.of("ORD-J2", "ORDER_PAID", "{}").withHeader("traceparent", own));
        String h2 = headersOf(id2);
        assertTrue(h2, h2.contains(own) && !h2.contains(current));

        // The library-owned transaction's enqueue adds it too.
        try (Outbox relay = Outbox.start(db.config()); OutboxTransaction tx = relay.begin()) {
            long id3 = tx.enqueue(Event.of("ORD-J3", "ORDER_PAID", "{}"));
            tx.commit();
            assertTrue(headersOf(id3).contains(current));
        }

        // No current trace: no header.
        OutboxTracing.setContextSupplier(() -> null);
        assertNull(headersOf(enqueueJdbc(Event.of("ORD-J4", "ORDER_PAID", "{}"))));
    }

    @Test
    public void a_malformed_context_is_refused_naming_the_header_and_a_failing_supplier_is_not_the_event_s_fault() throws Exception {
        OutboxTracing.setContextSupplier(() -> OutboxTracing.TraceContext.of("00-not-a-trace-01", null));
        OutboxInvalidEventException e = assertThrows(OutboxInvalidEventException.class,
                () -> enqueueJdbc(Event.of("ORD-JBAD", "ORDER_PAID", "{}")));
        assertEquals("traceparent", e.field());
        assertTrue(e.getMessage(), e.getMessage().contains("00-not-a-trace-01"));
        OutboxTracing.setContextSupplier(null);
        OutboxInvalidEventException state = assertThrows(OutboxInvalidEventException.class,
                () -> enqueueJdbc(Event.of("ORD-JBAD", "ORDER_PAID", "{}").withHeader("tracestate", "k=v")));
        assertEquals("tracestate", state.field());
        assertEquals(0, db.count("biz_no = 'ORD-JBAD'"));

        OutboxTracing.setContextSupplier(() -> {
            throw new IllegalStateException("no tracer");
        });
        assertNull(headersOf(enqueueJdbc(Event.of("ORD-J5", "ORDER_PAID", "{}"))));
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
    public void the_consumer_sees_the_order_service_s_context_through_the_broker() throws Exception {
        assumeTrue("the native library was built without rocketmq", Outbox.features().contains("rocketmq"));
        assumeTrue("no RocketMQ name server on " + NAMESRV, reachable(NAMESRV));
        String topic = String.format("OUTBOX_JT_%08x", ThreadLocalRandom.current().nextInt());
        String current = traceparent();
        OutboxTracing.setContextSupplier(() -> OutboxTracing.TraceContext.of(current, null));
        ConcurrentHashMap<String, String> seen = new ConcurrentHashMap<>();
        try (Outbox relay = Outbox.start(new OutboxConfig().set("db.url", db.url()).set("publisher", "rocketmq")
                .set("rocketmq.namesrv", NAMESRV).set("topic", topic).set("scan.interval.ms", 100));
                OutboxConsumer consumer = OutboxConsumer.start(new OutboxConfig().set("db.url", db.url())
                        .set("rocketmq.namesrv", NAMESRV), topic, topic + "_points", (tx, m) -> {
                            seen.put(m.property("bizNo"), m.property("traceparent"));
                            assertTrue(m.property("eventCreatedAt") != null);
                        })) {
            try (Connection c = db.connect()) {
                c.setAutoCommit(false);
                relay.enqueue(c, Event.of("ORD-JT", "ORDER_PAID", "{}"));
                c.commit();
            }
            relay.notifyCommitted();
            long until = System.nanoTime() + TimeUnit.SECONDS.toNanos(120);
            while (!seen.containsKey("ORD-JT") && System.nanoTime() < until) {
                Thread.sleep(50); // polling for the consumer's handler, not standing in for a result
            }
        }
        assertEquals(current, seen.get("ORD-JT"));
    }
}
