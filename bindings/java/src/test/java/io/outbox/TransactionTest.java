package io.outbox;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;
import static org.junit.Assert.fail;

import java.math.BigDecimal;
import java.time.Duration;
import java.time.LocalDateTime;
import java.util.OptionalLong;
import org.junit.AfterClass;
import org.junit.BeforeClass;
import org.junit.Test;

/** The library-owned transaction path: business SQL and events through one library transaction. */
public class TransactionTest {
    private static TestDb db;
    private static Outbox outbox;

    @BeforeClass
    public static void setUp() throws Exception {
        db = new TestDb();
        Outbox.migrate(db.config());
        outbox = Outbox.start(db.config());
        try (OutboxTransaction tx = outbox.begin()) {
            tx.execute("CREATE TABLE orders (id BIGINT AUTO_INCREMENT PRIMARY KEY, order_no VARCHAR(64) NOT NULL UNIQUE, "
                    + "amount DECIMAL(10,2), paid BOOLEAN, created DATETIME(6), note BLOB)");
        }
    }

    @AfterClass
    public static void tearDown() {
        if (outbox != null) {
            outbox.close();
        }
        if (db != null) {
            db.close();
        }
    }

    @Test
    public void commit_keeps_business_row_and_event() throws Exception {
        long eventId;
        try (OutboxTransaction tx = outbox.begin()) {
            long n = tx.execute("INSERT INTO orders (order_no, amount, paid, created, note) VALUES (?, ?, ?, ?, ?)", "ORD-tx-1",
                    new BigDecimal("9.90"), true, LocalDateTime.of(2024, 1, 2, 3, 4, 5, 6000), new byte[] {0, 1});
            assertEquals(1, n);
            assertTrue(tx.lastInsertId() > 0);
            eventId = tx.enqueue(Event.of("ORD-tx-1", "ORDER_CREATED", "{}"));
            assertEquals(OptionalLong.of(1), tx.queryLong("SELECT COUNT(*) FROM t_event_record WHERE id = ?", eventId));
            tx.commit();
            assertFalse(tx.isOpen());
        }
        assertEquals("WAIT", db.status(eventId));
        try (OutboxTransaction tx = outbox.begin()) {
            assertEquals(OptionalLong.of(990), tx.queryLong("SELECT amount * 100 FROM orders WHERE order_no = ?", "ORD-tx-1"));
            assertEquals(OptionalLong.of(1), tx.queryLong("SELECT paid FROM orders WHERE order_no = ?", "ORD-tx-1"));
            assertEquals(OptionalLong.of(2024), tx.queryLong("SELECT YEAR(created) FROM orders WHERE order_no = ?", "ORD-tx-1"));
            assertEquals(OptionalLong.empty(), tx.queryLong("SELECT amount FROM orders WHERE order_no = ?", "none"));
        }
    }

    @Test
    public void close_without_commit_rolls_back() throws Exception {
        long eventId;
        try (OutboxTransaction tx = outbox.begin()) {
            tx.execute("INSERT INTO orders (order_no) VALUES (?)", "ORD-tx-2");
            eventId = tx.enqueue(Event.of("ORD-tx-2", "ORDER_CREATED", "{}"));
        }
        assertEquals(0, db.count("id = " + eventId));
        try (OutboxTransaction tx = outbox.begin()) {
            assertEquals(OptionalLong.of(0), tx.queryLong("SELECT COUNT(*) FROM orders WHERE order_no = ?", "ORD-tx-2"));
        }
    }

    @Test
    public void explicit_rollback_and_use_after_finish() {
        OutboxTransaction tx = outbox.begin();
        tx.enqueue(Event.of("ORD-tx-3", "ORDER_CREATED", "{}"));
        tx.rollback();
        tx.rollback();
        tx.close();
        assertThrows(IllegalStateException.class, () -> tx.enqueue(Event.of("ORD-tx-3", "T", "{}")));
        assertThrows(IllegalStateException.class, tx::commit);
        assertThrows(IllegalStateException.class, () -> tx.execute("SELECT 1"));
    }

    @Test
    public void sql_error_is_a_database_exception_with_the_server_code() {
        try (OutboxTransaction tx = outbox.begin()) {
            tx.execute("INSERT INTO orders (order_no) VALUES (?)", "ORD-dup");
            OutboxDatabaseException e = assertThrows(OutboxDatabaseException.class,
                    () -> tx.execute("INSERT INTO orders (order_no) VALUES (?)", "ORD-dup"));
            assertEquals(1062, e.errorCode());
            assertFalse(e.isRetriable());
            assertEquals(1064, assertThrows(OutboxDatabaseException.class, () -> tx.execute("SELEC nonsense")).errorCode());
        }
    }

    @Test
    public void invalid_event_in_a_library_transaction_names_the_field() {
        try (OutboxTransaction tx = outbox.begin()) {
            assertEquals("biz_no", assertThrows(OutboxInvalidEventException.class, () -> tx.enqueue(Event.of("", "T", "{}"))).field());
            assertEquals("payload", assertThrows(OutboxInvalidEventException.class, () -> tx.enqueue(Event.of("B", "T", ""))).field());
        }
    }

    @Test
    public void unsupported_parameter_type_is_an_illegal_argument() {
        try (OutboxTransaction tx = outbox.begin()) {
            IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> tx.execute("SELECT ?", new Object()));
            assertTrue(e.getMessage(), e.getMessage().contains("parameter 1"));
        }
    }

    @Test
    public void transaction_outlives_a_closed_relay_safely() throws Exception {
        Outbox other = Outbox.start(db.config());
        OutboxTransaction tx = other.begin();
        long id = tx.enqueue(Event.of("ORD-tx-late", "ORDER_CREATED", "{}"));
        other.close();
        assertThrows(OutboxStoppedException.class, other::begin);
        tx.commit(); // the transaction keeps its own reference: no use after free
        assertEquals("WAIT", db.status(id));
    }

    @Test
    public void cleaner_rolls_back_an_abandoned_transaction() throws Exception {
        long before = Native.liveHandles()[1];
        abandon();
        long deadline = System.nanoTime() + Duration.ofSeconds(30).toNanos();
        while (Native.liveHandles()[1] > before) {
            if (System.nanoTime() > deadline) {
                fail("the Cleaner did not roll back the abandoned transaction");
            }
            System.gc();
            Thread.sleep(50);
        }
        assertEquals(0, db.count("biz_no = 'ORD-abandoned'"));
    }

    private static void abandon() {
        outbox.begin().enqueue(Event.of("ORD-abandoned", "ORDER_CREATED", "{}"));
    }
}
