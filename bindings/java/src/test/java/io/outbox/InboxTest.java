package io.outbox;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertNull;
import static org.junit.Assert.assertSame;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.SQLIntegrityConstraintViolationException;
import java.sql.Statement;
import java.util.Collections;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.AfterClass;
import org.junit.BeforeClass;
import org.junit.Test;
import org.junit.function.ThrowingRunnable;

/** The consumer inbox on the host's JDBC connection: once per (group, key), claim first. */
public class InboxTest {
    private static final String GROUP = "points-service";
    /** How long a test waits for a connection to block on a lock, or for a blocked call to return. */
    private static final long DEADLINE_MS = 30_000;

    private static TestDb db;
    private static final OutboxInbox INBOX = OutboxInbox.DEFAULT;

    @BeforeClass
    public static void setUp() throws SQLException {
        db = new TestDb();
        MigrationReport r = Outbox.migrate(db.config());
        assertTrue(r.toString(), r.current() >= 8);
        try (Connection c = db.connect(); Statement s = c.createStatement()) {
            s.execute("CREATE TABLE points (user_id VARCHAR(64) PRIMARY KEY, balance BIGINT NOT NULL)");
        }
    }

    @AfterClass
    public static void tearDown() {
        if (db != null) {
            db.close();
        }
    }

    /** The business effect: credits {@code amount} points to {@code user} through {@code c}. */
    private static void credit(Connection c, String user, long amount) throws SQLException {
        try (PreparedStatement ps = c.prepareStatement(
                "INSERT INTO points (user_id, balance) VALUES (?, ?) ON DUPLICATE KEY UPDATE balance = balance + VALUES(balance)")) {
            ps.setString(1, user);
            ps.setLong(2, amount);
            ps.executeUpdate();
        }
    }

    /** {@code user}'s committed balance, {@code null} if never credited. */
    private static Long balance(String user) throws SQLException {
        try (Connection c = db.connect(); PreparedStatement ps = c.prepareStatement("SELECT balance FROM points WHERE user_id = ?")) {
            ps.setString(1, user);
            try (ResultSet rs = ps.executeQuery()) {
                return rs.next() ? rs.getLong(1) : null;
            }
        }
    }

    /** Committed marks of {@code key} in {@code table} (any group). */
    private static long marks(String table, String key) throws SQLException {
        try (Connection c = db.connect();
                PreparedStatement ps = c.prepareStatement("SELECT COUNT(*) FROM " + table + " WHERE event_key = ?")) {
            ps.setBytes(1, key.getBytes(StandardCharsets.UTF_8));
            try (ResultSet rs = ps.executeQuery()) {
                rs.next();
                return rs.getLong(1);
            }
        }
    }

    private static long allMarks() throws SQLException {
        try (Connection c = db.connect(); Statement s = c.createStatement();
                ResultSet rs = s.executeQuery("SELECT COUNT(*) FROM outbox_inbox")) {
            rs.next();
            return rs.getLong(1);
        }
    }

    private static Connection transaction() throws SQLException {
        Connection c = db.connect();
        c.setAutoCommit(false);
        return c;
    }

    private static long connectionId(Connection c) throws SQLException {
        try (Statement s = c.createStatement(); ResultSet rs = s.executeQuery("SELECT CONNECTION_ID()")) {
            rs.next();
            return rs.getLong(1);
        }
    }

    /**
     * Waits until connection {@code id} waits for a row lock while running an INSERT into the
     * inbox, up to {@link #DEADLINE_MS}; returns whether it did. The wait is read from the
     * TRANSACTIONS section of {@code SHOW ENGINE INNODB STATUS} (a transaction with a
     * {@code LOCK WAIT} line and the connection's thread id), which is live; the statement from
     * {@code information_schema.PROCESSLIST}. ({@code information_schema.INNODB_TRX} shows a
     * snapshot that InnoDB refreshes only once nobody has read it for 100 ms, so while anyone polls
     * it, it can keep showing the state before the wait began.) Returns {@code false} at once if
     * {@code call} ends first, i.e. without having waited.
     */
    private static boolean waitsForRowLock(long id, Future<?> call) throws Exception {
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(DEADLINE_MS);
        try (Connection c = db.connect(); Statement s = c.createStatement();
                PreparedStatement info = c.prepareStatement("SELECT INFO FROM information_schema.PROCESSLIST WHERE ID = ?")) {
            info.setLong(1, id);
            while (System.nanoTime() < deadline && !call.isDone()) {
                boolean lockWait = false;
                try (ResultSet rs = s.executeQuery("SHOW ENGINE INNODB STATUS")) {
                    rs.next();
                    for (String trx : rs.getString("Status").split("\n---TRANSACTION ")) {
                        if (trx.contains("\nLOCK WAIT ") && trx.contains(" thread id " + id + ",")) {
                            lockWait = true;
                        }
                    }
                }
                if (lockWait) {
                    try (ResultSet rs = info.executeQuery()) {
                        String sql = rs.next() ? rs.getString(1) : null;
                        if (sql != null && sql.startsWith("INSERT INTO " + OutboxInbox.DEFAULT_TABLE + " ")) {
                            return true;
                        }
                    }
                }
                Thread.sleep(10);
            }
        }
        return false;
    }

    @Test
    public void a_new_key_runs_the_handler_once_and_commits_with_it_then_a_second_copy_is_a_duplicate() throws Exception {
        AtomicInteger runs = new AtomicInteger();
        InboxMessage meta = InboxMessage.of("ORDER_EVENT_TOPIC", 3, 1234L, "7F0000010001");
        try (Connection c = transaction()) {
            InboxResult<String> r = INBOX.process(c, GROUP, "orders:ORD-1", meta, conn -> {
                runs.incrementAndGet();
                credit(conn, "alice", 10);
                return "credited";
            });
            assertFalse(r.isDuplicate());
            assertEquals("credited", r.value());
            assertTrue("the mark is visible in its own transaction", INBOX.isProcessed(c, GROUP, "orders:ORD-1"));
            // Not committed yet: neither the mark nor the credit is visible to others.
            assertEquals(0, marks("outbox_inbox", "orders:ORD-1"));
            assertNull(balance("alice"));
            c.commit();
        }
        assertEquals(1, runs.get());
        assertEquals(Long.valueOf(10), balance("alice"));
        try (Connection c = db.connect(); Statement s = c.createStatement();
                ResultSet rs = s.executeQuery("SELECT consumer_group, event_key, topic, queue_id, queue_offset, msg_id, "
                        + "TIMESTAMPDIFF(SECOND, processed_at, NOW(3)) FROM outbox_inbox WHERE event_key = 'orders:ORD-1'")) {
            assertTrue(rs.next());
            assertEquals(GROUP, rs.getString(1));
            assertArrayEquals("orders:ORD-1".getBytes(StandardCharsets.UTF_8), rs.getBytes(2));
            assertEquals("ORDER_EVENT_TOPIC", rs.getString(3));
            assertEquals(3, rs.getInt(4));
            assertEquals(1234L, rs.getLong(5));
            assertEquals("7F0000010001", rs.getString(6));
            assertTrue(rs.getLong(7) >= 0 && rs.getLong(7) < 60);
            assertFalse(rs.next());
        }

        // A second copy after the commit: a duplicate, the handler does not run, and the
        // transaction stays usable for other work that commits.
        try (Connection c = transaction()) {
            InboxResult<String> r = INBOX.process(c, GROUP, "orders:ORD-1", meta, conn -> {
                runs.incrementAndGet();
                credit(conn, "alice", 10);
                return "credited";
            });
            assertTrue(r.isDuplicate());
            assertNull(r.value());
            assertEquals("Duplicate", r.toString());
            credit(c, "alice-audit", 1);
            c.commit();
        }
        assertEquals(1, runs.get());
        assertEquals(Long.valueOf(10), balance("alice"));
        assertEquals(Long.valueOf(1), balance("alice-audit"));
        assertEquals(1, marks("outbox_inbox", "orders:ORD-1"));

        try (Connection c = transaction()) {
            // mark alone: false for the committed key; keys are exact and per group.
            assertFalse(INBOX.mark(c, GROUP, "orders:ORD-1"));
            assertTrue(INBOX.mark(c, GROUP, "orders:ORD-1 "));
            assertTrue(INBOX.mark(c, GROUP, "ORDERS:ORD-1"));
            assertTrue(INBOX.mark(c, "mail-service", "orders:ORD-1"));
            // The same key twice in one transaction: the second finds the first's mark.
            assertEquals(InboxResult.processed(7), INBOX.process(c, GROUP, "orders:ORD-2", conn -> 7));
            assertTrue(INBOX.process(c, GROUP, "orders:ORD-2", conn -> {
                runs.incrementAndGet();
                return 8;
            }).isDuplicate());
            c.commit();
        }
        assertEquals(1, runs.get());
        try (Connection c = db.connect()) {
            // The pre-check works in autocommit mode.
            assertTrue(INBOX.isProcessed(c, GROUP, "orders:ORD-1"));
            assertTrue(INBOX.isProcessed(c, "mail-service", "orders:ORD-1"));
            assertFalse(INBOX.isProcessed(c, "mail-service", "orders:ORD-2"));
            assertFalse(INBOX.isProcessed(c, GROUP, "orders:ORD-404"));
        }
    }

    /**
     * Two copies at once: A marks the key and holds its transaction open; B's process on another
     * connection and thread waits on A's mark (seen as a lock wait in InnoDB's status); then A ends.
     * Returns B's result; {@code runs} counts the handlers that ran.
     */
    private static InboxResult<String> secondCopyWhileTheFirstIsOpen(String key, String user, boolean firstCommits, AtomicInteger runs)
            throws Exception {
        ExecutorService second = Executors.newSingleThreadExecutor();
        try (Connection b = transaction(); Connection a = transaction()) { // a closes first: a failure never leaves b blocked
            InboxResult<String> first = INBOX.process(a, GROUP, key, null, conn -> {
                runs.incrementAndGet();
                credit(conn, user, 5);
                return "A";
            });
            assertEquals("A", first.value());
            long bId = connectionId(b);
            Future<InboxResult<String>> bResult = second.submit(() -> {
                InboxResult<String> r = INBOX.process(b, GROUP, key, null, conn -> {
                    runs.incrementAndGet();
                    credit(conn, user, 7);
                    return "B";
                });
                b.commit();
                return r;
            });
            assertTrue("the second copy never waited on the first one's mark", waitsForRowLock(bId, bResult));
            assertFalse(bResult.isDone());
            if (firstCommits) {
                a.commit();
            } else {
                a.rollback();
            }
            // No exception (a deadlock or lock wait timeout would come out of get as its cause).
            return bResult.get(DEADLINE_MS, TimeUnit.MILLISECONDS);
        } finally {
            second.shutdownNow();
        }
    }

    @Test
    public void two_copies_at_once_the_second_waits_for_the_first_and_is_a_duplicate_when_it_commits() throws Exception {
        AtomicInteger runs = new AtomicInteger();
        InboxResult<String> b = secondCopyWhileTheFirstIsOpen("orders:ORD-7", "bob", true, runs);
        assertTrue(b.toString(), b.isDuplicate());
        assertEquals("the handler ran once", 1, runs.get());
        assertEquals(Long.valueOf(5), balance("bob"));
        assertEquals(1, marks("outbox_inbox", "orders:ORD-7"));
    }

    @Test
    public void two_copies_at_once_the_waiting_one_runs_its_handler_when_the_first_rolls_back() throws Exception {
        AtomicInteger runs = new AtomicInteger();
        InboxResult<String> b = secondCopyWhileTheFirstIsOpen("orders:ORD-8", "dora", false, runs);
        assertFalse(b.toString(), b.isDuplicate());
        assertEquals("B", b.value());
        assertEquals("A's run was rolled back, B's committed", 2, runs.get());
        assertEquals("only B's credit is committed", Long.valueOf(7), balance("dora"));
        assertEquals(1, marks("outbox_inbox", "orders:ORD-8"));
    }

    static final class CreditRefused extends Exception {
        private static final long serialVersionUID = 1L;

        CreditRefused(String message) {
            super(message);
        }
    }

    @Test
    public void a_handler_exception_propagates_and_the_rollback_unmarks_the_key() throws Exception {
        AtomicInteger runs = new AtomicInteger();
        CreditRefused refused = new CreditRefused("account frozen");
        try (Connection c = transaction()) {
            CreditRefused thrown = assertThrows(CreditRefused.class, () -> INBOX.process(c, GROUP, "orders:ORD-9", null, conn -> {
                runs.incrementAndGet();
                credit(conn, "carol", 3);
                throw refused;
            }));
            assertSame("the handler's own exception, unwrapped", refused, thrown);
            assertTrue("the mark stays in the transaction", INBOX.isProcessed(c, GROUP, "orders:ORD-9"));
            c.rollback();
        }
        try (Connection c = transaction()) {
            IllegalArgumentException bad = new IllegalArgumentException("no such user");
            assertSame(bad, assertThrows(IllegalArgumentException.class, () -> INBOX.process(c, GROUP, "orders:ORD-9", conn -> {
                runs.incrementAndGet();
                throw bad;
            })));
            c.rollback();
        }
        assertEquals(2, runs.get());
        assertEquals("rolled back: not marked", 0, marks("outbox_inbox", "orders:ORD-9"));
        assertNull("rolled back: not credited", balance("carol"));
        try (Connection c = transaction()) {
            InboxResult<Integer> r = INBOX.process(c, GROUP, "orders:ORD-9", conn -> {
                runs.incrementAndGet();
                credit(conn, "carol", 3);
                return 3;
            });
            assertEquals(Integer.valueOf(3), r.value());
            c.commit();
        }
        assertEquals(3, runs.get());
        assertEquals(Long.valueOf(3), balance("carol"));
        assertEquals(1, marks("outbox_inbox", "orders:ORD-9"));
    }

    @Test
    public void an_autocommit_connection_is_refused_and_nothing_is_written() throws Exception {
        AtomicInteger runs = new AtomicInteger();
        try (Connection c = db.connect()) {
            IllegalStateException e = assertThrows(IllegalStateException.class, () -> INBOX.process(c, GROUP, "orders:ORD-auto", conn -> {
                runs.incrementAndGet();
                credit(conn, "erin", 1);
                return null;
            }));
            assertTrue(e.getMessage(), e.getMessage().contains("autocommit mode"));
            assertTrue(e.getMessage(), e.getMessage().contains("setAutoCommit(false)"));
            assertTrue(e.getMessage(), e.getMessage().contains("the handler did not run"));
            IllegalStateException m = assertThrows(IllegalStateException.class,
                    () -> INBOX.mark(c, GROUP, "orders:ORD-auto", InboxMessage.NONE.withTopic("T")));
            assertTrue(m.getMessage(), m.getMessage().startsWith("mark needs a connection in a transaction"));
            assertFalse(INBOX.isProcessed(c, GROUP, "orders:ORD-auto"));
        }
        assertEquals(0, runs.get());
        assertEquals(0, marks("outbox_inbox", "orders:ORD-auto"));
        assertNull(balance("erin"));
    }

    private static void assertRefused(String field, String shown, ThrowingRunnable call) {
        OutboxInvalidEventException e = assertThrows(OutboxInvalidEventException.class, call);
        assertEquals(e.getMessage(), field, e.field());
        assertTrue(e.getMessage(), e.getMessage().startsWith("invalid event: " + field + " "));
        assertTrue(e.getMessage() + " should show " + shown, e.getMessage().contains(shown));
        assertTrue(e.getMessage(), e.getMessage().endsWith(e.reason()));
    }

    @Test
    public void bad_input_is_refused_naming_the_field_and_value_before_anything_is_written() throws Exception {
        AtomicInteger runs = new AtomicInteger();
        InboxHandler<Void, SQLException> handler = conn -> {
            runs.incrementAndGet();
            credit(conn, "frank", 1);
            return null;
        };
        long before = allMarks();
        String longGroup = "g".repeat(256);
        String longKey = "\u00e9".repeat(128); // 256 bytes of UTF-8
        try (Connection c = transaction()) {
            assertRefused("consumer_group", "must not be empty", () -> INBOX.process(c, "", "k", handler));
            assertRefused("consumer_group", "must not be null", () -> INBOX.process(c, null, "k", handler));
            assertRefused("consumer_group", "\"points service\"", () -> INBOX.process(c, "points service", "k", handler));
            assertRefused("consumer_group", "\"points';DROP TABLE points\"", () -> INBOX.mark(c, "points';DROP TABLE points", "k"));
            assertRefused("consumer_group", "\"p\u00f6ints\"", () -> INBOX.isProcessed(c, "p\u00f6ints", "k"));
            assertRefused("consumer_group", "\"" + "g".repeat(40) + "\u2026\" must be 1 to 255 characters of [A-Za-z0-9_%|-]",
                    () -> INBOX.process(c, longGroup, "k", handler));
            assertRefused("event_key", "must not be empty", () -> INBOX.process(c, GROUP, "", handler));
            assertRefused("event_key", "must not be null", () -> INBOX.mark(c, GROUP, null));
            assertRefused("event_key", "\"" + "\u00e9".repeat(40) + "\u2026\" is 256 bytes, longer than the 255",
                    () -> INBOX.process(c, GROUP, longKey, handler));
            assertRefused("event_key", "U+D800", () -> INBOX.process(c, GROUP, "orders:ORD-\uD800", handler));
            assertRefused("event_key", "is 256 bytes", () -> INBOX.isProcessed(c, GROUP, longKey));
            assertRefused("topic", "is 128 characters, longer than the 127",
                    () -> INBOX.process(c, GROUP, "k", InboxMessage.NONE.withTopic("t".repeat(128)), handler));
            assertRefused("msg_id", "is 129 characters, longer than the 128",
                    () -> INBOX.process(c, GROUP, "k", InboxMessage.NONE.withMsgId("m".repeat(129)), handler));
            assertRefused("queue_id", "-1 is negative", () -> INBOX.process(c, GROUP, "k", InboxMessage.of(null, -1, 0L, null), handler));
            assertRefused("queue_offset", "-5 is negative", () -> INBOX.mark(c, GROUP, "k", InboxMessage.NONE.withQueueOffset(-5L)));
            // Nothing was sent: the transaction is as it was and commits nothing of the above.
            c.commit();
        }
        // Validation comes before the autocommit check: a bad field is named on any connection.
        try (Connection c = db.connect()) {
            assertRefused("consumer_group", "must not be empty", () -> INBOX.process(c, "", "k", handler));
        }
        assertEquals(0, runs.get());
        assertEquals(before, allMarks());
        assertNull(balance("frank"));

        OutboxConfigException t = assertThrows(OutboxConfigException.class, () -> OutboxInbox.of("inbox; DROP TABLE points"));
        assertEquals("inbox.table", t.key());
        assertEquals("inbox; DROP TABLE points", t.value());
        assertEquals(OutboxConfigException.Kind.INVALID_VALUE, t.kind());
        assertEquals("invalid value \"inbox; DROP TABLE points\" for inbox.table: must be 1 to 64 letters, digits or underscores, "
                + "not starting with a digit", t.getMessage());
        assertEquals("inbox.table", assertThrows(OutboxConfigException.class, () -> OutboxInbox.of("")).key());
        assertEquals("1inbox", assertThrows(OutboxConfigException.class, () -> OutboxInbox.of("1inbox")).value());
        assertThrows(OutboxConfigException.class, () -> OutboxInbox.of("i".repeat(65)));
        assertThrows(OutboxConfigException.class, () -> OutboxInbox.of("inbox\u00e9"));
        assertEquals("i".repeat(64), OutboxInbox.of("i".repeat(64)).table());
        assertSame(OutboxInbox.DEFAULT, OutboxInbox.of("outbox_inbox"));
    }

    @Test
    public void the_limits_themselves_are_accepted_and_stored_as_given() throws Exception {
        String group = "G-%|_" + "g".repeat(250);
        String key = "\u20ac".repeat(85); // 255 bytes of UTF-8
        InboxMessage meta = InboxMessage.of("t".repeat(127), Integer.MAX_VALUE, Long.MAX_VALUE, "m".repeat(128));
        try (Connection c = transaction()) {
            assertEquals("ok", INBOX.process(c, group, key, meta, conn -> "ok").value());
            c.commit();
        }
        try (Connection c = db.connect(); PreparedStatement ps = c.prepareStatement(
                "SELECT consumer_group, topic, queue_id, queue_offset, msg_id FROM outbox_inbox WHERE event_key = ?")) {
            ps.setBytes(1, key.getBytes(StandardCharsets.UTF_8));
            try (ResultSet rs = ps.executeQuery()) {
                assertTrue(rs.next());
                assertEquals(group, rs.getString(1));
                assertEquals(meta.topic(), rs.getString(2));
                assertEquals(Integer.MAX_VALUE, rs.getLong(3));
                assertEquals(Long.MAX_VALUE, rs.getLong(4));
                assertEquals(meta.msgId(), rs.getString(5));
            }
            assertTrue(INBOX.isProcessed(c, group, key));
        }
    }

    @Test
    public void an_inbox_under_another_name_keeps_its_own_marks() throws Exception {
        try (Connection c = db.connect(); Statement s = c.createStatement()) {
            s.execute("CREATE TABLE points_inbox LIKE outbox_inbox");
        }
        OutboxInbox points = OutboxInbox.of("points_inbox");
        assertEquals("points_inbox", points.table());
        try (Connection c = transaction()) {
            assertTrue(points.mark(c, GROUP, "orders:ORD-named"));
            assertFalse(points.mark(c, GROUP, "orders:ORD-named"));
            c.commit();
        }
        assertEquals(1, marks("points_inbox", "orders:ORD-named"));
        assertEquals(0, marks("outbox_inbox", "orders:ORD-named"));
    }

    @Test
    public void database_errors_other_than_a_duplicate_are_database_exceptions() throws Exception {
        AtomicInteger runs = new AtomicInteger();
        try (Connection c = transaction()) {
            OutboxDatabaseException e = assertThrows(OutboxDatabaseException.class,
                    () -> OutboxInbox.of("no_such_inbox").process(c, GROUP, "k", conn -> runs.incrementAndGet()));
            assertEquals(1146, e.errorCode());
            assertTrue(e.getMessage(), e.getMessage().startsWith("inbox mark in no_such_inbox failed: "));
            assertTrue(e.getCause() instanceof SQLException);
            c.rollback();
        }
        assertEquals(0, runs.get());
        // Only a duplicate key counts as a duplicate (also from a driver that drops the error number).
        assertTrue(OutboxInbox.isDuplicateKey(new SQLIntegrityConstraintViolationException("Duplicate entry", "23000", 1062)));
        assertTrue(OutboxInbox.isDuplicateKey(new SQLIntegrityConstraintViolationException("Duplicate entry", "23000", 0)));
        assertTrue(OutboxInbox.isDuplicateKey(new SQLException("wrapped", "23000", 0,
                new SQLIntegrityConstraintViolationException("Duplicate entry", "23000", 1062))));
        assertFalse(OutboxInbox.isDuplicateKey(new SQLIntegrityConstraintViolationException("Column cannot be null", "23000", 1048)));
        assertFalse(OutboxInbox.isDuplicateKey(new SQLException("Lock wait timeout exceeded", "HY000", 1205)));
    }

    @Test
    public void the_event_key_is_the_eventKey_property_and_a_message_without_it_is_refused() {
        Map<String, String> props = new HashMap<>();
        props.put("eventKey", "orders_db.t_event_record:42");
        props.put("eventId", "42");
        props.put("KEYS", "42");
        assertEquals("orders_db.t_event_record:42", OutboxInbox.eventKey(props));

        props.remove("eventKey");
        OutboxInvalidEventException e = assertThrows(OutboxInvalidEventException.class, () -> OutboxInbox.eventKey(props));
        assertEquals("event_key", e.field());
        assertTrue(e.getMessage(), e.getMessage().contains("the message has no eventKey property"));
        assertTrue(e.getMessage(), e.getMessage().contains("eventId is unique only within one outbox table and is not used in its place"));
        assertTrue(e.getMessage(), e.getMessage().contains("[KEYS, eventId]"));

        props.put("eventKey", "");
        e = assertThrows(OutboxInvalidEventException.class, () -> OutboxInbox.eventKey(props));
        assertTrue(e.getMessage(), e.getMessage().contains("eventKey property is empty"));
        assertThrows(OutboxInvalidEventException.class, () -> OutboxInbox.eventKey(Collections.emptyMap()));
        assertThrows(NullPointerException.class, () -> OutboxInbox.eventKey(null));
    }
}
