package io.outbox;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import java.sql.Connection;
import org.junit.AfterClass;
import org.junit.BeforeClass;
import org.junit.Test;

/** Misuse a service can make, refused clearly; error messages written for people. */
public class HostErgonomicsTest {
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
    public void enqueue_on_an_autocommit_connection_is_refused_and_inserts_nothing() throws Exception {
        long before = db.count("");
        try (Outbox outbox = Outbox.start(db.config()); Connection conn = db.connect()) {
            assertTrue(conn.getAutoCommit());
            IllegalStateException e = assertThrows(IllegalStateException.class,
                    () -> outbox.enqueue(conn, Event.of("ORD-AC", "ORDER_CREATED", "{}")));
            assertTrue(e.getMessage(), e.getMessage().contains("autocommit"));
            assertThrows(IllegalStateException.class, () -> OutboxEvents.enqueue(conn, Event.of("ORD-AC", "ORDER_CREATED", "{}")));
        }
        assertEquals(before, db.count(""));
    }

    @Test
    public void notify_after_close_is_harmless() throws Exception {
        Outbox outbox = Outbox.start(db.config());
        try (Connection conn = db.connect()) {
            conn.setAutoCommit(false);
            outbox.enqueue(conn, Event.of("ORD-N", "ORDER_CREATED", "{}"));
            outbox.close();
            conn.commit();
        }
        outbox.notifyCommitted(); // the order committed: no exception for it
        outbox.notifyCommitted();
        assertEquals(1, db.count("biz_no = 'ORD-N'"));
    }

    @Test
    public void unpaired_surrogates_are_refused_like_nul() throws Exception {
        try (Outbox outbox = Outbox.start(db.config()); Connection conn = db.connect()) {
            conn.setAutoCommit(false);
            OutboxInvalidEventException e = assertThrows(OutboxInvalidEventException.class,
                    () -> outbox.enqueue(conn, Event.of("ORD-\uD800", "ORDER_CREATED", "{}")));
            assertEquals("biz_no", e.field());
            assertTrue(e.getMessage(), e.getMessage().contains("surrogate"));
            e = assertThrows(OutboxInvalidEventException.class,
                    () -> outbox.enqueue(conn, Event.of("ORD-1", "ORDER_CREATED", "{}").withHeader("k", "v\uDC00")));
            assertEquals("headers", e.field());
            e = assertThrows(OutboxInvalidEventException.class, () -> Event.of("ORD-1", "T", "{\"x\":\"\uD83D\"}"));
            assertEquals("payload", e.field());
            // A proper pair (an emoji) is fine.
            long id = outbox.enqueue(conn, Event.of("ORD-\uD83D\uDE00", "ORDER_CREATED", "{}"));
            assertTrue(id > 0);
            try (OutboxTransaction tx = outbox.begin()) {
                assertThrows(OutboxInvalidEventException.class, () -> tx.enqueue(Event.of("ORD-\uDBFF", "T", "{}")));
            }
            conn.rollback();
        }
    }

    @Test
    public void begin_waits_for_the_pool_boundedly() {
        try (Outbox outbox = Outbox.start(db.config().set("db.pool.max", 1).set("db.pool.wait.ms", 200));
                OutboxTransaction held = outbox.begin()) {
            OutboxDatabaseException e = assertThrows(OutboxDatabaseException.class, outbox::begin);
            assertTrue(e.getMessage(), e.getMessage().contains("db.pool.max"));
            assertTrue(e.isRetriable());
            held.rollback();
            try (OutboxTransaction again = outbox.begin()) {
                again.rollback();
            }
        }
    }

    @Test
    public void access_denied_is_not_retriable_and_reads_as_words() {
        OutboxConfig c = new OutboxConfig().set("db.url", db.url().replace("mysql://root", "mysql://outbox_nobody:wrong"))
                .set("publisher", "none");
        OutboxDatabaseException e = assertThrows(OutboxDatabaseException.class, () -> Outbox.start(c));
        assertEquals(1045, e.errorCode());
        assertFalse(e.getMessage(), e.isRetriable());
        assertTrue(e.getMessage(), e.getMessage().contains("access denied"));
        assertFalse(e.getMessage(), e.getMessage().contains("MySqlError"));
    }

    @Test
    public void unknown_database_is_not_retriable() {
        OutboxConfig c = new OutboxConfig().set("db.url", db.url() + "_missing").set("publisher", "none");
        OutboxDatabaseException e = assertThrows(OutboxDatabaseException.class, () -> Outbox.start(c));
        assertEquals(1049, e.errorCode());
        assertFalse(e.getMessage(), e.isRetriable());
        assertTrue(e.getMessage(), e.getMessage().contains("unknown database"));
    }

    @Test
    public void a_bad_url_reads_as_words() {
        OutboxConfigException e = assertThrows(OutboxConfigException.class,
                () -> new OutboxConfig().set("db.url", "mysql://root@127.0.0.1:99999/x"));
        assertFalse(e.getMessage(), e.getMessage().contains("ParseError {"));
        assertTrue(e.getMessage(), e.getMessage().contains("port"));
    }

    @Test
    public void shard_keys_are_checked_and_a_relay_given_shards_points_to_the_fleet() {
        OutboxConfigException bad = assertThrows(OutboxConfigException.class,
                () -> new OutboxConfig().set("shards", "mysql://u:pw1@h/o_{3..1}"));
        assertTrue(bad.getMessage(), bad.getMessage().contains("shards") && bad.getMessage().contains("runs backwards"));
        assertFalse(bad.getMessage(), bad.getMessage().contains("pw1"));
        String listed = new OutboxConfig().set("shards", "mysql://a:pw1@h/x, mysql://b:pw2@h/y_{0..1}").toString();
        assertFalse(listed, listed.contains("pw1") || listed.contains("pw2"));
        assertTrue(listed, listed.contains("mysql://a:***@h/x") && listed.contains("mysql://b:***@h/y_{0..1}"));
        // Relays splitting a fleet: the coordination URL checked and masked like db.url, the lease bounded.
        OutboxConfigException coord = assertThrows(OutboxConfigException.class,
                () -> new OutboxConfig().set("shard.coordination.url", "mysql://u:pw9@h:port/x"));
        assertTrue(coord.getMessage(), coord.getMessage().contains("shard.coordination.url"));
        assertFalse(coord.getMessage(), coord.getMessage().contains("pw9"));
        String shown = new OutboxConfig().set("shard.coordination.url", "mysql://u:pw9@h:3306/x").toString();
        assertFalse(shown, shown.contains("pw9"));
        OutboxConfigException lease = assertThrows(OutboxConfigException.class,
                () -> new OutboxConfig().set("shard.lease.ms", "999"));
        assertTrue(lease.getMessage(), lease.getMessage().contains("shard.lease.ms"));
        OutboxConfigException reload = assertThrows(OutboxConfigException.class,
                () -> new OutboxConfig().set("shard.catalog.reload.ms", "999"));
        assertTrue(reload.getMessage(), reload.getMessage().contains("shard.catalog.reload.ms"));
        OutboxConfig c = db.config().set("shard.workers", "2").set("shards", "mysql://root@127.0.0.1:3306/o_{0..3}");
        OutboxConfigException e = assertThrows(OutboxConfigException.class, () -> Outbox.start(c));
        assertTrue(e.getMessage(), e.getMessage().contains("shards") && e.getMessage().contains("fleet"));
    }

    @Test
    public void latency_is_in_the_stats_before_any_delivery() {
        try (Outbox outbox = Outbox.start(db.config())) {
            OutboxStats.Latency l = outbox.stats().latency();
            assertEquals(0, l.count());
            assertEquals(0, l.p99Millis());
            assertTrue(outbox.counters().json(), outbox.counters().json().contains("\"latency\""));
        }
    }
}
