package io.outbox;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertNull;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import org.junit.AfterClass;
import org.junit.BeforeClass;
import org.junit.Test;

/** Enqueue with the host's own JDBC connection: the row joins the host's transaction. */
public class EnqueueJdbcTest {
    private static TestDb db;

    @BeforeClass
    public static void setUp() {
        db = new TestDb();
        MigrationReport r = Outbox.migrate(db.config());
        assertTrue(r.toString(), r.current() >= 2);
    }

    @AfterClass
    public static void tearDown() {
        if (db != null) {
            db.close();
        }
    }

    @Test
    public void committed_transaction_keeps_the_row_as_the_library_writes_it() throws Exception {
        long id;
        try (Connection c = db.connect()) {
            c.setAutoCommit(false);
            try (Statement s = c.createStatement()) {
                s.execute("CREATE TABLE IF NOT EXISTS orders (order_no VARCHAR(64) PRIMARY KEY)");
                s.execute("INSERT INTO orders VALUES ('ORD-commit')");
            }
            id = OutboxEvents.enqueue(c, Event.of("ORD-commit", "ORDER_CREATED", "{\"amount\":1}").withTopic("T_ORDERS")
                    .withHeader("source", "test").withHeader("a", "\"quoted\""));
            assertTrue(id > 0);
            c.commit();
        }
        try (Connection c = db.connect(); Statement s = c.createStatement();
                ResultSet rs = s.executeQuery("SELECT biz_no, event_type, payload, topic, tag, headers, status, retry_count FROM t_event_record WHERE id = " + id)) {
            assertTrue(rs.next());
            assertEquals("ORD-commit", rs.getString(1));
            assertEquals("ORDER_CREATED", rs.getString(2));
            assertArrayEquals("{\"amount\":1}".getBytes(StandardCharsets.UTF_8), rs.getBytes(3));
            assertEquals("T_ORDERS", rs.getString(4));
            assertNull(rs.getString(5));
            assertEquals("{\"a\":\"\\\"quoted\\\"\",\"source\":\"test\"}", rs.getString(6));
            assertEquals("WAIT", rs.getString(7));
            assertEquals(0, rs.getInt(8));
        }
    }

    @Test
    public void rolled_back_transaction_leaves_no_row() throws Exception {
        long id;
        try (Connection c = db.connect()) {
            c.setAutoCommit(false);
            id = OutboxEvents.enqueue(c, Event.of("ORD-rollback", "ORDER_CREATED", "{}"));
            // Visible inside the transaction...
            try (Statement s = c.createStatement(); ResultSet rs = s.executeQuery("SELECT COUNT(*) FROM t_event_record WHERE id = " + id)) {
                rs.next();
                assertEquals(1, rs.getLong(1));
            }
            c.rollback();
        }
        // ...and gone after the rollback.
        assertEquals(0, db.count("id = " + id));
        assertEquals(0, db.count("biz_no = 'ORD-rollback'"));
    }

    @Test
    public void autocommit_connection_is_refused_and_inserts_nothing() throws Exception {
        try (Connection c = db.connect()) {
            IllegalStateException e = assertThrows(IllegalStateException.class,
                    () -> OutboxEvents.enqueue(c, Event.of("ORD-auto", "ORDER_PAID", new byte[] {1, 2, 3})));
            assertTrue(e.getMessage(), e.getMessage().contains("setAutoCommit(false)"));
        }
        assertEquals(0, db.count("biz_no = 'ORD-auto'"));
    }

    @Test
    public void empty_payload_throws_the_event_exception_naming_payload() throws Exception {
        try (Connection c = db.connect()) {
            OutboxInvalidEventException e = assertThrows(OutboxInvalidEventException.class,
                    () -> OutboxEvents.enqueue(c, Event.of("ORD-x", "ORDER_CREATED", new byte[0])));
            assertEquals("payload", e.field());
            assertTrue(e.getMessage(), e.getMessage().contains("payload"));
            OutboxInvalidEventException n = assertThrows(OutboxInvalidEventException.class,
                    () -> OutboxEvents.enqueue(c, Event.of("ORD-x", "ORDER_CREATED", (byte[]) null)));
            assertEquals("payload", n.field());
        }
        assertEquals(0, db.count("biz_no = 'ORD-x'"));
    }

    @Test
    public void blank_biz_no_throws_the_event_exception_naming_biz_no() throws Exception {
        try (Connection c = db.connect()) {
            OutboxInvalidEventException e = assertThrows(OutboxInvalidEventException.class,
                    () -> OutboxEvents.enqueue(c, Event.of("   ", "ORDER_CREATED", "{}")));
            assertEquals("biz_no", e.field());
            assertTrue(e.getMessage(), e.getMessage().contains("biz_no"));
            assertEquals("event_type", assertThrows(OutboxInvalidEventException.class,
                    () -> OutboxEvents.enqueue(c, Event.of("ORD-y", null, "{}"))).field());
            assertEquals("topic", assertThrows(OutboxInvalidEventException.class,
                    () -> OutboxEvents.enqueue(c, Event.of("ORD-y", "T", "{}").withTopic("bad topic"))).field());
            assertEquals("headers", assertThrows(OutboxInvalidEventException.class,
                    () -> OutboxEvents.enqueue(c, Event.of("ORD-y", "T", "{}").withHeader("KEYS", "x"))).field());
        }
    }

    @Test
    public void payload_over_the_relay_limit_is_refused_by_the_relay_path() throws Exception {
        try (Outbox outbox = Outbox.start(db.config().set("payload.max.bytes", 8)); Connection c = db.connect()) {
            c.setAutoCommit(false);
            OutboxInvalidEventException e = assertThrows(OutboxInvalidEventException.class,
                    () -> outbox.enqueue(c, Event.of("ORD-big", "T", "123456789")));
            assertEquals("payload", e.field());
            assertTrue(e.getMessage(), e.getMessage().contains("payload.max.bytes = 8"));
            assertTrue(outbox.enqueue(c, Event.of("ORD-small", "T", "12345678")) > 0);
            c.commit();
        }
    }

    @Test
    public void database_error_from_the_host_driver_is_a_database_exception() throws Exception {
        try (Connection c = db.connect()) {
            c.setAutoCommit(false);
            OutboxDatabaseException e = assertThrows(OutboxDatabaseException.class,
                    () -> OutboxEvents.enqueue(c, "no_such_table", Event.of("ORD-z", "T", "{}")));
            assertEquals(1146, e.errorCode());
            assertTrue(e.getCause() instanceof SQLException);
        }
    }

    @Test
    public void eight_threads_enqueue_concurrently_each_in_its_own_transaction() throws Exception {
        int threads = 8;
        int perThread = 25;
        ExecutorService pool = Executors.newFixedThreadPool(threads);
        CountDownLatch go = new CountDownLatch(1);
        List<Future<List<Long>>> futures = new ArrayList<>();
        for (int t = 0; t < threads; t++) {
            int thread = t;
            futures.add(pool.submit(() -> {
                List<Long> ids = new ArrayList<>();
                go.await();
                try (Connection c = db.connect()) {
                    c.setAutoCommit(false);
                    for (int i = 0; i < perThread; i++) {
                        ids.add(OutboxEvents.enqueue(c, Event.of("ORD-conc-" + thread + "-" + i, "ORDER_CREATED", "{\"i\":" + i + "}")));
                        if (i % 5 == 4) {
                            c.commit();
                        }
                    }
                    c.commit();
                }
                return ids;
            }));
        }
        go.countDown();
        Set<Long> all = new HashSet<>();
        for (Future<List<Long>> f : futures) {
            all.addAll(f.get(60, TimeUnit.SECONDS));
        }
        pool.shutdown();
        assertEquals(threads * perThread, all.size());
        assertEquals(threads * perThread, db.count("biz_no LIKE 'ORD-conc-%'"));
    }

    @Test
    public void insert_statement_and_parameters_come_from_the_library() {
        String sql = OutboxEvents.insertStatement("orders_outbox");
        assertTrue(sql, sql.startsWith("INSERT INTO orders_outbox "));
        String[] params = OutboxEvents.insertParameters();
        assertEquals("biz_no", params[0]);
        long marks = sql.chars().filter(ch -> ch == '?').count();
        assertEquals(params.length, marks);
        // A scheduled event's INSERT: the same parameters, then the schedule's two.
        String scheduled = OutboxEvents.insertScheduledStatement("orders_outbox");
        String[] all = OutboxEvents.insertScheduledParameters();
        assertEquals(params.length + 2, all.length);
        assertEquals("deliver_at_ms", all[params.length]);
        assertEquals("delay_ms", all[params.length + 1]);
        assertEquals(all.length, scheduled.chars().filter(ch -> ch == '?').count());
        assertTrue(scheduled, scheduled.contains("next_retry_time") && !sql.contains("next_retry_time"));
    }
}
