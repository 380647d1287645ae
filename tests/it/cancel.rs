//! Cancelling events before they leave (`outbox::cancel`): one outcome per event when a cancel
//! races a relay, audited; bad input refused naming the value.

use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use mysql::prelude::Queryable;
use mysql::TxOpts;

use crate::support::{start_relay as start, wait_until, Fault, Recorder, TestDb};
use outbox::cancel::{cancel_by_biz_no, cancel_ids};
use outbox::store::Store;
use outbox::{CancelOutcome, ClaimStrategy, NewEvent, Relay, SentRows};

const LONG: Duration = Duration::from_secs(30);

fn audits(db: &TestDb, id: u64) -> Vec<(String, String, Option<String>)> {
    db.conn()
        .exec(
            "SELECT action, actor, detail FROM outbox_audit WHERE event_id = ? ORDER BY id",
            (id,),
        )
        .unwrap()
}

#[test]
fn a_scheduled_event_cancelled_before_its_time_is_never_sent_and_the_cancel_is_audited() {
    let db = TestDb::new("cancel_sched");
    let rec = Recorder::new();
    let relay = start(&db.config(), "cancel-1-000001", &rec);
    let ids = db.enqueue(&[
        NewEvent::new("ORD-1", "ORDER_TIMEOUT", "x").deliver_after(Duration::from_millis(600)),
        NewEvent::new("ORD-2", "ORDER_CREATED", "x"),
    ]);
    let report = relay.cancel(&[ids[0]]).unwrap();
    assert_eq!(report.outcomes[&ids[0]], CancelOutcome::Cancelled { attempts: 0 });
    assert_eq!(report.summary(), "cancelled 1");
    assert_eq!(db.rows().len(), 1, "the cancelled row is deleted");
    assert_eq!(
        audits(&db, ids[0]),
        vec![(
            "cancel".to_string(),
            "cancel-1-000001".to_string(),
            Some("cancelled before it was sent".to_string())
        )]
    );
    // Cancelling again says so; the relay sends the other event and never this one, well past
    // the time it was scheduled at.
    let again = relay.cancel(&[ids[0]]).unwrap();
    assert_eq!(again.outcomes[&ids[0]], CancelOutcome::AlreadyCancelled);
    assert!(wait_until(LONG, || db.count("SUCCESS") == 1));
    assert!(wait_until(LONG, || {
        db.conn()
            .query_first::<bool, _>("SELECT NOW(3) > DATE_ADD(MIN(create_time), INTERVAL 1 SECOND) FROM t_event_record")
            .unwrap()
            .unwrap_or(false)
    }));
    relay.notify();
    assert!(!relay.stop(Duration::from_secs(10)).timed_out);
    assert_eq!(rec.sends_of(ids[0]), 0);
    assert_eq!(rec.total_sent(), 1);
}

#[test]
fn a_cancel_racing_a_held_round_waits_for_it_and_reports_the_event_sent() {
    for sent_rows in [SentRows::Delete, SentRows::Keep] {
        let db = TestDb::new("cancel_held");
        let mut cfg = db.config();
        cfg.claim_strategy = ClaimStrategy::Held;
        cfg.sent_rows = sent_rows;
        let ids = db.enqueue(&[NewEvent::new("ORD-1", "ORDER_CREATED", "x")]);
        // The send takes a while: the round holds the row's lock meanwhile.
        let rec = Recorder::with_faults(vec![Fault::Delay {
            id: ids[0],
            by: Duration::from_millis(700),
            times: 1,
        }]);
        let relay = start(&cfg, "cancel-2-000001", &rec);
        assert!(wait_until(LONG, || rec.calls.load(SeqCst) >= 1));
        let report = cancel_ids(&db.pool, "t_event_record", &ids, "test").unwrap();
        assert_eq!(report.outcomes[&ids[0]], CancelOutcome::AlreadySent, "{sent_rows:?}");
        assert_eq!(rec.sends_of(ids[0]), 1);
        assert!(audits(&db, ids[0]).is_empty(), "nothing cancelled, nothing audited");
        assert!(!relay.stop(Duration::from_secs(10)).timed_out);
    }
}

#[test]
fn a_row_in_flight_under_a_lease_or_dead_lettered_is_not_cancelled() {
    let db = TestDb::new("cancel_lease");
    let ids = db.enqueue(&[
        NewEvent::new("ORD-1", "ORDER_CREATED", "x"),
        NewEvent::new("ORD-2", "ORDER_CREATED", "x"),
    ]);
    let store = Store::new(db.pool.clone(), &db.config(), "lease-1-000001".into());
    let claimed = store.claim_skip_locked(1).unwrap().claimed;
    assert_eq!(claimed[0].event.id, ids[0]);
    db.conn()
        .exec_drop(
            "UPDATE t_event_record SET status = 'FAIL', retry_count = 3 WHERE id = ?",
            (ids[1],),
        )
        .unwrap();
    let report = cancel_ids(&db.pool, "t_event_record", &ids, "test").unwrap();
    assert_eq!(report.outcomes[&ids[0]], CancelOutcome::InFlight);
    assert_eq!(report.outcomes[&ids[1]], CancelOutcome::DeadLettered);
    assert_eq!(report.cancelled(), 0);
    assert_eq!(db.rows().len(), 2, "nothing deleted");
    let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
    assert_eq!(json["events"][0]["outcome"], "in flight");
}

#[test]
fn a_cancel_by_business_key_takes_that_keys_pending_events_of_that_type_only() {
    let db = TestDb::new("cancel_biz");
    let ids = db.enqueue(&[
        NewEvent::new("ORD-1", "ORDER_TIMEOUT", "x").deliver_after(Duration::from_secs(3600)),
        NewEvent::new("ORD-1", "ORDER_CREATED", "x"),
        NewEvent::new("ORD-2", "ORDER_TIMEOUT", "x").deliver_after(Duration::from_secs(3600)),
    ]);
    let report = cancel_by_biz_no(&db.pool, "t_event_record", "ORD-1", Some("ORDER_TIMEOUT"), "test").unwrap();
    assert_eq!(report.outcomes.keys().copied().collect::<Vec<_>>(), vec![ids[0]]);
    assert_eq!(report.cancelled(), 1);
    let left: Vec<u64> = db.rows().into_iter().map(|r| r.0).collect();
    assert_eq!(left, vec![ids[1], ids[2]]);
    // Without a type: every event of the key.
    let report = cancel_by_biz_no(&db.pool, "t_event_record", "ORD-1", None, "test").unwrap();
    assert_eq!(report.outcomes[&ids[1]], CancelOutcome::Cancelled { attempts: 0 });
    let none = cancel_by_biz_no(&db.pool, "t_event_record", "ORD-404", None, "test").unwrap();
    assert_eq!(none.summary(), "no event matched");
}

#[test]
fn bad_cancels_name_the_value_and_change_nothing() {
    let db = TestDb::new("cancel_bad");
    let ids = db.enqueue(&[NewEvent::new("ORD-1", "ORDER_CREATED", "x")]);
    let err = cancel_ids(&db.pool, "t_event_record", &[ids[0], 999_999], "test")
        .unwrap_err()
        .to_string();
    assert!(err.contains("999999") && err.contains("t_event_record"), "{err}");
    let err = cancel_ids(&db.pool, "t_event_record", &[0], "test")
        .unwrap_err()
        .to_string();
    assert!(err.contains(" 0 is not an event"), "{err}");
    let err = cancel_ids(&db.pool, "t_event_record; DROP TABLE x", &ids, "test")
        .unwrap_err()
        .to_string();
    assert!(err.contains("DROP TABLE x"), "{err}");
    let err = cancel_by_biz_no(&db.pool, "t_event_record", " ", None, "test")
        .unwrap_err()
        .to_string();
    assert!(err.contains("biz_no"), "{err}");
    assert_eq!(db.rows().len(), 1, "nothing changed");
    // A rolled-back id (below the table's next id, never committed) is gone, not an error.
    let mut conn = db.conn();
    let mut tx = conn.start_transaction(TxOpts::default()).unwrap();
    let rolled = outbox::enqueue_in_tx(&mut tx, &NewEvent::new("ORD-2", "T", "x")).unwrap();
    tx.rollback().unwrap();
    let report = cancel_ids(&db.pool, "t_event_record", &[rolled], "test").unwrap();
    assert_eq!(report.outcomes[&rolled], CancelOutcome::Gone);
}

/// Cancels race four held relays over 300 events: each event is either cancelled and never
/// sent, or reported sent (or in flight) and sent once; never both, never neither.
#[test]
fn cancels_racing_relays_have_exactly_one_outcome_per_event() {
    let db = TestDb::new("cancel_race");
    let mut cfg = db.config();
    cfg.sent_rows = SentRows::Delete;
    let events: Vec<NewEvent> = (0..300)
        .map(|i| NewEvent::new(format!("ORD-{i}"), "ORDER_CREATED", "x"))
        .collect();
    let ids = db.enqueue(&events);
    let rec = Recorder::new();
    let relays: Vec<Relay> = (0..4)
        .map(|i| start(&cfg, &format!("race-{i}-00000{i}"), &rec))
        .collect();
    // From the newest down, one at a time: the relays drain from the oldest up.
    let mut outcomes = Vec::new();
    for id in ids.iter().rev() {
        let report = cancel_ids(&db.pool, "t_event_record", &[*id], "test").unwrap();
        outcomes.push((*id, report.outcomes[id]));
    }
    assert!(wait_until(LONG, || db.pending() == 0));
    for r in &relays {
        assert!(!r.stop(Duration::from_secs(10)).timed_out);
    }
    let (mut cancelled, mut sent) = (0, 0);
    for (id, outcome) in outcomes {
        match outcome {
            CancelOutcome::Cancelled { .. } => {
                cancelled += 1;
                assert_eq!(rec.sends_of(id), 0, "event {id} cancelled and sent");
            }
            // Gone: sent and deleted before the cancel looked (every one of these committed).
            CancelOutcome::AlreadySent | CancelOutcome::InFlight | CancelOutcome::Gone => {
                sent += 1;
                assert_eq!(rec.sends_of(id), 1, "event {id} reported sent");
            }
            other => panic!("event {id}: {other:?}"),
        }
    }
    eprintln!("300 events: {cancelled} cancelled, {sent} sent before their cancel");
    assert_eq!(cancelled + sent, 300);
}
