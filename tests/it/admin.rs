//! Operator actions: status, dead letters, retention.

use std::time::Duration;

use mysql::prelude::Queryable;

use crate::support::{wait_until, TestDb};
use outbox::admin::{self, BatchOptions, DeadLetterAction, DeadLetterFilter, TimeBound};
use outbox::Relay;

const T: &str = "t_event_record";

fn make_dead(db: &TestDb, n: usize, event_type: &str) -> Vec<u64> {
    let ids = db.seed(n);
    let list: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
    db.conn()
        .exec_drop(
            format!(
                "UPDATE t_event_record SET status = 'FAIL', retry_count = 4, last_error = 'broker rejected', event_type = ? WHERE id IN ({})",
                list.join(",")
            ),
            (event_type,),
        )
        .unwrap();
    ids
}

fn opts(dry_run: bool) -> BatchOptions {
    BatchOptions {
        dry_run,
        batch: 2,
        rate_per_sec: 0,
        actor: "alice@ops".into(),
    }
}

#[test]
fn status_counts_rows_and_shows_sending_owners() {
    let db = TestDb::new("status");
    db.seed(3);
    make_dead(&db, 2, "ORDER_PAID");
    db.conn()
        .query_drop("UPDATE t_event_record SET status = 'SENDING', claim_owner = 'order-1-abcdef', claimed_at = NOW(3) - INTERVAL 5 SECOND WHERE status = 'WAIT' LIMIT 1")
        .unwrap();
    db.conn()
        .query_drop(
            "UPDATE t_event_record SET next_retry_time = NOW(3) - INTERVAL 1 MINUTE WHERE status = 'WAIT' LIMIT 1",
        )
        .unwrap();
    let s = admin::status(&db.pool, T).unwrap();
    assert!(
        s.oldest_wait_age.unwrap() >= Duration::from_secs(60),
        "{:?}",
        s.oldest_wait_age
    );
    assert_eq!(s.oldest_wait_by_topic.len(), 1, "{:?}", s.oldest_wait_by_topic);
    assert_eq!(s.oldest_wait_by_topic[0].0, None, "the rows set no topic");
    assert_eq!(Some(s.oldest_wait_by_topic[0].1), s.oldest_wait_age);
    assert_eq!(s.counts.get("WAIT"), Some(&2));
    assert_eq!(s.counts.get("SENDING"), Some(&1));
    assert_eq!(s.counts.get("FAIL"), Some(&2));
    assert_eq!(s.dead_last_day, 2);
    assert_eq!(s.sending.len(), 1);
    assert_eq!(s.sending[0].owner.as_deref(), Some("order-1-abcdef"));
    assert!(s.sending[0].age >= Duration::from_secs(5));
    assert!(s.to_json().contains("\"SENDING\":1"));
}

#[test]
fn dead_letters_are_listed_replayed_and_discarded_with_an_audit_trail() {
    let db = TestDb::new("deadops");
    let paid = make_dead(&db, 3, "ORDER_PAID");
    let created = make_dead(&db, 2, "ORDER_CREATED");
    let by_type = DeadLetterFilter {
        event_type: Some("ORDER_PAID".into()),
        ..Default::default()
    };
    let listed = admin::list_dead_letters(&db.pool, T, &by_type, 100).unwrap();
    assert_eq!(listed.len(), 3);
    assert!(listed
        .iter()
        .all(|d| d.last_error.as_deref() == Some("broker rejected")));
    let since = DeadLetterFilter {
        since: Some(TimeBound::parse("1h").unwrap()),
        ..Default::default()
    };
    assert_eq!(admin::list_dead_letters(&db.pool, T, &since, 100).unwrap().len(), 5);

    // Dry run changes nothing.
    let n =
        admin::act_on_dead_letters(&db.pool, T, &by_type, DeadLetterAction::Replay, &opts(true), |_, _| {}).unwrap();
    assert_eq!(n, 3);
    assert_eq!(db.count("FAIL"), 5);

    let mut progress = Vec::new();
    let n = admin::act_on_dead_letters(&db.pool, T, &by_type, DeadLetterAction::Replay, &opts(false), |d, t| {
        progress.push((d, t))
    })
    .unwrap();
    assert_eq!(n, 3);
    assert_eq!(progress.last(), Some(&(3, 3)));
    assert_eq!(progress.len(), 2, "batches of 2");
    for id in &paid {
        let (status, rc, err): (String, u32, String) = db
            .conn()
            .exec_first(
                "SELECT status, retry_count, last_error FROM t_event_record WHERE id = ?",
                (id,),
            )
            .unwrap()
            .unwrap();
        assert_eq!((status.as_str(), rc), ("WAIT", 0));
        assert!(err.contains("alice@ops"), "{err}");
    }
    let by_id = DeadLetterFilter {
        ids: vec![created[0]],
        ..Default::default()
    };
    assert_eq!(
        admin::act_on_dead_letters(&db.pool, T, &by_id, DeadLetterAction::Discard, &opts(false), |_, _| {}).unwrap(),
        1
    );
    assert_eq!(db.count("DISCARDED"), 1);
    assert_eq!(db.count("FAIL"), 1);
    let audit: Vec<(u64, String, String)> = db
        .conn()
        .query("SELECT event_id, action, actor FROM outbox_audit ORDER BY id")
        .unwrap();
    assert_eq!(audit.len(), 4);
    assert!(audit.iter().all(|(_, _, actor)| actor == "alice@ops"));
    assert_eq!(audit[3], (created[0], "discard".into(), "alice@ops".into()));
}

#[test]
fn purge_deletes_only_old_sent_rows() {
    let db = TestDb::new("purge");
    db.seed(10);
    let mut c = db.conn();
    c.query_drop("UPDATE t_event_record SET status = 'SUCCESS', sent_at = NOW(3) WHERE id <= 7")
        .unwrap();
    // 5 of them were sent two days ago.
    c.query_drop(
        "UPDATE t_event_record SET next_retry_time = NOW(3) - INTERVAL 2 DAY, update_time = NOW(3) - INTERVAL 2 DAY WHERE id <= 5",
    )
    .unwrap();
    // An old row that is still WAIT must stay whatever its age.
    c.query_drop("UPDATE t_event_record SET next_retry_time = NOW(3) - INTERVAL 3 DAY WHERE id = 10")
        .unwrap();
    let mut seen = Vec::new();
    let n = admin::purge(
        &db.pool,
        T,
        Duration::from_secs(86_400),
        2,
        Duration::from_secs(10),
        |d| seen.push(d),
    )
    .unwrap();
    assert_eq!(n, 5);
    assert_eq!(db.count("SUCCESS"), 2);
    assert_eq!(db.count("WAIT"), 3);
    assert!(seen.len() >= 3, "progress per batch: {seen:?}");
}

#[test]
fn the_retention_thread_purges_in_the_background() {
    let db = TestDb::new("retention");
    db.seed(4);
    db.conn()
        .query_drop(
            "UPDATE t_event_record SET status = 'SUCCESS', next_retry_time = NOW(3) - INTERVAL 1 HOUR, update_time = NOW(3) - INTERVAL 1 HOUR",
        )
        .unwrap();
    let mut cfg = db.config();
    cfg.set("retention.age.ms", "60000").unwrap();
    cfg.set("retention.interval.ms", "50").unwrap();
    let relay = Relay::start(cfg, crate::support::Recorder::new()).unwrap();
    assert!(wait_until(Duration::from_secs(30), || db.rows().is_empty()));
    relay.stop(Duration::from_secs(5));
}

#[test]
fn dead_letter_actions_keep_to_their_rate_and_filter_by_key_and_time() {
    let db = TestDb::new("deadrate");
    let ids = make_dead(&db, 6, "ORDER_PAID");
    let by_key = DeadLetterFilter {
        biz_no: Some("ORD-2".into()),
        ..Default::default()
    };
    let listed = admin::list_dead_letters(&db.pool, T, &by_key, 100).unwrap();
    assert_eq!(listed.iter().map(|d| d.id).collect::<Vec<_>>(), vec![ids[2]]);
    let before_an_hour_ago = DeadLetterFilter {
        until: Some(TimeBound::parse("1h").unwrap()),
        ..Default::default()
    };
    assert!(admin::list_dead_letters(&db.pool, T, &before_an_hour_ago, 100)
        .unwrap()
        .is_empty());

    // 6 rows at 4 rows/s in batches of 2: the last batch may not start before 1 s (a lower
    // bound: a slow machine only makes it longer).
    let rated = BatchOptions {
        rate_per_sec: 4,
        ..opts(false)
    };
    let started = std::time::Instant::now();
    let mut batches = Vec::new();
    let n = admin::act_on_dead_letters(
        &db.pool,
        T,
        &DeadLetterFilter::default(),
        DeadLetterAction::Replay,
        &rated,
        |done, _| batches.push((done, started.elapsed())),
    )
    .unwrap();
    assert_eq!(n, 6);
    assert_eq!(batches.len(), 3);
    assert!(
        batches[2].1 >= Duration::from_secs(1),
        "rows 5-6 started before 4 rows/s allows: {batches:?}"
    );
    assert_eq!(db.count("WAIT"), 6);
}

#[test]
fn a_purge_round_stops_at_its_time_limit_and_the_next_goes_on() {
    let db = TestDb::new("purgetime");
    db.seed(10);
    db.conn()
        .query_drop(
            "UPDATE t_event_record SET status = 'SUCCESS', next_retry_time = NOW(3) - INTERVAL 2 DAY, update_time = NOW(3) - INTERVAL 2 DAY",
        )
        .unwrap();
    let day = Duration::from_secs(86_400);
    // No time at all: one batch, then the round yields.
    assert_eq!(admin::purge(&db.pool, T, day, 3, Duration::ZERO, |_| {}).unwrap(), 3);
    assert_eq!(db.count("SUCCESS"), 7);
    assert_eq!(
        admin::purge(&db.pool, T, day, 3, Duration::from_secs(60), |_| {}).unwrap(),
        7
    );
    assert!(db.rows().is_empty());
}
