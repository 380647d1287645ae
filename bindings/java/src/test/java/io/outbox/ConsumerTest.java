package io.outbox;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertNotNull;
import static org.junit.Assert.assertTrue;
import static org.junit.Assert.fail;
import static org.junit.Assume.assumeTrue;

import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.SQLTransientException;
import java.sql.Statement;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import java.util.function.BooleanSupplier;
import java.util.logging.Handler;
import java.util.logging.LogRecord;
import java.util.logging.Logger;
import org.junit.AfterClass;
import org.junit.BeforeClass;
import org.junit.Test;

/**
 * {@link OutboxConsumer}: the library's consumer runtime with a Java handler. A relay in this JVM
 * ({@code publisher=rocketmq}) publishes orders written with their events in one JDBC
 * transaction; a consumer credits each order through the transaction it lends its handler.
 * Tests that consume need a library built with {@code --features jni,rocketmq} and a RocketMQ
 * name server on {@code $OUTBOX_TEST_NAMESRV} (default 127.0.0.1:9876) with a broker; they are
 * skipped otherwise, with the reason. The bad-input test runs everywhere.
 */
public class ConsumerTest {
    private static final String NAMESRV = System.getenv().getOrDefault("OUTBOX_TEST_NAMESRV", "127.0.0.1:9876");
    private static final Duration WAIT = Duration.ofSeconds(90);
    /** Held strongly: java.util.logging keeps loggers weakly. */
    private static final Logger OUTBOX_LOG = Logger.getLogger("outbox");

    private static TestDb db;
    /** The relay publishing every test's orders (each test has its own topic and group). */
    private static Outbox relay;

    @BeforeClass
    public static void setUp() throws SQLException {
        db = new TestDb();
        Outbox.migrate(db.config());
        try (Connection c = db.connect(); Statement s = c.createStatement()) {
            s.execute("CREATE TABLE orders (order_no VARCHAR(64) PRIMARY KEY, points INT NOT NULL, "
                    + "credited INT NOT NULL DEFAULT 0)");
        }
    }

    @AfterClass
    public static void tearDown() {
        if (relay != null) {
            relay.close();
        }
        if (db != null) {
            db.close();
        }
    }

    /** Skips the test unless the library can consume and a name server listens; starts the relay once. */
    private static synchronized void needBroker() {
        assumeTrue("the native library was built without the rocketmq feature (" + Outbox.features()
                + "); skipping consumer tests", Outbox.features().contains("rocketmq"));
        assumeTrue("no RocketMQ name server on " + NAMESRV + "; skipping consumer tests", reachable(NAMESRV));
        if (relay == null) {
            relay = Outbox.start(new OutboxConfig().set("db.url", db.url()).set("publisher", "rocketmq")
                    .set("rocketmq.namesrv", NAMESRV).set("rocketmq.producer.group", name("OUTBOX_JC_PG"))
                    .set("topic", name("OUTBOX_JC_DEFAULT")).set("scan.interval.ms", 100).set("send.timeout.ms", 10000)
                    // The tests join the sent rows to the inbox by their event keys: keep them.
                    .set("sent.rows", "keep"));
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

    private static String name(String prefix) {
        return String.format("%s_%08x", prefix, ThreadLocalRandom.current().nextInt());
    }

    /** The consumer's settings: this database, the name server, short backoffs. */
    private static OutboxConfig consumerConfig() {
        return new OutboxConfig().set("db.url", db.url()).set("rocketmq.namesrv", NAMESRV).set("consumer.threads", 2)
                .set("consumer.backoff.initial.ms", 50).set("consumer.backoff.max.ms", 400);
    }

    /**
     * Writes each order and its ORDER_PAID event (body: the points) in one JDBC transaction, then
     * waits until the relay has published them all. Returns each order's event key.
     */
    private static Map<String, String> publish(String topic, String... orders) throws Exception {
        List<Long> ids = new ArrayList<>();
        try (Connection c = db.connect()) {
            c.setAutoCommit(false);
            for (String order : orders) {
                int points = 10 + Math.abs(order.hashCode() % 90);
                try (PreparedStatement ps = c.prepareStatement("INSERT INTO orders (order_no, points) VALUES (?, ?)")) {
                    ps.setString(1, order);
                    ps.setInt(2, points);
                    ps.executeUpdate();
                }
                ids.add(relay.enqueue(c, Event.of(order, "ORDER_PAID", "{\"points\":" + points + "}").withTopic(topic).withTag("paid")));
            }
            c.commit();
        }
        relay.notifyCommitted();
        waitFor("the relay published " + ids, () -> {
            for (long id : ids) {
                String status = status(id); // committed: no row means sent and deleted (sent.rows = delete)
                if (status != null && !"SUCCESS".equals(status)) {
                    return false;
                }
            }
            return true;
        });
        Map<String, String> keys = new HashMap<>();
        for (String order : orders) {
            keys.put(order, queryString("SELECT event_key FROM t_event_record WHERE biz_no = '" + order + "'"));
        }
        return keys;
    }

    /** Sends the orders' events again (as a relay that lost its ack would): copies with the same event key. */
    private static void resend(String... orders) throws Exception {
        String in = "'" + String.join("','", orders) + "'";
        try (Connection c = db.connect(); Statement s = c.createStatement()) {
            s.executeUpdate("UPDATE t_event_record SET status = 'WAIT', retry_count = 0, next_retry_time = NOW(3), "
                    + "claim_owner = NULL, claim_token = NULL, claimed_at = NULL WHERE biz_no IN (" + in + ")");
        }
        relay.notifyCommitted();
        waitFor("the relay sent " + in + " again",
                () -> queryLong("SELECT COUNT(*) FROM t_event_record WHERE status <> 'SUCCESS' AND biz_no IN (" + in + ")") == 0);
    }

    private static String status(long id) {
        try {
            return db.status(id);
        } catch (SQLException e) {
            throw new AssertionError(e);
        }
    }

    private static long queryLong(String sql) {
        try (Connection c = db.connect(); Statement s = c.createStatement(); ResultSet rs = s.executeQuery(sql)) {
            rs.next();
            return rs.getLong(1);
        } catch (SQLException e) {
            throw new AssertionError(sql + ": " + e, e);
        }
    }

    private static String queryString(String sql) {
        try (Connection c = db.connect(); Statement s = c.createStatement(); ResultSet rs = s.executeQuery(sql)) {
            return rs.next() ? rs.getString(1) : null;
        } catch (SQLException e) {
            throw new AssertionError(sql + ": " + e, e);
        }
    }

    private static long credited(String order) {
        return queryLong("SELECT credited FROM orders WHERE order_no = '" + order + "'");
    }

    private static void waitFor(String what, BooleanSupplier done) throws InterruptedException {
        long deadline = System.nanoTime() + WAIT.toNanos();
        while (!done.getAsBoolean()) {
            if (System.nanoTime() > deadline) {
                fail("timed out waiting until " + what);
            }
            Thread.sleep(50);
        }
    }

    /** The points credit, through the consumer's transaction. */
    private static void credit(OutboxTransaction tx, ConsumerMessage m) {
        long n = tx.execute("UPDATE orders SET credited = credited + 1 WHERE order_no = ?", m.bizNo());
        if (n != 1) {
            throw new IllegalStateException("no order " + m.bizNo());
        }
    }

    private static long consumers() {
        return Native.liveHandles()[2];
    }

    // ------------------------------------------------------------------------------------ tests

    @Test
    public void every_order_is_credited_once_through_the_lent_transaction_and_copies_are_duplicates() throws Exception {
        needBroker();
        String topic = name("OUTBOX_JC_ONCE");
        String group = name("points");
        String[] orders = new String[20];
        for (int i = 0; i < orders.length; i++) {
            orders[i] = topic + "-" + i;
        }
        Map<String, String> keys = publish(topic, orders);
        Map<String, ConsumerMessage> seen = new ConcurrentHashMap<>();
        Set<String> threads = ConcurrentHashMap.newKeySet();
        List<LogRecord> records = new CopyOnWriteArrayList<>();
        Handler capture = new Handler() {
            @Override
            public void publish(LogRecord r) {
                records.add(r);
            }

            @Override
            public void flush() {}

            @Override
            public void close() {}
        };
        OUTBOX_LOG.addHandler(capture);
        try (OutboxConsumer consumer = OutboxConsumer.start(consumerConfig(), topic, group, (tx, m) -> {
            seen.put(m.bizNo(), m);
            threads.add(Thread.currentThread().getName());
            assertTrue(tx.isConsumerTransaction());
            credit(tx, m);
        })) {
            assertEquals(topic, consumer.topic());
            assertEquals(group, consumer.group());
            waitFor("20 orders processed", () -> consumer.stats().processed() == 20);
            OutboxConsumerStats s = consumer.stats();
            assertEquals(s.json(), 20, s.received());
            assertEquals(s.json(), 0, s.duplicates());
            assertEquals(s.json(), 0, s.failedAttempts());
            assertEquals(s.json(), 0, s.deadLettered());
            assertFalse(s.isStopped());
            // Exactly once, in SQL: every order credited once, one inbox mark per event key.
            assertEquals(20, queryLong("SELECT COUNT(*) FROM orders WHERE credited = 1 AND order_no LIKE '" + topic + "-%'"));
            assertEquals(20, queryLong("SELECT COUNT(*) FROM outbox_inbox i JOIN t_event_record e ON e.event_key = i.event_key "
                    + "WHERE i.consumer_group = '" + group + "'"));

            // The message as the handler saw it.
            ConsumerMessage m = seen.get(orders[3]);
            assertNotNull(seen.keySet().toString(), m);
            assertEquals(keys.get(orders[3]), m.key());
            assertEquals(keys.get(orders[3]), m.property("eventKey"));
            assertEquals(topic, m.topic());
            assertFalse(m.broker().isEmpty());
            assertTrue(m.queueId() >= 0);
            assertTrue(m.queueOffset() >= 0);
            assertNotNull(m.msgId());
            assertEquals("paid", m.tag());
            assertEquals("ORDER_PAID", m.eventType());
            assertEquals(orders[3], m.bizNo());
            assertNotNull(m.property("eventId"));
            assertTrue(m.bodyAsString(), m.bodyAsString().startsWith("{\"points\":"));
            assertEquals(m.bodyLength(), m.body().length);
            // On the runtime's threads, attached to the JVM under their own names.
            for (String t : threads) {
                assertTrue(threads.toString(), t.startsWith("outbox-consume-"));
            }
            // The runtime logs through System.Logger.
            boolean started = false;
            for (LogRecord r : records) {
                started |= r.getLoggerName().startsWith("outbox.consumer") && r.getMessage().contains("consumer " + group + " started");
            }
            assertTrue("no start record among " + records.size(), started);

            // Copies (a relay that sent again) are duplicates: counted, not credited again.
            resend(orders[0], orders[1], orders[2], orders[3], orders[4]);
            waitFor("5 duplicates", () -> consumer.stats().duplicates() >= 5);
            assertEquals(20, consumer.stats().processed());
            assertEquals(20, queryLong("SELECT COUNT(*) FROM orders WHERE credited = 1 AND order_no LIKE '" + topic + "-%'"));
        } finally {
            OUTBOX_LOG.removeHandler(capture);
        }
    }

    @Test
    public void a_plain_exception_uses_an_attempt_and_transient_ones_do_not() throws Exception {
        needBroker();
        String topic = name("OUTBOX_JC_RETRY");
        String plain = topic + "-plain";
        String transientOne = topic + "-transient";
        String sqlTransient = topic + "-sql";
        String retriableDb = topic + "-db";
        publish(topic, plain, transientOne, sqlTransient, retriableDb, topic + "-ok");
        Map<String, AtomicInteger> calls = new ConcurrentHashMap<>();
        OutboxConfig config = consumerConfig().set("consumer.batch.max", 1);
        try (OutboxConsumer consumer = OutboxConsumer.start(config, topic, name("points"), (tx, m) -> {
            int n = calls.computeIfAbsent(m.bizNo(), k -> new AtomicInteger()).incrementAndGet();
            credit(tx, m); // rolled back with the mark when the handler throws
            if (n == 1 && m.bizNo().equals(plain)) {
                throw new IllegalStateException("points ledger busy");
            }
            if (n == 1 && m.bizNo().equals(transientOne)) {
                throw new OutboxTransientException("loyalty service down");
            }
            if (n == 1 && m.bizNo().equals(sqlTransient)) {
                throw new RuntimeException("wrapped", new SQLTransientException("connection pool exhausted"));
            }
            if (n == 1 && m.bizNo().equals(retriableDb)) {
                throw new OutboxDatabaseException("lock wait timeout (simulated)", 1205, "HY000", true);
            }
        })) {
            waitFor("5 orders processed", () -> consumer.stats().processed() == 5);
            OutboxConsumerStats s = consumer.stats();
            assertEquals(s.json(), 1, s.failedAttempts()); // the plain exception only
            assertEquals(s.json(), 3, s.dbErrors()); // the three transient ones, retried without an attempt
            assertEquals(s.json(), 0, s.deadLettered());
            for (String order : new String[] {plain, transientOne, sqlTransient, retriableDb}) {
                assertEquals(order, 2, calls.get(order).get());
            }
            assertEquals(5, queryLong("SELECT COUNT(*) FROM orders WHERE credited = 1 AND order_no LIKE '" + topic + "-%'"));
        }
    }

    @Test
    public void a_lock_wait_timeout_is_retried_without_using_an_attempt_until_the_row_is_released() throws Exception {
        needBroker();
        String topic = name("OUTBOX_JC_LOCK");
        String order = topic + "-1";
        try (Connection c = db.connect()) {
            c.setAutoCommit(false);
            try (PreparedStatement ps = c.prepareStatement("INSERT INTO orders (order_no, points) VALUES (?, 5)")) {
                ps.setString(1, order + "-held");
                ps.executeUpdate();
            }
            c.commit();
        }
        publish(topic, order);
        List<Throwable> thrown = new CopyOnWriteArrayList<>();
        // Two attempts at most: a timeout that used one would soon park the message.
        OutboxConfig config = consumerConfig().set("consumer.batch.max", 1).set("consumer.max.attempts", 2);
        try (Connection holder = db.connect()) {
            holder.setAutoCommit(false);
            try (Statement s = holder.createStatement()) {
                s.executeQuery("SELECT * FROM orders WHERE order_no = '" + order + "-held' FOR UPDATE").close();
            }
            try (OutboxConsumer consumer = OutboxConsumer.start(config, topic, name("points"), (tx, m) -> {
                tx.execute("SET SESSION innodb_lock_wait_timeout = 1");
                credit(tx, m);
                try {
                    tx.execute("UPDATE orders SET credited = credited + 1 WHERE order_no = ?", m.bizNo() + "-held");
                } catch (RuntimeException e) {
                    thrown.add(e);
                    throw e;
                }
            })) {
                waitFor("three lock wait timeouts", () -> consumer.stats().dbErrors() >= 3);
                OutboxConsumerStats s = consumer.stats();
                assertEquals(s.json(), 0, s.failedAttempts());
                assertEquals(s.json(), 0, s.processed());
                assertEquals(s.json(), 0, s.deadLettered());
                assertEquals(0, credited(order)); // rolled back each time
                OutboxDatabaseException e = (OutboxDatabaseException) thrown.get(0);
                assertEquals(e.getMessage(), 1205, e.errorCode());
                assertTrue(e.isRetriable());

                holder.rollback(); // releases the row
                waitFor("the order processed", () -> consumer.stats().processed() == 1);
                s = consumer.stats();
                assertEquals(s.json(), 0, s.failedAttempts());
                assertEquals(s.json(), 0, s.deadLettered());
                assertEquals(1, credited(order));
                assertEquals(1, credited(order + "-held"));
            }
        }
    }

    /**
     * A points service whose handler also adds to the user's balance (a row every order of the
     * user updates), routed by the user ({@code consumer.route = property:userId}, the userId
     * header): 400 orders of 20 users over four handler threads. No batch meets another's locks,
     * every balance adds up, each order credited once.
     */
    @Test
    public void handler_threads_routed_by_user_update_shared_balances_without_lock_conflicts() throws Exception {
        needBroker();
        String topic = name("OUTBOX_JC_ROUTE");
        String balances = name("balances");
        try (Connection c = db.connect(); Statement s = c.createStatement()) {
            s.execute("CREATE TABLE " + balances + " (user_id VARCHAR(16) PRIMARY KEY, points BIGINT NOT NULL)");
            for (int u = 0; u < 20; u++) {
                s.execute("INSERT INTO " + balances + " VALUES ('u" + u + "', 0)");
            }
        }
        List<String> orders = new ArrayList<>();
        try (Connection c = db.connect()) {
            c.setAutoCommit(false);
            for (int i = 0; i < 400; i++) {
                String order = topic + "-" + i;
                orders.add(order);
                try (PreparedStatement ps = c.prepareStatement("INSERT INTO orders (order_no, points) VALUES (?, 1)")) {
                    ps.setString(1, order);
                    ps.executeUpdate();
                }
                relay.enqueue(c, Event.of(order, "ORDER_PAID", "{\"points\":1}").withTopic(topic)
                        .withHeader("userId", "u" + (i % 20)));
            }
            c.commit();
        }
        relay.notifyCommitted();
        OutboxConfig config = consumerConfig().set("consumer.threads", 4).set("consumer.route", "property:userId");
        try (OutboxConsumer consumer = OutboxConsumer.start(config, topic, name("points"), (tx, m) -> {
            credit(tx, m);
            tx.execute("UPDATE " + balances + " SET points = points + 1 WHERE user_id = ?", m.property("userId"));
        })) {
            waitFor("400 orders processed", () -> consumer.stats().processed() == 400);
            OutboxConsumerStats s = consumer.stats();
            assertEquals(s.json(), 0, s.batchRetries());
            assertEquals(s.json(), 0, s.batchFallbacks());
            assertEquals(s.json(), 0, s.failedAttempts());
        }
        for (String order : orders) {
            assertEquals(order, 1, credited(order));
        }
        assertEquals(20, queryLong("SELECT COUNT(*) FROM " + balances + " WHERE points = 20"));
    }

    /** A database that only consumes gets the inbox and dead-letter tables, none of the relay's. */
    @Test
    public void the_consumer_s_migration_creates_the_consumer_s_tables_alone() throws Exception {
        try (TestDb fresh = new TestDb()) {
            OutboxConfig config = new OutboxConfig().set("db.url", fresh.url());
            MigrationReport r = OutboxConsumer.migrate(config);
            assertEquals(r.toString(), java.util.Arrays.asList(8, 10, 11), r.applied());
            assertEquals(11, r.current());
            assertEquals(Collections.emptyList(), OutboxConsumer.migrate(config).applied());
            List<String> tables = new ArrayList<>();
            try (Connection c = fresh.connect(); Statement s = c.createStatement();
                    ResultSet rs = s.executeQuery("SELECT TABLE_NAME FROM information_schema.TABLES "
                            + "WHERE TABLE_SCHEMA = DATABASE() ORDER BY 1")) {
                while (rs.next()) {
                    tables.add(rs.getString(1));
                }
            }
            assertEquals(java.util.Arrays.asList("outbox_inbox", "outbox_inbox_dead_letter", "outbox_schema_history"), tables);
        }
        OutboxConfigException e = expect(OutboxConfigException.class, () -> OutboxConsumer.migrate(new OutboxConfig()));
        assertTrue(e.getMessage(), e.getMessage().contains("db.url"));
    }

    @Test
    public void a_poison_message_is_parked_in_the_dead_letter_table_after_its_last_attempt() throws Exception {
        needBroker();
        String topic = name("OUTBOX_JC_POISON");
        String group = name("points");
        String poison = topic + "-poison";
        Map<String, String> keys = publish(topic, topic + "-a", poison, topic + "-b");
        AtomicInteger poisonCalls = new AtomicInteger();
        OutboxConfig config = consumerConfig().set("consumer.batch.max", 1).set("consumer.max.attempts", 3);
        try (OutboxConsumer consumer = OutboxConsumer.start(config, topic, group, (tx, m) -> {
            credit(tx, m);
            if (m.bizNo().equals(poison)) {
                poisonCalls.incrementAndGet();
                throw new IllegalArgumentException("order " + m.bizNo() + " has no customer");
            }
        })) {
            waitFor("the poison message parked and the others processed",
                    () -> consumer.stats().deadLettered() == 1 && consumer.stats().processed() == 2);
            OutboxConsumerStats s = consumer.stats();
            assertEquals(s.json(), 3, s.failedAttempts());
            assertEquals(3, poisonCalls.get());
            assertEquals(0, credited(poison));
            assertEquals(1, credited(topic + "-a"));
            assertEquals(1, credited(topic + "-b"));
            try (Connection c = db.connect();
                    PreparedStatement ps = c.prepareStatement("SELECT event_key, topic, attempts, last_error, status, body "
                            + "FROM outbox_inbox_dead_letter WHERE consumer_group = ?")) {
                ps.setString(1, group);
                try (ResultSet rs = ps.executeQuery()) {
                    assertTrue("no dead letter for " + group, rs.next());
                    assertEquals(keys.get(poison), rs.getString("event_key"));
                    assertEquals(topic, rs.getString("topic"));
                    assertEquals(3, rs.getInt("attempts"));
                    assertEquals("DEAD", rs.getString("status"));
                    String lastError = rs.getString("last_error");
                    assertTrue(lastError, lastError.contains("java.lang.IllegalArgumentException: order " + poison + " has no customer"));
                    assertTrue(new String(rs.getBytes("body"), java.nio.charset.StandardCharsets.UTF_8).startsWith("{\"points\":"));
                    assertFalse("one dead letter only", rs.next());
                }
            }
        }
    }

    @Test
    public void the_batch_handler_gets_the_new_messages_of_a_batch_and_a_failed_batch_goes_one_by_one() throws Exception {
        needBroker();
        String topic = name("OUTBOX_JC_BATCH");
        String[] orders = new String[30];
        for (int i = 0; i < orders.length; i++) {
            orders[i] = topic + "-" + i;
        }
        publish(topic, orders);
        List<Integer> sizes = new CopyOnWriteArrayList<>();
        AtomicReference<OutboxConsumer> self = new AtomicReference<>();
        AtomicBoolean failedOnce = new AtomicBoolean();
        // One handler thread: every queue's messages wait for the same thread, so they batch up.
        OutboxConfig config = consumerConfig().set("consumer.threads", 1);
        try (OutboxConsumer consumer = OutboxConsumer.startBatch(config, topic, name("points"), (tx, batch) -> {
            if (sizes.isEmpty()) {
                // Hold the first batch until everything arrived, so the next one is large.
                long deadline = System.nanoTime() + Duration.ofSeconds(30).toNanos();
                while ((self.get() == null || self.get().stats().received() < orders.length) && System.nanoTime() < deadline) {
                    Thread.sleep(20);
                }
            }
            sizes.add(batch.size());
            for (ConsumerMessage m : batch) {
                credit(tx, m);
            }
            // The first batch of several fails (after its credits): rolled back, then one by one.
            if (batch.size() > 1 && failedOnce.compareAndSet(false, true)) {
                throw new IllegalStateException("the first batch of " + batch.size() + " fails");
            }
        })) {
            self.set(consumer);
            waitFor("30 orders processed", () -> consumer.stats().processed() == orders.length);
            OutboxConsumerStats s = consumer.stats();
            assertTrue(sizes.toString(), Collections.max(sizes) > 1);
            assertTrue(sizes.toString(), failedOnce.get());
            assertEquals(s.json(), 1, s.batchFallbacks()); // then one message per call
            assertEquals(s.json(), 0, s.failedAttempts());
            assertEquals(s.json(), 0, s.duplicates());
            // After the failed batch, its messages came one per call.
            int failedAt = -1;
            for (int i = 0; i < sizes.size() && failedAt < 0; i++) {
                failedAt = sizes.get(i) > 1 ? i : -1;
            }
            for (int i = failedAt + 1; i < failedAt + 1 + sizes.get(failedAt); i++) {
                assertEquals(sizes.toString(), 1, (int) sizes.get(i));
            }
            assertEquals(orders.length, queryLong("SELECT COUNT(*) FROM orders WHERE credited = 1 AND order_no LIKE '" + topic + "-%'"));
        }
    }

    @Test
    public void the_lent_transaction_refuses_commit_rollback_close_enqueue_and_outliving_its_call() throws Exception {
        needBroker();
        String topic = name("OUTBOX_JC_TX");
        String order = topic + "-1";
        publish(topic, order);
        List<String> refused = new CopyOnWriteArrayList<>();
        AtomicReference<OutboxTransaction> kept = new AtomicReference<>();
        AtomicLong keptHandle = new AtomicLong();
        AtomicReference<OutboxConsumer> self = new AtomicReference<>();
        OutboxConfig config = consumerConfig().set("consumer.batch.max", 1);
        try (OutboxConsumer consumer = OutboxConsumer.start(config, topic, name("points"), (tx, m) -> {
            long deadline = System.nanoTime() + Duration.ofSeconds(10).toNanos();
            while (self.get() == null && System.nanoTime() < deadline) {
                Thread.sleep(10);
            }
            kept.set(tx);
            keptHandle.set(handleOf(tx));
            credit(tx, m);
            // None of these may end the consumer's transaction, nor change anything.
            Runnable[] calls = {
                tx::commit,
                tx::rollback,
                tx::close,
                () -> tx.enqueue(Event.of("X", "X", "{}")),
                () -> tx.execute("COMMIT"),
                () -> tx.execute("ROLLBACK"),
                () -> tx.execute("CREATE TABLE t_not_here (x INT)"),
                () -> Native.txCommit(handleOf(tx)),
                () -> Native.txRollback(handleOf(tx)),
            };
            for (Runnable call : calls) {
                try {
                    call.run();
                    refused.add("NOT REFUSED");
                } catch (IllegalStateException | IllegalArgumentException e) {
                    refused.add(e.getMessage());
                }
            }
            OutboxConsumer c = self.get();
            for (Runnable call : new Runnable[] {c::stop, c::close}) {
                try {
                    call.run();
                    refused.add("NOT REFUSED");
                } catch (IllegalStateException e) {
                    refused.add(e.getMessage());
                }
            }
            // Still usable after all that: the credit above is still in it.
            assertEquals(1L, tx.queryLong("SELECT credited FROM orders WHERE order_no = ?", m.bizNo()).getAsLong());
        })) {
            self.set(consumer);
            waitFor("the order processed", () -> consumer.stats().processed() == 1);
            assertEquals(1, credited(order));
            assertFalse(refused.toString(), refused.contains("NOT REFUSED"));
            assertEquals(refused.toString(), 11, refused.size());
            assertTrue(refused.get(0), refused.get(0).contains("commit() is not allowed on the consumer's transaction"));
            assertTrue(refused.get(3), refused.get(3).contains("enqueue() is not allowed"));
            assertTrue(refused.get(4), refused.get(4).contains("COMMIT is not allowed on the consumer's transaction"));
            assertTrue(refused.get(6), refused.get(6).contains("CREATE TABLE is not allowed"));
            assertTrue(refused.get(7), refused.get(7).contains("commit is not allowed on the consumer's transaction"));
            assertEquals(0, queryLong("SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() "
                    + "AND table_name = 't_not_here'"));
            assertTrue(refused.get(9), refused.get(9).contains("stop() cannot be called from a consumer's handler"));
            assertTrue(refused.get(10), refused.get(10).contains("close() cannot be called from a consumer's handler"));
            // After the call the transaction is gone, on both sides.
            OutboxTransaction tx = kept.get();
            assertFalse(tx.isOpen());
            try {
                tx.execute("SELECT 1");
                fail("a lent transaction outlived its call");
            } catch (IllegalStateException e) {
                assertTrue(e.getMessage(), e.getMessage().contains("only usable during the handler call"));
            }
            // Also natively: the handle was revoked when the call returned.
            try {
                Native.txExecute(keptHandle.get(), "SELECT 1", new byte[0], new long[0], new double[0], new Object[0]);
                fail("a lent transaction handle outlived its call");
            } catch (IllegalStateException e) {
                assertTrue(e.getMessage(), e.getMessage().contains("is not open"));
            }
        }
    }

    /** The native handle of a transaction, read through its state (tests only). */
    private static long handleOf(OutboxTransaction tx) {
        try {
            java.lang.reflect.Field f = OutboxTransaction.class.getDeclaredField("state");
            f.setAccessible(true);
            Object state = f.get(tx);
            java.lang.reflect.Field h = state.getClass().getDeclaredField("handle");
            h.setAccessible(true);
            return ((AtomicLong) h.get(state)).get();
        } catch (ReflectiveOperationException e) {
            throw new AssertionError(e);
        }
    }

    @Test
    public void stop_twice_and_close_after_stop_are_harmless_and_the_final_counts_stay_readable() throws Exception {
        needBroker();
        String topic = name("OUTBOX_JC_STOP");
        publish(topic, topic + "-1", topic + "-2");
        long before = consumers();
        OutboxConsumer consumer = OutboxConsumer.start(consumerConfig(), topic, name("points"), ConsumerTest::credit);
        assertEquals(before + 1, consumers());
        waitFor("2 orders processed", () -> consumer.stats().processed() == 2);
        OutboxConsumerStats first = consumer.stop();
        assertTrue(first.json(), first.isStopped());
        assertEquals(2, first.processed());
        OutboxConsumerStats second = consumer.stop();
        assertEquals(first.json(), second.json());
        OutboxConsumerStats after = consumer.stats();
        assertTrue(after.isStopped());
        assertEquals(2, after.processed());
        assertFalse(consumer.isClosed());
        consumer.close();
        consumer.close();
        assertTrue(consumer.isClosed());
        assertEquals(before, consumers());
        assertEquals(2, consumer.stats().processed());
        assertTrue(consumer.stats().isStopped());
        assertEquals(2, consumer.stop().processed());
        assertEquals(1, credited(topic + "-1"));
        assertTrue(consumer.toString(), consumer.toString().contains("closed"));
    }

    @Test
    public void the_cleaner_closes_an_unreachable_consumer() throws Exception {
        needBroker();
        long before = consumers();
        startAndForget(name("OUTBOX_JC_GC"));
        assertEquals(before + 1, consumers());
        long deadline = System.nanoTime() + Duration.ofSeconds(60).toNanos();
        while (consumers() > before) {
            if (System.nanoTime() > deadline) {
                fail("the Cleaner did not close the unreachable consumer");
            }
            System.gc();
            Thread.sleep(100);
        }
    }

    private static void startAndForget(String topic) {
        OutboxConsumer.start(consumerConfig(), topic, name("points"), ConsumerTest::credit).stats();
    }

    @Test
    public void bad_input_is_refused_naming_what_is_wrong_and_starts_nothing() throws Exception {
        long before = consumers();
        OutboxConfig config = consumerConfig();
        ConsumerHandler handler = ConsumerTest::credit;
        NullPointerException npe = expect(NullPointerException.class, () -> OutboxConsumer.start(config, "T", "g", null));
        assertTrue(npe.getMessage(), npe.getMessage().contains("handler"));
        npe = expect(NullPointerException.class, () -> OutboxConsumer.startBatch(config, "T", "g", null));
        assertTrue(npe.getMessage(), npe.getMessage().contains("handler"));
        npe = expect(NullPointerException.class, () -> OutboxConsumer.start(config, null, "g", handler));
        assertTrue(npe.getMessage(), npe.getMessage().contains("topic"));
        npe = expect(NullPointerException.class, () -> OutboxConsumer.start(config, "T", null, handler));
        assertTrue(npe.getMessage(), npe.getMessage().contains("group"));
        npe = expect(NullPointerException.class, () -> OutboxConsumer.start(null, "T", "g", handler));
        assertTrue(npe.getMessage(), npe.getMessage().contains("config"));

        OutboxInvalidEventException bad = expect(OutboxInvalidEventException.class,
                () -> OutboxConsumer.start(config, "ORDERS", "points service", handler));
        assertEquals("consumer_group", bad.field());
        assertTrue(bad.getMessage(), bad.getMessage().contains("points service"));
        bad = expect(OutboxInvalidEventException.class, () -> OutboxConsumer.start(config, "ORDERS", "", handler));
        assertEquals("consumer_group", bad.field());
        bad = expect(OutboxInvalidEventException.class, () -> OutboxConsumer.start(config, "orders topic!", "points", handler));
        assertEquals("topic", bad.field());
        assertTrue(bad.getMessage(), bad.getMessage().contains("orders topic!"));
        bad = expect(OutboxInvalidEventException.class, () -> OutboxConsumer.start(config, " ", "points", handler));
        assertEquals("topic", bad.field());

        OutboxConfigException batch = expect(OutboxConfigException.class, () -> consumerConfig().set("consumer.batch.max", 0));
        assertEquals(OutboxConfigException.Kind.INVALID_VALUE, batch.kind());
        assertEquals("consumer.batch.max", batch.key());
        assertEquals("0", batch.value());
        OutboxConfigException threads = expect(OutboxConfigException.class, () -> consumerConfig().set("consumer.threads", 0));
        assertEquals("consumer.threads", threads.key());
        OutboxConfigException noUrl = expect(OutboxConfigException.class,
                () -> OutboxConsumer.start(new OutboxConfig(), "ORDERS", "points", handler));
        assertEquals("db.url", noUrl.key());

        if (!Outbox.features().contains("rocketmq")) {
            OutboxPublisherException p = expect(OutboxPublisherException.class,
                    () -> OutboxConsumer.start(config, "ORDERS", "points", handler));
            assertTrue(p.getMessage(), p.getMessage().contains("rocketmq feature"));
        } else {
            // The database is checked before the broker is contacted: a database without the
            // inbox tables is refused at once, naming the table.
            try (TestDb bare = new TestDb()) {
                OutboxDatabaseException d = expect(OutboxDatabaseException.class, () -> OutboxConsumer.start(
                        new OutboxConfig().set("db.url", bare.url()).set("rocketmq.namesrv", NAMESRV), "ORDERS", "points", handler));
                assertEquals(d.getMessage(), 1146, d.errorCode());
                assertTrue(d.getMessage(), d.getMessage().contains("outbox_inbox"));
            }
        }
        assertEquals(before, consumers());
    }

    @SuppressWarnings("unchecked")
    private static <T extends Throwable> T expect(Class<T> type, Runnable call) {
        try {
            call.run();
        } catch (Throwable e) {
            if (type.isInstance(e)) {
                return (T) e;
            }
            throw new AssertionError("expected " + type.getName() + " but got " + e, e);
        }
        throw new AssertionError("expected " + type.getName() + ", nothing was thrown");
    }

    @Test
    public void transient_exceptions_are_recognised_also_as_causes() {
        assertTrue(OutboxConsumer.Dispatcher.isTransient(new OutboxTransientException("down")));
        assertTrue(OutboxConsumer.Dispatcher.isTransient(new java.sql.SQLTimeoutException("slow")));
        assertTrue(OutboxConsumer.Dispatcher.isTransient(new java.sql.SQLTransactionRollbackException("deadlock")));
        assertTrue(OutboxConsumer.Dispatcher.isTransient(new RuntimeException(new OutboxDatabaseException("x", 1213, "40001", true))));
        assertFalse(OutboxConsumer.Dispatcher.isTransient(new OutboxDatabaseException("x", 1062, "23000", false)));
        assertFalse(OutboxConsumer.Dispatcher.isTransient(new SQLException("syntax", "42000", 1064)));
        assertFalse(OutboxConsumer.Dispatcher.isTransient(new IllegalStateException("bad")));
        RuntimeException cycle = new RuntimeException("a");
        RuntimeException b = new RuntimeException("b", cycle);
        cycle.initCause(b);
        assertFalse(OutboxConsumer.Dispatcher.isTransient(cycle));
        assertEquals("java.lang.IllegalStateException: bad", OutboxConsumer.Dispatcher.describe(new IllegalStateException("bad")));
        assertEquals("java.lang.RuntimeException: wrapped (caused by java.io.IOException: reset)",
                OutboxConsumer.Dispatcher.describe(new RuntimeException("wrapped", new IOException("reset"))));
    }
}
