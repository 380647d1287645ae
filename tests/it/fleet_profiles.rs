//! What holds per shard still holds in a fleet: per-key ordering within each shard (a key's head
//! failing holds its later events back), the seed-compatible profile on shard tables created by
//! the seed's DDL and migrated in place, and an event's trace context carried to the broker.
//! Real MariaDB databases, one per shard; a recording publisher.

use std::time::Duration;

use mysql::prelude::Queryable;

use crate::fleet::{sends_by_key, Shards};
use crate::support::{wait_until, Fault, Recorder};
use outbox::config::{Ordering, Profile};
use outbox::{ClaimStrategy, Fleet, NewEvent, SendError};

const LIMIT: Duration = Duration::from_secs(30);

#[test]
fn an_ordered_fleet_keeps_each_key_s_order_within_its_shard_when_a_head_fails() {
    let shards = Shards::new("fleet_ord", 3, &[]);
    // Four keys per shard, six events each, interleaved in id order as concurrent orders are.
    for i in 0..3 {
        let mut c = shards.pool(i).get_conn().unwrap();
        let mut tx = c.start_transaction(mysql::TxOpts::default()).unwrap();
        for n in 0..24 {
            let e = NewEvent::new(format!("S{i}-K{}", n % 4), "STEP", format!("{n}"));
            outbox::enqueue_in_tx(&mut tx, &e).unwrap();
        }
        tx.commit().unwrap();
    }
    // Row 1 (the head of key K0 in each shard) times out twice, in whichever shards send it
    // first: that shard's K0 waits for it.
    let rec = Recorder::ordered(vec![Fault::Fail {
        id: 1,
        error: SendError::timeout("send timed out"),
        times: 2,
    }]);
    let mut cfg = shards.config(0, 2);
    cfg.ordering = Ordering::PerBizNo;
    cfg.backoff.base = Duration::from_millis(50);
    let fleet = Fleet::builder(cfg, rec.clone()).start().unwrap();
    assert!(wait_until(LIMIT, || (0..3).all(|i| shards.count(i, "SUCCESS") == 24)));
    fleet.stop(Duration::from_secs(5));
    let sent: Vec<(String, u64)> = rec.sent_keys();
    assert_eq!(sent.len(), 72, "each event once: {sent:?}");
    for i in 0..3 {
        for k in 0..4 {
            let key = format!("S{i}-K{k}");
            let ids: Vec<u64> = sent.iter().filter(|(b, _)| *b == key).map(|(_, id)| *id).collect();
            assert_eq!(ids.len(), 6, "{key}: {ids:?}");
            assert!(ids.windows(2).all(|w| w[0] < w[1]), "{key} out of order: {ids:?}");
        }
    }
    // The fault's two failures (of whichever shards' row 1 met them) are counted as attempts in
    // the shard that made them.
    let retries: u32 = (0..3)
        .map(|i| {
            shards
                .pool(i)
                .get_conn()
                .unwrap()
                .query_first::<u32, _>("SELECT retry_count FROM t_event_record WHERE id = 1")
                .unwrap()
                .unwrap()
        })
        .sum();
    assert_eq!(retries, 2);
}

#[test]
fn a_fleet_of_seed_era_shard_tables_is_migrated_in_place_and_relayed_under_the_seed_profile() {
    // Two shard databases whose tables the seed's DDL created, holding rows its service wrote.
    let shards = Shards::new("fleet_seed", 2, &[0, 1]);
    let server = mysql::Pool::new(crate::support::server_url().as_str()).unwrap();
    for i in 0..2 {
        server
            .get_conn()
            .unwrap()
            .query_drop(format!("CREATE DATABASE {}", shards.name(i)))
            .unwrap();
        let mut c = shards.pool(i).get_conn().unwrap();
        crate::schema::create_seed_table(&mut c, "t_event_record");
        for n in 0..10 {
            c.exec_drop(
                "INSERT INTO t_event_record (biz_no, event_type, payload) VALUES (?, 'ORDER_CREATED', '{}')",
                (format!("SEED{i}-{n}"),),
            )
            .unwrap();
        }
        outbox::migrate(&shards.pool(i)).unwrap();
    }
    let mut cfg = shards.config(0, 1);
    cfg.apply_profile(Profile::Seed);
    let rec = Recorder::new();
    let fleet = Fleet::builder(cfg, rec.clone()).start().unwrap();
    assert!(wait_until(LIMIT, || (0..2).all(|i| shards.count(i, "SUCCESS") == 10)));
    for v in fleet.shards() {
        let relay = v.relay().expect("every shard runs");
        // The seed's values reach every shard's relay.
        assert_eq!(relay.config().claim_strategy, ClaimStrategy::PerRow, "{}", v.spec.name);
        assert_eq!(relay.config().batch_size, 20);
    }
    fleet.stop(Duration::from_secs(5));
    let by_key = sends_by_key(&rec);
    assert_eq!(by_key.len(), 20);
    assert!(by_key.values().all(|&n| n == 1), "{by_key:?}");
    // Rows written before the migration got their event key when claimed.
    for i in 0..2 {
        let keyless: u64 = shards
            .pool(i)
            .get_conn()
            .unwrap()
            .query_first("SELECT COUNT(*) FROM t_event_record WHERE event_key IS NULL")
            .unwrap()
            .unwrap();
        assert_eq!(keyless, 0, "shard {i}");
    }
}

#[test]
fn an_event_s_trace_context_reaches_the_publisher_from_any_shard() {
    let shards = Shards::new("fleet_trace", 2, &[]);
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let mut c = shards.pool(1).get_conn().unwrap();
    let mut tx = c.start_transaction(mysql::TxOpts::default()).unwrap();
    let e = NewEvent::new("TRACED-1", "ORDER_CREATED", "{}").with_trace_context(tp, Some("k=v".into()));
    outbox::enqueue_in_tx(&mut tx, &e).unwrap();
    tx.commit().unwrap();
    let rec = Recorder::new();
    let fleet = Fleet::builder(shards.config(0, 1), rec.clone()).start().unwrap();
    assert!(wait_until(LIMIT, || rec.sent_events.lock().len() == 1));
    fleet.stop(Duration::from_secs(5));
    let sent = rec.sent_events.lock()[0].clone();
    assert_eq!(
        sent.headers.get(outbox::wire::TRACEPARENT).map(String::as_str),
        Some(tp)
    );
    assert_eq!(
        sent.headers.get(outbox::wire::TRACESTATE).map(String::as_str),
        Some("k=v")
    );
}
