package io.outbox;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import java.sql.Connection;
import java.time.Duration;
import java.time.Instant;
import org.junit.AfterClass;
import org.junit.BeforeClass;
import org.junit.Test;

/** Scheduled events from Java: both enqueue paths write the due time the library computes. */
public class ScheduleTest {
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
    public void a_delay_and_a_time_are_written_as_due_times_by_both_enqueue_paths() throws Exception {
        try (Outbox outbox = Outbox.start(db.config().set("publisher", "none")); Connection conn = db.connect()) {
            conn.setAutoCommit(false);
            // The host's JDBC connection.
            OutboxEvents.enqueue(conn, Event.of("J-SCHED-1", "ORDER_TIMEOUT", "{}").deliverAfter(Duration.ofHours(1)));
            OutboxEvents.enqueue(conn, Event.of("J-SCHED-2", "COUPON", "{}").deliverAt(Instant.now().minusSeconds(60)));
            conn.commit();
            // The library's transaction.
            try (OutboxTransaction tx = outbox.begin()) {
                tx.enqueue(Event.of("J-SCHED-3", "ORDER_TIMEOUT", "{}").deliverAfter(Duration.ofHours(1)));
                tx.enqueue(Event.of("J-SCHED-4", "ORDER_CREATED", "{}"));
                tx.commit();
            }
        }
        String hourAhead = "TIMESTAMPDIFF(SECOND, NOW(3), next_retry_time) BETWEEN 3590 AND 3600 AND retry_count = 0";
        assertEquals(1, db.count("biz_no = 'J-SCHED-1' AND " + hourAhead));
        assertEquals(1, db.count("biz_no = 'J-SCHED-3' AND " + hourAhead));
        // A time already past is due now, like an unscheduled event.
        assertEquals(1, db.count("biz_no = 'J-SCHED-2' AND next_retry_time <= NOW(3)"));
        assertEquals(1, db.count("biz_no = 'J-SCHED-4' AND next_retry_time <= NOW(3)"));
        assertEquals(2, db.count("status = 'WAIT' AND next_retry_time > NOW(3)"));
    }

    @Test
    public void bad_schedules_are_refused_naming_the_value_and_write_nothing() throws Exception {
        long before = db.count("");
        try (Outbox outbox = Outbox.start(db.config().set("publisher", "none")); Connection conn = db.connect()) {
            conn.setAutoCommit(false);
            OutboxInvalidEventException e = assertThrows(OutboxInvalidEventException.class,
                    () -> OutboxEvents.enqueue(conn, Event.of("J-BAD", "T", "{}").deliverAfter(Duration.ofDays(400))));
            assertEquals("schedule", e.field());
            assertTrue(e.getMessage(), e.getMessage().contains("34560000000 ms"));
            e = assertThrows(OutboxInvalidEventException.class,
                    () -> OutboxEvents.enqueue(conn, Event.of("J-BAD", "T", "{}").deliverAfter(Duration.ofMillis(-5))));
            assertTrue(e.getMessage(), e.getMessage().contains("delay_ms -5"));
            try (OutboxTransaction tx = outbox.begin()) {
                e = assertThrows(OutboxInvalidEventException.class,
                        () -> tx.enqueue(Event.of("J-BAD", "T", "{}").deliverAt(Instant.now().plus(Duration.ofDays(400)))));
                assertTrue(e.getMessage(), e.getMessage().contains("days ahead"));
                tx.commit();
            }
            conn.commit();
        }
        assertEquals(before, db.count(""));
    }

    @Test
    public void cancel_by_id_and_by_business_key() throws Exception {
        try (Outbox outbox = Outbox.start(db.config().set("publisher", "none"))) {
            long[] ids = new long[3];
            try (OutboxTransaction tx = outbox.begin()) {
                ids[0] = tx.enqueue(Event.of("J-CANCEL", "ORDER_TIMEOUT", "{}").deliverAfter(Duration.ofHours(1)));
                ids[1] = tx.enqueue(Event.of("J-CANCEL", "ORDER_REMINDER", "{}").deliverAfter(Duration.ofHours(1)));
                ids[2] = tx.enqueue(Event.of("J-CANCEL", "ORDER_REMINDER", "{}").deliverAfter(Duration.ofHours(1)));
                tx.commit();
            }
            assertEquals(CancelOutcome.CANCELLED, outbox.cancel(ids[0]));
            assertEquals(CancelOutcome.ALREADY_CANCELLED, outbox.cancel(ids[0]));
            OutboxInvalidEventException e = assertThrows(OutboxInvalidEventException.class, () -> outbox.cancel(ids[2] + 1000));
            assertTrue(e.getMessage(), e.getMessage().contains("is not an event of t_event_record"));
            assertEquals(2, outbox.cancelByBizNo("J-CANCEL", "ORDER_REMINDER"));
            assertEquals(0, db.count("biz_no = 'J-CANCEL'"));
        }
    }
}
