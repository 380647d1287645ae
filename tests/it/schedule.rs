//! Scheduled events (`docs/scheduling.md`): sent at their time by the database's clock and not
//! before, across a relay restart, inside an ordered key's run; bad schedules refused.

use std::time::{Duration, SystemTime};

use mysql::prelude::Queryable;
use mysql::TxOpts;

use crate::support::{start_relay as start, wait_until, Recorder, TestDb};
use outbox::config::Ordering;
use outbox::{NewEvent, Relay};

const LONG: Duration = Duration::from_secs(30);

/// Whether the database's clock has reached the row's due time.
fn due(db: &TestDb, id: u64) -> bool {
    db.conn()
        .exec_first::<bool, _, _>(
            "SELECT next_retry_time <= NOW(3) FROM t_event_record WHERE id = ?",
            (id,),
        )
        .unwrap()
        .unwrap_or(true)
}

/// `(retry_count, status, sent at or after its due time)` of a row kept after its send.
fn sent_row(db: &TestDb, id: u64) -> (u32, String, bool) {
    db.conn()
        .exec_first(
            "SELECT retry_count, status, update_time >= next_retry_time FROM t_event_record WHERE id = ?",
            (id,),
        )
        .unwrap()
        .unwrap()
}

#[test]
fn a_scheduled_event_is_sent_at_its_time_by_the_database_clock_and_not_before() {
    let db = TestDb::new("sched_time");
    let rec = Recorder::new();
    let relay = start(&db.config(), "sched-1-000001", &rec);
    let ids = db.enqueue(&[
        NewEvent::new("ORD-1", "ORDER_TIMEOUT", "late").deliver_after(Duration::from_millis(1500)),
        NewEvent::new("ORD-2", "ORDER_CREATED", "now"),
    ]);
    let (late, now) = (ids[0], ids[1]);
    relay.notify();
    // The unscheduled event goes at once, the relay is live; the scheduled one waits.
    assert!(wait_until(LONG, || rec.sends_of(now) == 1));
    let scheduled: u64 = db
        .conn()
        .query_first(format!(
            "SELECT COUNT(*) FROM t_event_record WHERE {}",
            outbox::SCHEDULED_SQL
        ))
        .unwrap()
        .unwrap();
    assert_eq!(scheduled, 1, "the waiting event counts as scheduled");
    let status = outbox::admin::status(&db.pool, "t_event_record").unwrap();
    assert_eq!(status.scheduled, 1);
    assert!(status.next_scheduled_in.unwrap() <= Duration::from_millis(1500));
    // Not sent while the database's clock is before its time (checked on every poll).
    let mut polls = 0;
    while !due(&db, late) {
        assert_eq!(rec.sends_of(late), 0, "sent before its time");
        polls += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(polls > 0, "the event was due at once: the delay was not applied");
    assert!(wait_until(LONG, || rec.sends_of(late) == 1));
    assert!(wait_until(LONG, || sent_row(&db, late).1 == "SUCCESS"));
    let (attempts, _, after_due) = sent_row(&db, late);
    assert_eq!(attempts, 0, "waiting for its time used no attempt");
    assert!(after_due, "recorded before its due time");
    assert!(!relay.stop(Duration::from_secs(10)).timed_out);
    assert_eq!(rec.total_sent(), 2);
}

#[test]
fn an_absolute_time_is_compared_with_the_database_clock_and_a_past_one_sends_at_once() {
    let db = TestDb::new("sched_abs");
    let now_db_ms: i64 = db
        .conn()
        .query_first("SELECT CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)")
        .unwrap()
        .unwrap();
    let at = |ms: i64| SystemTime::UNIX_EPOCH + Duration::from_millis(ms as u64);
    let ids = db.enqueue(&[
        NewEvent::new("ORD-1", "COUPON", "x").deliver_at(at(now_db_ms + 3_600_000)),
        NewEvent::new("ORD-2", "COUPON", "x").deliver_at(at(now_db_ms - 3_600_000)),
    ]);
    // The hour ahead is kept to the millisecond, in the server's time zone; the past one is due
    // now (GREATEST with NOW(3)), not an hour overdue.
    let rows: Vec<(i64, i64)> = db
        .conn()
        .query(
            "SELECT CAST(UNIX_TIMESTAMP(next_retry_time) * 1000 AS SIGNED), \
             TIMESTAMPDIFF(MICROSECOND, next_retry_time, NOW(3)) FROM t_event_record ORDER BY id",
        )
        .unwrap();
    assert_eq!(rows[0].0, now_db_ms + 3_600_000, "{ids:?}");
    assert!(rows[1].1 >= 0 && rows[1].1 < 60_000_000, "past time: {:?}", rows[1]);
    let rec = Recorder::new();
    let relay = start(&db.config(), "sched-2-000001", &rec);
    assert!(wait_until(LONG, || rec.sends_of(ids[1]) == 1));
    assert_eq!(rec.sends_of(ids[0]), 0);
    assert!(!relay.stop(Duration::from_secs(10)).timed_out);
}

#[test]
fn a_delay_outlives_the_relay_that_saw_it_written() {
    let db = TestDb::new("sched_restart");
    let rec = Recorder::new();
    let first = start(&db.config(), "sched-3-000001", &rec);
    let ids = db.enqueue(&[NewEvent::new("ORD-1", "ORDER_TIMEOUT", "x").deliver_after(Duration::from_millis(800))]);
    // The first relay stops before the event is due; a second one, started later, sends it.
    assert!(!first.stop(Duration::from_secs(10)).timed_out);
    assert_eq!(rec.sends_of(ids[0]), 0, "sent before its time");
    let second = start(&db.config(), "sched-3-000002", &rec);
    assert!(wait_until(LONG, || rec.sends_of(ids[0]) == 1));
    assert!(wait_until(LONG, || sent_row(&db, ids[0]).1 == "SUCCESS"));
    assert!(sent_row(&db, ids[0]).2, "sent before its due time");
    assert!(!second.stop(Duration::from_secs(10)).timed_out);
    assert_eq!(rec.total_sent(), 1);
}

#[test]
fn ordered_a_scheduled_event_holds_its_keys_later_events_until_it_is_sent() {
    let db = TestDb::new("sched_ordered");
    let mut cfg = db.config();
    cfg.ordering = Ordering::PerBizNo;
    let rec = Recorder::ordered(vec![]);
    let relay = start(&cfg, "sched-4-000001", &rec);
    let ids = db.enqueue(&[
        NewEvent::new("K", "STEP", "1"),
        NewEvent::new("K", "STEP", "2").deliver_after(Duration::from_millis(1200)),
        NewEvent::new("K", "STEP", "3"),
        NewEvent::new("OTHER", "STEP", "x"),
    ]);
    relay.notify();
    // The key's first event and the other key go at once; the third waits behind the second.
    assert!(wait_until(LONG, || rec.sends_of(ids[0]) == 1 && rec.sends_of(ids[3]) == 1));
    while !due(&db, ids[1]) {
        assert_eq!(rec.sends_of(ids[1]), 0, "sent before its time");
        assert_eq!(rec.sends_of(ids[2]), 0, "sent before the scheduled event ahead of it");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(wait_until(LONG, || rec.sends_of(ids[2]) == 1));
    let order: Vec<u64> = rec
        .sent_events
        .lock()
        .iter()
        .filter(|e| e.biz_no == "K")
        .map(|e| e.id)
        .collect();
    assert_eq!(order, ids[..3].to_vec(), "the key's events in commit order");
    assert!(!relay.stop(Duration::from_secs(10)).timed_out);
}

#[test]
fn bad_schedules_are_refused_naming_the_value_and_nothing_is_written() {
    let db = TestDb::new("sched_bad");
    let year = Duration::from_secs(367 * 24 * 3600);
    let cases = [
        (
            NewEvent::new("ORD-1", "T", "x").deliver_after(year),
            "delay 31708800000 ms",
        ),
        (
            NewEvent::new("ORD-1", "T", "x").deliver_at(SystemTime::now() + year),
            "days ahead",
        ),
    ];
    let mut conn = db.conn();
    for (event, names) in cases {
        let mut tx = conn.start_transaction(TxOpts::default()).unwrap();
        let err = outbox::enqueue_in_tx(&mut tx, &event).unwrap_err().to_string();
        assert!(err.contains("schedule") && err.contains(names), "{err}");
        tx.commit().unwrap();
    }
    for (at, delay, names) in [
        (-5, 0, "deliver_at_ms -5"),
        (0, -7, "delay_ms -7"),
        (1, 2, "deliver_at_ms 1 and delay_ms 2"),
    ] {
        let err = outbox::Schedule::from_millis(at, delay).unwrap_err().to_string();
        assert!(err.contains(names), "{err}");
    }
    assert_eq!(outbox::Schedule::from_millis(0, 0).unwrap(), None);
    assert_eq!(db.rows().len(), 0, "nothing was written");
}

/// 200 000 events scheduled for later cost a claim round nothing: it reads the due rows only
/// (the scan's range of `idx_status_next_retry` ends at `NOW(3)`), and stays a range scan.
#[test]
fn events_scheduled_for_later_cost_the_due_scan_nothing() {
    use mysql::{Opts, OptsBuilder, Pool, PoolConstraints, PoolOpts};
    let db = TestDb::new("sched_scan");
    db.conn()
        .query_drop(
            "INSERT INTO t_event_record (biz_no, event_type, payload, next_retry_time) \
             SELECT CONCAT('LATER-', seq), 'ORDER_TIMEOUT', 'x', NOW(3) + INTERVAL 1 HOUR FROM seq_1_to_200000",
        )
        .unwrap();
    db.conn()
        .query_drop(
            "INSERT INTO t_event_record (biz_no, event_type, payload) \
             SELECT CONCAT('NOW-', seq), 'ORDER_CREATED', 'x' FROM seq_1_to_50",
        )
        .unwrap();
    db.conn().query_drop("ANALYZE TABLE t_event_record").unwrap();
    // One connection, so the session's handler counters are the claim's.
    let opts = OptsBuilder::from_opts(Opts::from_url(&db.url).unwrap()).pool_opts(
        PoolOpts::default()
            .with_constraints(PoolConstraints::new(1, 1).unwrap())
            .with_reset_connection(false),
    );
    let store = outbox::store::Store::new(Pool::new(opts).unwrap(), &db.config(), "scan-1-000001".into());
    let plan: Vec<mysql::Row> = db
        .conn()
        .query(format!("EXPLAIN {}", store.scan_sql(100, true)))
        .unwrap();
    let (kind, key): (Option<String>, Option<String>) = (plan[0].get("type").unwrap(), plan[0].get("key").unwrap());
    assert_eq!(
        (kind.as_deref(), key.as_deref()),
        (Some("range"), Some("idx_status_next_retry"))
    );
    let read = || -> u64 {
        let rows: Vec<(String, String)> = store
            .pool()
            .get_conn()
            .unwrap()
            .query("SHOW SESSION STATUS LIKE 'Handler_read%'")
            .unwrap();
        rows.iter().filter_map(|(_, v)| v.parse::<u64>().ok()).sum()
    };
    let before = read();
    let round = store.claim_skip_locked(100).unwrap();
    let rows_read = read() - before;
    assert_eq!(round.claimed.len(), 50, "every due event, no scheduled one");
    assert!(round.claimed.iter().all(|c| c.event.biz_no.starts_with("NOW-")));
    assert!(
        rows_read < 400,
        "a claim round read {rows_read} rows with 200 000 scheduled"
    );
}

/// A publisher slowed to ~50 calls a second, so a backlog takes seconds to drain.
struct Slow(std::sync::Arc<Recorder>);

impl outbox::Publisher for Slow {
    fn publish(&self, events: &[outbox::OutboundEvent], timeout: Duration) -> Vec<outbox::SendOutcome> {
        std::thread::sleep(Duration::from_millis(20));
        self.0.publish(events, timeout)
    }
}

/// While a backlog due before it drains, a scheduled event that comes due is sent within about
/// the recent lane's period, ahead of the backlog (which is still draining then).
#[test]
fn a_scheduled_event_overtakes_a_backlog_due_before_it() {
    let db = TestDb::new("sched_backlog");
    db.conn()
        .query_drop(
            "INSERT INTO t_event_record (biz_no, event_type, payload, next_retry_time, event_key) \
             SELECT CONCAT('OLD-', seq), 'ORDER_CREATED', 'x', NOW(3) - INTERVAL 1 HOUR, UUID() FROM seq_1_to_20000",
        )
        .unwrap();
    let mut cfg = db.config();
    cfg.instance_id = Some("overtake-1-000001".into());
    cfg.batch_size = 50;
    cfg.workers = 1;
    cfg.max_in_flight = 50;
    let rec = Recorder::new();
    let relay = Relay::builder(cfg)
        .publisher(std::sync::Arc::new(Slow(rec.clone())))
        .start()
        .unwrap();
    assert!(wait_until(LONG, || rec.total_sent() >= 100), "the drain started");
    let ids = db.enqueue(&[NewEvent::new("NEW-1", "ORDER_TIMEOUT", "x").deliver_after(Duration::from_millis(300))]);
    assert!(wait_until(LONG, || rec.sends_of(ids[0]) == 1));
    let left = db.count("WAIT");
    assert!(
        left > 5_000,
        "the backlog drained first ({left} left): the event did not overtake it"
    );
    assert!(!relay.stop(Duration::from_secs(10)).timed_out);
}
