//! The relay's threads against a real database, with a scripted publisher.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use mysql::prelude::Queryable;
use mysql::TxOpts;

use crate::support::{start_relay as start, wait_until, Fault, Recorder, TestDb};
use outbox::{BackoffPolicy, ClaimStrategy, Config, NewEvent, Relay, SendError, SentRows};

const LONG: Duration = Duration::from_secs(60);

fn owner_of(db: &TestDb, id: u64) -> Option<String> {
    db.conn()
        .exec_first("SELECT claim_owner FROM t_event_record WHERE id = ?", (id,))
        .unwrap()
        .flatten()
}

fn every_event_sent_exactly_once_by_four_instances(strategy: ClaimStrategy, sent_rows: SentRows) {
    let db = TestDb::new(match strategy {
        ClaimStrategy::Held => "four_held",
        ClaimStrategy::SkipLocked => "four_sl",
        ClaimStrategy::PerRow => "four_pr",
    });
    let mut cfg = db.config();
    cfg.claim_strategy = strategy;
    cfg.sent_rows = sent_rows;
    let rec = Recorder::new();
    let relays: Vec<Relay> = (0..4)
        .map(|i| start(&cfg, &format!("order-{i}-abc{i:03}"), &rec))
        .collect();
    // Two writers commit 10 000 events while the relays run.
    let writers: Vec<_> = (0..2)
        .map(|w| {
            let pool = db.pool.clone();
            std::thread::spawn(move || {
                let mut conn = pool.get_conn().unwrap();
                for batch in 0..50 {
                    let mut tx = conn.start_transaction(TxOpts::default()).unwrap();
                    for i in 0..100 {
                        let e = NewEvent::new(
                            format!("ORD-{w}-{batch}-{i}"),
                            "ORDER_CREATED",
                            format!("{w}/{batch}/{i}"),
                        );
                        outbox::enqueue_in_tx(&mut tx, &e).unwrap();
                    }
                    tx.commit().unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    // Every row committed: done when none is pending.
    assert!(
        wait_until(LONG, || db.pending() == 0),
        "{} of 10000 still pending",
        db.pending()
    );
    let (kept, gone) = (db.count("SUCCESS"), 10_000 - db.rows().len() as u64);
    match sent_rows {
        SentRows::Keep => assert_eq!((kept, gone), (10_000, 0)),
        SentRows::Delete => assert_eq!((kept, gone), (0, 10_000)),
    }
    for r in &relays {
        assert!(!r.stop(Duration::from_secs(10)).timed_out);
    }
    let stats: Vec<_> = relays.iter().map(|r| r.counters()).collect();
    let sent = rec.sent.lock();
    assert_eq!(sent.len(), 10_000);
    let dup: Vec<_> = sent.iter().filter(|(_, n)| **n != 1).collect();
    assert!(dup.is_empty(), "sent more than once: {:?}", &dup[..dup.len().min(10)]);
    assert_eq!(stats.iter().map(|s| s.sent).sum::<u64>(), 10_000);
    assert_eq!(stats.iter().map(|s| s.stale_acks).sum::<u64>(), 0);
    let working = stats.iter().filter(|s| s.claimed > 0).count();
    eprintln!(
        "{strategy:?}: claimed per instance {:?}, conflicts {:?}",
        stats.iter().map(|s| s.claimed).collect::<Vec<_>>(),
        stats.iter().map(|s| s.claim_conflicts).collect::<Vec<_>>()
    );
    assert!(working >= 2, "only {working} instance(s) did any work");
}

#[test]
fn four_instances_held_send_every_event_exactly_once_and_delete_it() {
    every_event_sent_exactly_once_by_four_instances(ClaimStrategy::Held, SentRows::Delete);
}

#[test]
fn four_instances_held_keeping_rows_send_every_event_exactly_once() {
    every_event_sent_exactly_once_by_four_instances(ClaimStrategy::Held, SentRows::Keep);
}

#[test]
fn four_instances_skip_locked_send_every_event_exactly_once() {
    every_event_sent_exactly_once_by_four_instances(ClaimStrategy::SkipLocked, SentRows::Delete);
}

#[test]
fn four_instances_per_row_send_every_event_exactly_once() {
    every_event_sent_exactly_once_by_four_instances(ClaimStrategy::PerRow, SentRows::Keep);
}

/// A lease-claiming relay (`claim.strategy = skip-locked`) with a short lease: what a lease
/// does when a send outlives it. `held_cfg` is the held claim's counterpart.
fn lease_cfg(db: &TestDb) -> Config {
    let mut cfg = db.config();
    cfg.claim_strategy = ClaimStrategy::SkipLocked;
    cfg.lease = Duration::from_millis(1000);
    cfg.send_timeout = Duration::from_millis(200);
    cfg.lease_renew_fraction = 0.0;
    cfg.reclaim_interval = Duration::from_millis(50);
    cfg
}

#[test]
fn a_send_slower_than_its_lease_is_resent_by_another_instance_and_the_late_ack_is_fenced() {
    let db = TestDb::new("slowsend");
    let id = db.seed(1)[0];
    let mut cfg = lease_cfg(&db);
    cfg.max_in_flight = 1; // A cannot claim again while its send hangs
    let slow = Recorder::with_faults(vec![Fault::Delay {
        id,
        by: Duration::from_millis(2500),
        times: 1,
    }]);
    let a = start(&cfg, "order-8083-aaaaaa", &slow);
    assert!(wait_until(LONG, || slow.calls.load(SeqCst) == 1));
    let fast = Recorder::new();
    let b = start(&cfg, "order-8084-bbbbbb", &fast);
    assert!(wait_until(LONG, || db.count("SUCCESS") == 1));
    assert_eq!(owner_of(&db, id).as_deref(), Some("order-8084-bbbbbb"));
    // A's send finally returns; its ack matches no row.
    assert!(wait_until(LONG, || a.counters().stale_acks == 1));
    assert_eq!(slow.sends_of(id) + fast.sends_of(id), 2);
    assert_eq!(owner_of(&db, id).as_deref(), Some("order-8084-bbbbbb"));
    assert_eq!(db.count("SUCCESS"), 1);
    assert!(a.counters().reclaimed + b.counters().reclaimed >= 1);
    a.stop(Duration::from_secs(5));
    b.stop(Duration::from_secs(5));
}

#[test]
fn the_same_instance_claiming_twice_is_fenced_by_the_token() {
    let db = TestDb::new("aba_relay");
    let id = db.seed(1)[0];
    let mut cfg = lease_cfg(&db);
    cfg.workers = 2;
    let rec = Recorder::with_faults(vec![Fault::Delay {
        id,
        by: Duration::from_millis(2500),
        times: 1,
    }]);
    let a = start(&cfg, "order-8083-a1b2c3", &rec);
    // Reclaimed by its own reclaimer, claimed again by the same instance, sent by its other worker.
    assert!(wait_until(LONG, || db.count("SUCCESS") == 1));
    // The counters move just after the rows do: wait for both acks to be recorded.
    assert!(
        wait_until(LONG, || {
            let s = a.counters();
            s.stale_acks == 1 && s.sent == 1
        }),
        "the first attempt's late ack was not fenced: {:?}",
        a.counters()
    );
    let s = a.counters();
    assert_eq!((s.sent, s.stale_acks), (1, 1));
    assert!(s.reclaimed >= 1);
    assert_eq!(rec.sends_of(id), 2);
    assert_eq!(owner_of(&db, id).as_deref(), Some("order-8083-a1b2c3"));
    a.stop(Duration::from_secs(5));
}

#[test]
fn a_renewed_lease_is_not_reclaimed_while_the_send_is_in_flight() {
    let db = TestDb::new("renew");
    let id = db.seed(1)[0];
    let mut cfg = lease_cfg(&db);
    cfg.lease_renew_fraction = 0.2;
    cfg.max_in_flight = 1;
    let slow = Recorder::with_faults(vec![Fault::Delay {
        id,
        by: Duration::from_millis(2500),
        times: 1,
    }]);
    let a = start(&cfg, "renew-1-aaaaaa", &slow);
    assert!(wait_until(LONG, || slow.calls.load(SeqCst) == 1));
    let other = Recorder::new();
    let b = start(&cfg, "renew-2-bbbbbb", &other);
    assert!(wait_until(LONG, || db.count("SUCCESS") == 1));
    assert_eq!(other.total_sent(), 0, "the other instance stole a renewed lease");
    assert_eq!(slow.sends_of(id), 1);
    let (sa, sb) = (a.counters(), b.counters());
    assert!(sa.renewed >= 2, "renewed {} times", sa.renewed);
    assert_eq!(sa.reclaimed + sb.reclaimed, 0);
    assert_eq!(sa.stale_acks, 0);
    a.stop(Duration::from_secs(5));
    b.stop(Duration::from_secs(5));
}

#[test]
fn failed_sends_retry_with_backoff_then_fail_with_one_dead_letter_call() {
    let db = TestDb::new("deadletter");
    let ids = db.seed(3);
    let bad = ids[1];
    let mut cfg = db.config();
    cfg.max_retry = 2;
    cfg.backoff.policy = BackoffPolicy::Fixed;
    cfg.backoff.base = Duration::from_millis(100);
    cfg.publish_batch_max = 1;
    let rec = Recorder::with_faults(vec![Fault::Fail {
        id: bad,
        error: SendError::rejected("message too large"),
        times: usize::MAX,
    }]);
    let calls = Arc::new(AtomicUsize::new(0));
    let letters = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let (c2, l2) = (calls.clone(), letters.clone());
    let mut cfg2 = cfg.clone();
    cfg2.instance_id = Some("dl-1-000000".into());
    let relay = Relay::builder(cfg2)
        .publisher(rec.clone())
        .dead_letter_hook(move |d| {
            c2.fetch_add(1, SeqCst);
            l2.lock().push(d.clone());
        })
        .start()
        .unwrap();
    assert!(wait_until(LONG, || db.count("FAIL") == 1 && db.count("SUCCESS") == 2));
    relay.stop(Duration::from_secs(5));
    assert_eq!(calls.load(SeqCst), 1);
    let d = letters.lock()[0].clone();
    assert_eq!(d.id, bad);
    assert_eq!(d.retry_count, 3);
    assert!(d.last_error.contains("message too large"), "{}", d.last_error);
    let (rc, err): (u32, String) = db
        .conn()
        .exec_first(
            "SELECT retry_count, last_error FROM t_event_record WHERE id = ?",
            (bad,),
        )
        .unwrap()
        .unwrap();
    assert_eq!(rc, 3);
    assert!(err.contains("message too large"));
    let s = relay.counters();
    assert_eq!((s.retried, s.dead_lettered, s.sent), (2, 1, 2));
}

#[test]
fn a_row_whose_send_hangs_every_time_ends_fail_through_reclaims() {
    let db = TestDb::new("poison_relay");
    let id = db.seed(1)[0];
    let mut cfg = lease_cfg(&db);
    cfg.max_retry = 1;
    cfg.workers = 3;
    let rec = Recorder::with_faults(vec![Fault::Delay {
        id,
        by: Duration::from_millis(1500),
        times: usize::MAX,
    }]);
    let dead = Arc::new(AtomicUsize::new(0));
    let d2 = dead.clone();
    let mut c = cfg.clone();
    c.instance_id = Some("poison-1-000000".into());
    let relay = Relay::builder(c)
        .publisher(rec.clone())
        .dead_letter_hook(move |_| {
            d2.fetch_add(1, SeqCst);
        })
        .start()
        .unwrap();
    assert!(wait_until(LONG, || db.count("FAIL") == 1));
    assert_eq!(db.count("SUCCESS"), 0);
    assert!(wait_until(LONG, || dead.load(SeqCst) == 1));
    relay.stop(Duration::from_secs(5));
    assert_eq!(dead.load(SeqCst), 1);
    let rows = db.rows();
    assert_eq!((rows[0].1.as_str(), rows[0].2), ("FAIL", 2));
}

#[test]
fn stop_releases_claimed_but_unsent_events() {
    let db = TestDb::new("shutdown");
    let ids = db.seed(20);
    let mut cfg = db.config();
    cfg.claim_strategy = ClaimStrategy::SkipLocked;
    cfg.workers = 1;
    cfg.publish_batch_max = 1;
    cfg.batch_size = 20;
    cfg.max_in_flight = 20;
    let rec = Recorder::with_faults(vec![Fault::Delay {
        id: ids[0],
        by: Duration::from_millis(2000),
        times: 1,
    }]);
    let relay = start(&cfg, "stop-1-000000", &rec);
    // One send in flight (held by the delay), nineteen claimed and queued behind it.
    assert!(wait_until(LONG, || rec.calls.load(SeqCst) == 1));
    assert_eq!(db.count("SENDING"), 20);
    let report = relay.stop(Duration::from_secs(10));
    assert!(!report.timed_out);
    assert_eq!(report.released, 19);
    assert_eq!(report.in_flight_at_deadline, 0);
    assert_eq!(db.count("SUCCESS"), 1);
    assert_eq!(db.count("WAIT"), 19);
    for (id, status, rc, owner) in db.rows() {
        if status == "WAIT" {
            assert_eq!((rc, owner), (0, None), "event {id}");
        }
    }
    assert!(relay.stop(Duration::from_secs(1)).already_stopped);
    assert!(matches!(
        relay.enqueue(&NewEvent::new("a", "b", "c")),
        Err(outbox::Error::Stopped)
    ));
}

#[test]
fn a_panicking_publisher_does_not_stop_the_batch_or_the_thread() {
    let db = TestDb::new("panic");
    let ids = db.seed(10);
    let mut cfg = db.config();
    cfg.workers = 1;
    cfg.publish_batch_max = 1;
    cfg.backoff.policy = BackoffPolicy::Fixed;
    cfg.backoff.base = Duration::from_millis(50);
    let rec = Recorder::with_faults(vec![Fault::Panic { id: ids[3], times: 1 }]);
    let relay = start(&cfg, "panic-1-000000", &rec);
    assert!(wait_until(LONG, || db.count("SUCCESS") == 10));
    let s = relay.counters();
    relay.stop(Duration::from_secs(5));
    assert_eq!(s.publish_panics, 1);
    assert_eq!(rec.total_sent(), 10);
    let rc: u32 = db
        .conn()
        .exec_first("SELECT retry_count FROM t_event_record WHERE id = ?", (ids[3],))
        .unwrap()
        .unwrap();
    assert_eq!(rc, 1);
}

#[test]
fn notify_relays_a_fresh_commit_without_waiting_for_the_scan() {
    let db = TestDb::new("fastpath");
    let mut cfg = db.config();
    cfg.scan_interval = Duration::from_secs(3600);
    let rec = Recorder::new();
    let relay = start(&cfg, "fast-1-000000", &rec);
    // Let the first (empty) scan happen, so only a wake-up can find the next event.
    assert!(wait_until(LONG, || relay.counters().claim_rounds >= 1));
    let mut conn = relay.pool().get_conn().unwrap();
    let mut tx = conn.start_transaction(TxOpts::default()).unwrap();
    let id = relay
        .enqueue_in_tx(&mut tx, &NewEvent::new("ORD-1", "ORDER_CREATED", "{}"))
        .unwrap();
    relay.commit(tx).unwrap();
    assert!(
        wait_until(LONG, || rec.sends_of(id) == 1),
        "the commit did not wake the relay"
    );
    let id2 = relay.enqueue(&NewEvent::new("ORD-2", "ORDER_PAID", "{}")).unwrap();
    assert!(wait_until(LONG, || rec.sends_of(id2) == 1));
    relay.stop(Duration::from_secs(5));
}

#[test]
fn broker_outage_opens_the_breaker_without_burning_retries() {
    let db = TestDb::new("breaker");
    db.seed(50);
    let mut cfg = db.config();
    cfg.breaker_failure_threshold = 3;
    cfg.breaker_open = Duration::from_millis(200);
    cfg.max_retry = 1;
    let rec = Recorder::with_faults(vec![Fault::FailAll(SendError::unavailable("connection refused"))]);
    let relay = start(&cfg, "breaker-1-000000", &rec);
    assert!(wait_until(LONG, || relay.counters().breaker_opened >= 1));
    // While open, probes keep failing; no attempt is used.
    assert!(wait_until(LONG, || rec.calls.load(SeqCst) >= 8));
    assert_ne!(relay.counters().breaker_state, outbox::BreakerState::Closed);
    let max_rc: u32 = db
        .conn()
        .query_first("SELECT MAX(retry_count) FROM t_event_record")
        .unwrap()
        .unwrap();
    assert_eq!(max_rc, 0, "an outage used up retry budget");
    assert_eq!(db.count("FAIL"), 0);
    rec.set_faults(vec![]);
    assert!(wait_until(LONG, || db.count("SUCCESS") == 50));
    let s = relay.counters();
    assert!(s.breaker_closed >= 1);
    assert_eq!(s.breaker_state, outbox::BreakerState::Closed);
    relay.stop(Duration::from_secs(5));
}

#[test]
fn an_enqueue_only_relay_writes_but_never_claims() {
    let db = TestDb::new("enqonly");
    let relay = Relay::builder(db.config()).start().unwrap();
    assert!(!relay.is_relaying());
    relay.enqueue(&NewEvent::new("ORD-1", "T", "x")).unwrap();
    assert_eq!(db.count("WAIT"), 1);
    let s = relay.stats();
    assert_eq!(s.claimed, 0);
    assert_eq!(s.gauges.unwrap().wait, 1);
    let r = relay.stop(Duration::from_secs(1));
    assert!(!r.already_stopped);
    assert!(relay.stop(Duration::from_secs(1)).already_stopped);
}

#[test]
fn stats_report_the_database_gauges() {
    let db = TestDb::new("gauges");
    db.seed(5);
    db.conn()
        .query_drop("UPDATE t_event_record SET next_retry_time = NOW(3) - INTERVAL 2 SECOND")
        .unwrap();
    let relay = Relay::builder(db.config()).start().unwrap();
    let g = relay.stats().gauges.unwrap();
    assert_eq!((g.wait, g.sending, g.fail), (5, 0, 0));
    assert!(g.oldest_wait_age >= Duration::from_secs(2));
    let json = relay.stats().to_json();
    assert!(json.contains("\"wait\":5"), "{json}");
}

fn ordered_cfg(db: &TestDb) -> Config {
    let mut cfg = db.config();
    cfg.ordering = outbox::config::Ordering::PerBizNo;
    cfg.backoff.policy = BackoffPolicy::Fixed;
    cfg.backoff.base = Duration::from_millis(50);
    cfg
}

#[test]
fn per_biz_no_ordering_sends_each_key_in_commit_order_one_at_a_time() {
    let db = TestDb::new("ordered");
    let mut conn = db.conn();
    let mut first_of_key0 = 0;
    for round in 0..10 {
        let mut tx = conn.start_transaction(TxOpts::default()).unwrap();
        for key in 0..20 {
            let id = outbox::enqueue_in_tx(
                &mut tx,
                &NewEvent::new(format!("ORD-{key}"), "STEP", format!("{round}")),
            )
            .unwrap();
            if round == 0 && key == 0 {
                first_of_key0 = id;
            }
        }
        tx.commit().unwrap();
    }
    // The head of ORD-0 fails twice: its later events must wait for it.
    let rec = Recorder::ordered(vec![Fault::Fail {
        id: first_of_key0,
        error: SendError::timeout("send timed out"),
        times: 2,
    }]);
    let cfg = ordered_cfg(&db);
    let relays: Vec<Relay> = (0..3).map(|i| start(&cfg, &format!("ord-{i}-000000"), &rec)).collect();
    assert!(wait_until(LONG, || db.count("SUCCESS") == 200));
    for r in &relays {
        r.stop(Duration::from_secs(5));
    }
    assert_eq!(
        rec.key_overlaps.load(SeqCst),
        0,
        "two events of one biz_no were in flight at once"
    );
    let sent = rec.sent_events.lock();
    assert_eq!(sent.len(), 200);
    let mut by_key: std::collections::HashMap<&str, Vec<u64>> = Default::default();
    for e in sent.iter() {
        by_key.entry(e.biz_no.as_str()).or_default().push(e.id);
    }
    for (key, ids) in by_key {
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        assert_eq!(ids, sorted, "{key} was sent out of commit order");
        assert_eq!(ids.len(), 10);
    }
}

fn dead_head(policy: outbox::config::DeadHeadPolicy) -> (String, String) {
    let db = TestDb::new("deadhead");
    let ids = {
        let mut conn = db.conn();
        let mut tx = conn.start_transaction(TxOpts::default()).unwrap();
        let a = outbox::enqueue_in_tx(&mut tx, &NewEvent::new("ORD-1", "CREATED", "1")).unwrap();
        let b = outbox::enqueue_in_tx(&mut tx, &NewEvent::new("ORD-1", "PAID", "2")).unwrap();
        tx.commit().unwrap();
        [a, b]
    };
    let mut cfg = ordered_cfg(&db);
    cfg.max_retry = 0;
    cfg.ordering_dead_head = policy;
    let rec = Recorder::ordered(vec![Fault::Fail {
        id: ids[0],
        error: SendError::rejected("bad"),
        times: usize::MAX,
    }]);
    let relay = start(&cfg, "head-1-000000", &rec);
    assert!(wait_until(LONG, || db.count("FAIL") == 1));
    // Give the scanner several more rounds to (not) pick up the second event.
    let rounds = relay.counters().claim_rounds;
    assert!(wait_until(LONG, || relay.counters().claim_rounds >= rounds + 5
        || db.count("SUCCESS") == 1));
    relay.stop(Duration::from_secs(5));
    let status = |id: u64| -> String {
        db.conn()
            .exec_first("SELECT status FROM t_event_record WHERE id = ?", (id,))
            .unwrap()
            .unwrap()
    };
    (status(ids[0]), status(ids[1]))
}

#[test]
fn a_dead_lettered_head_is_skipped_by_default() {
    let (a, b) = dead_head(outbox::config::DeadHeadPolicy::Skip);
    assert_eq!((a.as_str(), b.as_str()), ("FAIL", "SUCCESS"));
}

#[test]
fn a_dead_lettered_head_blocks_its_key_when_configured() {
    let (a, b) = dead_head(outbox::config::DeadHeadPolicy::Block);
    assert_eq!((a.as_str(), b.as_str()), ("FAIL", "WAIT"));
}

#[test]
fn regression_finished_sends_do_not_cut_the_fixed_delay_between_scans() {
    let db = TestDb::new("fixeddelay");
    db.seed(20);
    let mut cfg = db.config();
    cfg.scan_interval = Duration::from_secs(3600);
    cfg.scan_drain = false;
    cfg.batch_size = 5;
    let rec = Recorder::new();
    let relay = start(&cfg, "delay-1-000000", &rec);
    assert!(wait_until(LONG, || relay.counters().sent == 5));
    // The next round is an hour away: finishing the first batch must not start it early.
    assert!(
        !wait_until(Duration::from_millis(800), || relay.counters().claimed > 5),
        "a worker's completion started a scan round before the interval"
    );
    // A commit's notify still does.
    relay.notify();
    assert!(wait_until(LONG, || relay.counters().sent == 10));
    relay.stop(Duration::from_secs(5));
}

#[test]
fn regression_rows_due_behind_the_scan_position_are_relayed_during_a_drain() {
    let db = TestDb::new("behindpos");
    let backlog = db.seed(1500);
    let mut cfg = db.config();
    // No periodic head round: only the drain's own rule can find the rows behind its position.
    cfg.scan_interval = Duration::from_secs(3600);
    cfg.batch_size = 10;
    let rec = Recorder::new();
    let relay = start(&cfg, "behind-1-000000", &rec);
    assert!(wait_until(LONG, || relay.counters().sent >= 50));
    // Rows that become due far behind wherever the drain's scan position is (transactions that
    // committed late): rounds after the position never see them, a round from the head must.
    let late = db.seed(5);
    db.conn()
        .query_drop(format!(
            "UPDATE t_event_record SET next_retry_time = NOW(3) - INTERVAL 1 HOUR WHERE id >= {}",
            late[0]
        ))
        .unwrap();
    let total = backlog.len() + late.len();
    assert!(
        wait_until(LONG, || db.count("SUCCESS") == total as u64),
        "{} of {total} SUCCESS; the late rows: {:?}",
        db.count("SUCCESS"),
        late.iter().map(|id| rec.sends_of(*id)).collect::<Vec<_>>()
    );
    relay.stop(Duration::from_secs(5));
    let sent = rec.sent.lock();
    assert_eq!(sent.len(), total);
    assert!(sent.values().all(|n| *n == 1), "an event was sent twice");
}

#[test]
fn a_stop_that_times_out_is_finished_by_a_later_stop() {
    let db = TestDb::new("stoplater");
    let ids = db.seed(1);
    let rec = Recorder::with_faults(vec![Fault::Delay {
        id: ids[0],
        by: Duration::from_millis(1500),
        times: 1,
    }]);
    let relay = start(&db.config(), "stoplater-1-000000", &rec);
    assert!(wait_until(LONG, || relay.counters().publish_calls == 1));
    // The send holds its worker past this deadline.
    let first = relay.stop(Duration::ZERO);
    assert!(first.timed_out && !first.already_stopped, "{first:?}");
    // A later stop waits for it, then joins every thread: the send's ack has landed.
    let second = relay.stop(LONG);
    assert!(!second.timed_out && second.already_stopped, "{second:?}");
    assert_eq!(relay.counters().sent, 1);
    assert_eq!(db.count("SUCCESS"), 1);
    let third = relay.stop(Duration::ZERO);
    assert!(!third.timed_out && third.already_stopped, "{third:?}");
}

/// A held-claim relay with a short lease: its held connections' `wait_timeout` is 1 s.
fn held_cfg(db: &TestDb) -> Config {
    let mut cfg = db.config();
    cfg.claim_strategy = ClaimStrategy::Held;
    cfg.lease = Duration::from_millis(1000);
    cfg.send_timeout = Duration::from_millis(200);
    cfg.reclaim_interval = Duration::from_millis(50);
    cfg
}

/// The `claim-lost` audit rows of event `id`.
fn claim_lost_audits(db: &TestDb, id: u64) -> u64 {
    db.conn()
        .exec_first(
            "SELECT COUNT(*) FROM outbox_audit WHERE event_id = ? AND action = 'claim-lost'",
            (id,),
        )
        .unwrap()
        .unwrap_or(0)
}

fn journal_rows(db: &TestDb) -> u64 {
    db.conn()
        .query_first("SELECT COUNT(*) FROM outbox_claim")
        .unwrap()
        .unwrap_or(0)
}

#[test]
fn a_held_send_outliving_its_connection_is_sent_again_counted_and_audited() {
    let db = TestDb::new("held_slow");
    let id = db.seed(1)[0];
    let mut cfg = held_cfg(&db);
    cfg.max_in_flight = 1;
    // The publisher ignores its timeout: the held connection idles past its wait_timeout (the
    // lease, 1 s), the server drops it and the row's lock with it.
    let slow = Recorder::with_faults(vec![Fault::Delay {
        id,
        by: Duration::from_millis(3500),
        times: 1,
    }]);
    let a = start(&cfg, "held-8083-aaaaaa", &slow);
    assert!(wait_until(LONG, || slow.calls.load(SeqCst) == 1));
    let fast = Recorder::new();
    let b = start(&cfg, "held-8084-bbbbbb", &fast);
    // B sends it once the server has ended A's transaction.
    assert!(wait_until(LONG, || fast.sends_of(id) == 1));
    assert!(wait_until(LONG, || db.count("SUCCESS") == 1));
    // A's send returns; its round cannot be recorded: counted, and audited by the recovery.
    assert!(
        wait_until(LONG, || a.counters().possible_duplicates >= 1),
        "{:?}",
        a.counters()
    );
    assert!(wait_until(LONG, || claim_lost_audits(&db, id) == 1));
    assert!(wait_until(LONG, || journal_rows(&db) == 0));
    assert_eq!(slow.sends_of(id) + fast.sends_of(id), 2);
    assert_eq!(db.count("SUCCESS"), 1);
    a.stop(Duration::from_secs(5));
    b.stop(Duration::from_secs(5));
}

#[test]
fn a_held_round_whose_connection_is_killed_mid_send_is_sent_again_and_audited() {
    let db = TestDb::new("held_kill");
    let ids = db.seed(3);
    let mut cfg = held_cfg(&db);
    cfg.lease = Duration::from_secs(30);
    cfg.send_timeout = Duration::from_secs(5);
    let rec = Recorder::with_faults(vec![Fault::Delay {
        id: ids[0],
        by: Duration::from_millis(1500),
        times: 1,
    }]);
    let a = start(&cfg, "held-kill-aaaaaa", &rec);
    assert!(wait_until(LONG, || rec.calls.load(SeqCst) >= 1));
    // The connection holding the round's locks (the one with an open transaction on this
    // database) dies, as in a failover or a server restart.
    let victim: Option<u64> = db
        .conn()
        .exec_first(
            "SELECT p.ID FROM information_schema.PROCESSLIST p JOIN information_schema.INNODB_TRX t \
             ON t.trx_mysql_thread_id = p.ID WHERE p.DB = ? LIMIT 1",
            (&db.name,),
        )
        .unwrap();
    let victim = victim.expect("a held round's transaction is open");
    db.conn().query_drop(format!("KILL CONNECTION {victim}")).unwrap();
    // Nothing lost: every row ends sent; the killed round's events are audited as claim-lost.
    assert!(wait_until(LONG, || db.count("SUCCESS") == 3), "{:?}", db.rows());
    assert!(wait_until(LONG, || claim_lost_audits(&db, ids[0]) == 1));
    assert!(wait_until(LONG, || journal_rows(&db) == 0));
    assert!(rec.sends_of(ids[0]) == 2, "sent {} times", rec.sends_of(ids[0]));
    assert!(a.counters().possible_duplicates >= 1, "{:?}", a.counters());
    a.stop(Duration::from_secs(5));
}

#[test]
fn stopping_a_held_relay_leaves_unsent_rows_untouched() {
    let db = TestDb::new("held_stop");
    let ids = db.seed(20);
    let mut cfg = db.config();
    cfg.claim_strategy = ClaimStrategy::Held;
    cfg.sent_rows = SentRows::Delete;
    cfg.workers = 1;
    cfg.publish_batch_max = 1;
    cfg.batch_size = 20;
    cfg.max_in_flight = 20;
    let rec = Recorder::with_faults(vec![Fault::Delay {
        id: ids[0],
        by: Duration::from_millis(2000),
        times: 1,
    }]);
    let relay = start(&cfg, "held-stop-000000", &rec);
    // The first send is under way (the delayed one: rows go out in scan order).
    assert!(wait_until(LONG, || rec.calls.load(SeqCst) == 1));
    let report = relay.stop(Duration::from_secs(10));
    assert!(!report.timed_out);
    assert_eq!(report.in_flight_at_deadline, 0);
    // One round claimed the backlog (a reclaim running meanwhile once made it skip the oldest
    // row: `protocol::a_claim_during_a_reclaim_takes_every_due_row_the_oldest_first`): every
    // claimed row but the one sent is reported released.
    let c = relay.counters();
    assert_eq!((c.sent, c.claimed), (1, 20), "{c:?}");
    assert_eq!(report.released, 19, "{report:?} {c:?}");
    assert_eq!(rec.sends_of(ids[0]), 1);
    // The one sent is deleted; the others were never written to.
    let rows = db.rows();
    assert_eq!(rows.len(), 19);
    for (id, status, rc, owner) in rows {
        assert_eq!((status.as_str(), rc, owner), ("WAIT", 0, None), "event {id}");
    }
    assert_eq!(journal_rows(&db), 0);
}
