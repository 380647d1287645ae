//! Per-key ordering (`ordering = per-biz-no`): the ordered claim's cost and runs, and parked keys.

use std::time::Duration;

use mysql::prelude::Queryable;
use mysql::{Opts, OptsBuilder, Pool, PoolConstraints, PoolOpts};

use crate::support::{wait_until, Fault, Recorder, TestDb};
use outbox::config::{DeadHeadPolicy, Ordering};
use outbox::store::Store;
use outbox::{Config, NewEvent, Relay, SendError};

const LONG: Duration = Duration::from_secs(30);

fn ordered_config(db: &TestDb) -> Config {
    let mut cfg = db.config();
    cfg.ordering = Ordering::PerBizNo;
    cfg
}

/// A store on a pool of one connection, so the session's handler counters are the claim's.
fn single_connection_store(db: &TestDb, cfg: &Config, owner: &str) -> Store {
    let opts = OptsBuilder::from_opts(Opts::from_url(&db.url).unwrap()).pool_opts(
        PoolOpts::default()
            .with_constraints(PoolConstraints::new(1, 1).unwrap())
            .with_reset_connection(false),
    );
    Store::new(Pool::new(opts).unwrap(), cfg, owner.into())
}

/// `keys` keys with `per_key` WAIT events each, interleaved in id order as concurrent orders
/// would be (key = seq % keys).
fn fill(db: &TestDb, keys: usize, per_key: usize) {
    db.conn()
        .query_drop(format!(
            "INSERT INTO t_event_record (biz_no, event_type, payload) \
             SELECT CONCAT('KEY-', seq % {keys}), 'STEP', 'x' FROM seq_0_to_{}",
            keys * per_key - 1
        ))
        .unwrap();
    db.conn().query_drop("ANALYZE TABLE t_event_record").unwrap();
}

/// Rows the session read (every `Handler_read_%` counter) while `f` ran on `store`'s one connection.
fn rows_read<T>(store: &Store, f: impl FnOnce() -> T) -> (u64, T) {
    let read = || -> u64 {
        let mut c = store.pool().get_conn().unwrap();
        let rows: Vec<(String, String)> = c.query("SHOW SESSION STATUS LIKE 'Handler_read%'").unwrap();
        rows.iter().filter_map(|(_, v)| v.parse::<u64>().ok()).sum()
    };
    let before = read();
    let out = f();
    // The SHOW itself reads nothing through the handler; what changed is the claim's.
    (read() - before, out)
}

#[test]
fn regression_an_ordered_claim_round_reads_as_many_rows_with_10_000_waiting_per_key_as_with_10() {
    let mut figures = Vec::new();
    for per_key in [10, 10_000] {
        let db = TestDb::new("ordcost");
        fill(&db, 20, per_key);
        let cfg = ordered_config(&db);
        let store = single_connection_store(&db, &cfg, "ordcost-1-000000");
        // First round: 100 candidates, 5 per key, every key's head among them: all claimed.
        let (first, round) = rows_read(&store, || store.claim_ordered(100, 128).unwrap());
        assert_eq!(round.claimed.len(), 100, "{per_key} per key");
        assert_eq!(round.runs.len(), 20);
        // Second round: every key's head is in flight, nothing is claimable.
        let (second, round) = rows_read(&store, || store.claim_ordered(100, 128).unwrap());
        assert_eq!(round.claimed.len(), 0);
        assert_eq!(round.blocked, 100);
        figures.push((per_key, first, second));
    }
    eprintln!("rows read per ordered claim round (20 keys, 100 candidates): {figures:?}");
    let (_, shallow1, shallow2) = figures[0];
    let (_, deep1, deep2) = figures[1];
    // The same work whatever the backlog per key (a little slack for the server's own reads).
    assert!(deep1 <= shallow1 + shallow1 / 4 + 20, "{figures:?}");
    assert!(deep2 <= shallow2 + shallow2 / 4 + 20, "{figures:?}");
    // And about what the round handles: 100 candidates, a few index reads per key.
    assert!(deep1 <= 600, "{figures:?}");
}

/// The smallest id of `key`'s rows.
fn head_of(db: &TestDb, key: &str) -> u64 {
    db.conn()
        .exec_first("SELECT MIN(id) FROM t_event_record WHERE biz_no = ?", (key,))
        .unwrap()
        .unwrap()
}

#[test]
fn a_due_head_behind_the_scan_window_is_claimed_and_one_not_due_is_not_read_again() {
    // 50 keys x 20 events, due an hour ago. KEY-7's head was released after a failure (or a
    // park) and is due only now: in scan order it comes after every other row, far behind a
    // window of 100. KEY-8's head waits out a backoff of an hour.
    let db = TestDb::new("ordbehind");
    fill(&db, 50, 20);
    let (h7, h8) = (head_of(&db, "KEY-7"), head_of(&db, "KEY-8"));
    db.conn()
        .query_drop(format!(
            "UPDATE t_event_record SET next_retry_time = CASE id \
             WHEN {h7} THEN NOW(3) - INTERVAL 1 SECOND WHEN {h8} THEN NOW(3) + INTERVAL 1 HOUR \
             ELSE NOW(3) - INTERVAL 1 HOUR END"
        ))
        .unwrap();
    let cfg = ordered_config(&db);
    let store = single_connection_store(&db, &cfg, "ordbehind-1-000000");
    let round = store.claim_ordered(100, 128).unwrap();
    let of = |round: &outbox::store::ClaimRound, key: &str| -> Vec<u64> {
        round
            .claimed
            .iter()
            .filter(|c| c.event.biz_no == key)
            .map(|c| c.event.id)
            .collect()
    };
    // KEY-7: its head, then its rows of the window that follow it with nothing pending between.
    let seven = of(&round, "KEY-7");
    assert_eq!(
        seven.first(),
        Some(&h7),
        "the head behind the window is claimed first: {seven:?}"
    );
    assert!(
        seven.len() >= 2,
        "and the key's next rows in the window with it: {seven:?}"
    );
    assert!(seven.windows(2).all(|w| w[0] < w[1]));
    assert!(of(&round, "KEY-8").is_empty(), "a head in backoff holds its key back");
    // The next round reads KEY-8's head no more (it is remembered as not due for an hour): the
    // round costs the same statements as one without such a key.
    let (with_waiting_head, round) = rows_read(&store, || store.claim_ordered(100, 128).unwrap());
    assert!(of(&round, "KEY-8").is_empty());
    db.conn()
        .exec_drop("DELETE FROM t_event_record WHERE biz_no = 'KEY-8'", ())
        .unwrap();
    let (without, _) = rows_read(&store, || store.claim_ordered(100, 128).unwrap());
    assert!(
        with_waiting_head <= without + 40,
        "rows read: {with_waiting_head} with a waiting head, {without} without"
    );
}

#[test]
fn a_run_stops_before_a_row_of_its_key_that_another_claimer_holds() {
    let db = TestDb::new("ordgap");
    let mut ids = Vec::new();
    {
        let mut c = db.conn();
        for i in 0..6 {
            c.exec_drop(
                "INSERT INTO t_event_record (biz_no, event_type, payload) VALUES ('ORD-1', 'STEP', ?)",
                (format!("{i}"),),
            )
            .unwrap();
            ids.push(c.last_insert_id());
        }
    }
    let cfg = ordered_config(&db);
    let store = Store::new(db.pool.clone(), &cfg, "ordgap-1-000000".into());
    // Another claimer's scan holds the fourth row locked (its SKIP LOCKED scan, not yet committed).
    let mut other = db.conn();
    let mut tx = other.start_transaction(mysql::TxOpts::default()).unwrap();
    let _: Vec<u64> = tx
        .query(format!(
            "SELECT id FROM t_event_record WHERE id = {} FOR UPDATE",
            ids[3]
        ))
        .unwrap();
    let round = store.claim_ordered(100, 128).unwrap();
    let claimed: Vec<u64> = round.claimed.iter().map(|c| c.event.id).collect();
    assert_eq!(claimed, ids[..3].to_vec(), "the run ends before the held row");
    assert_eq!(round.runs, vec![3]);
    tx.rollback().unwrap();
    // While the first three are in flight, nothing of the key is claimable.
    let round = store.claim_ordered(100, 128).unwrap();
    assert!(round.claimed.is_empty());
    assert_eq!(round.blocked, 3);
}

#[test]
fn keys_differing_only_in_letter_case_are_one_key() {
    let db = TestDb::new("ordcase");
    {
        let mut c = db.conn();
        for key in ["ord-9", "ORD-9", "Ord-9 "] {
            c.exec_drop(
                "INSERT INTO t_event_record (biz_no, event_type, payload) VALUES (?, 'STEP', 'x')",
                (key,),
            )
            .unwrap();
        }
    }
    let cfg = ordered_config(&db);
    let store = Store::new(db.pool.clone(), &cfg, "ordcase-1-000000".into());
    let round = store.claim_ordered(100, 1).unwrap();
    // One run of one event (run_max 1): the three spellings are one key to the database.
    assert_eq!(round.claimed.len(), 1);
    assert_eq!(round.blocked, 2);
    assert_eq!(round.claimed[0].event.biz_no, "ord-9");
}

#[test]
fn a_fail_head_holds_back_its_key_only_with_the_block_policy() {
    for (policy, claimable) in [(DeadHeadPolicy::Skip, 1), (DeadHeadPolicy::Block, 0)] {
        let db = TestDb::new("ordfail");
        db.conn()
            .query_drop(
                "INSERT INTO t_event_record (biz_no, event_type, payload, status) VALUES \
                 ('ORD-1', 'CREATED', 'x', 'FAIL'), ('ORD-1', 'PAID', 'x', 'WAIT')",
            )
            .unwrap();
        let mut cfg = ordered_config(&db);
        cfg.ordering_dead_head = policy;
        let store = Store::new(db.pool.clone(), &cfg, "ordfail-1-000000".into());
        assert_eq!(
            store.claim_ordered(10, 10).unwrap().claimed.len(),
            claimable,
            "{policy:?}"
        );
    }
}

/// An ordered relay with due events and nothing claimable, none of their keys in flight, is idle
/// with work waiting: the stats say for how long (`ordered_blocked_ms`; a WARN follows after a
/// minute, `stats::tests`), until a round claims again.
#[test]
fn keys_held_by_dead_heads_show_as_an_idle_spell_until_the_heads_are_resolved() {
    let db = TestDb::new("ordidle");
    db.conn()
        .query_drop(
            "INSERT INTO t_event_record (biz_no, event_type, payload, status) VALUES \
             ('ORD-1', 'CREATED', 'x', 'FAIL'), ('ORD-1', 'PAID', 'x', 'WAIT'), ('ORD-1', 'SHIPPED', 'x', 'WAIT'), \
             ('ORD-2', 'CREATED', 'x', 'FAIL'), ('ORD-2', 'PAID', 'x', 'WAIT')",
        )
        .unwrap();
    let mut cfg = ordered_config(&db);
    cfg.ordering_dead_head = DeadHeadPolicy::Block;
    let round = Store::new(db.pool.clone(), &cfg, "ordidle-0-000000".into())
        .claim_ordered(10, 10)
        .unwrap();
    assert_eq!(
        (
            round.claimed.len(),
            round.blocked,
            round.stuck,
            round.stuck_keys,
            round.dead_heads
        ),
        (0, 3, 3, 2, 2),
        "3 due events of 2 keys, each held by a dead head"
    );
    let rec = Recorder::ordered(Vec::new());
    let relay = Relay::builder(cfg).publisher(rec.clone()).start().unwrap();
    assert!(
        wait_until(LONG, || {
            let s = relay.counters();
            s.claim_rounds >= 3 && s.ordered_blocked.is_some()
        }),
        "{:?}",
        relay.counters()
    );
    let json: serde_json::Value = serde_json::from_str(&relay.counters().to_json()).unwrap();
    assert!(json["ordered_blocked_ms"].is_u64(), "{json}");
    assert_eq!(rec.total_sent(), 0);
    // Resolved by hand: the keys flow, in order, and the spell is over.
    db.conn()
        .query_drop("UPDATE t_event_record SET status = 'SUCCESS' WHERE status = 'FAIL'")
        .unwrap();
    relay.notify();
    assert!(wait_until(LONG, || db.count("SUCCESS") == 5), "{:?}", db.rows());
    assert_eq!(relay.counters().ordered_blocked, None);
    relay.stop(Duration::from_secs(5));
    let sent: Vec<(String, u64)> = rec.sent_keys();
    let of = |k: &str| {
        sent.iter()
            .filter(|(b, _)| b == k)
            .map(|(_, id)| *id)
            .collect::<Vec<_>>()
    };
    assert_eq!(of("ORD-1").len(), 2);
    assert!(of("ORD-1").windows(2).all(|w| w[0] < w[1]), "{sent:?}");
    assert_eq!(of("ORD-2").len(), 1);
}

#[test]
fn a_parked_key_waits_without_using_attempts_while_other_keys_flow() {
    let db = TestDb::new("ordpark");
    let mut ids = std::collections::HashMap::<String, Vec<u64>>::new();
    {
        let mut c = db.conn();
        for round in 0..5 {
            let mut tx = c.start_transaction(mysql::TxOpts::default()).unwrap();
            for key in ["A", "B", "C"] {
                let id = outbox::enqueue_in_tx(&mut tx, &NewEvent::new(key, "STEP", format!("{round}"))).unwrap();
                ids.entry(key.into()).or_default().push(id);
            }
            tx.commit().unwrap();
        }
    }
    // Key B's queue is on a broker that is down: every send of B is parked.
    let parked_b: Vec<Fault> = ids["B"]
        .iter()
        .map(|&id| Fault::Fail {
            id,
            error: SendError::parked("broker-b is not in the route"),
            times: usize::MAX,
        })
        .collect();
    let rec = Recorder::ordered(parked_b);
    let mut cfg = ordered_config(&db);
    cfg.breaker_open = Duration::from_millis(200);
    let relay = Relay::builder(cfg).publisher(rec.clone()).start().unwrap();
    assert!(wait_until(LONG, || db.count("SUCCESS") == 10));
    assert!(
        wait_until(LONG, || relay.counters().parked >= 3),
        "B parked again and again"
    );
    let stats = relay.counters();
    assert_eq!(stats.breaker_opened, 0, "a parked key never opens the breaker");
    assert_eq!(stats.retried, 0);
    let attempts: u64 = db
        .conn()
        .query_first("SELECT CAST(SUM(retry_count) AS UNSIGNED) FROM t_event_record")
        .unwrap()
        .unwrap();
    assert_eq!(attempts, 0, "parking uses no attempt");
    // The broker comes back: B resumes, in order.
    rec.set_faults(Vec::new());
    assert!(wait_until(LONG, || db.count("SUCCESS") == 15));
    relay.stop(Duration::from_secs(5));
    let sent = rec.sent_events.lock();
    let b: Vec<u64> = sent.iter().filter(|e| e.biz_no == "B").map(|e| e.id).collect();
    assert_eq!(b, ids["B"], "B's events in commit order, each once");
    assert_eq!(rec.key_overlaps.load(std::sync::atomic::Ordering::SeqCst), 0);
}

/// Without queue hints, an ordered round travels in as few publish calls as `publish.batch.max`
/// allows: the publisher sends a call's queues at once, so splitting a round over the workers
/// would only send to a queue twice.
#[test]
fn an_ordered_round_of_many_keys_goes_out_in_one_publish_call() {
    let db = TestDb::new("ordcall");
    fill(&db, 40, 1);
    let rec = Recorder::ordered(Vec::new());
    let cfg = ordered_config(&db);
    assert!(cfg.publish_batch_max >= 40 && cfg.batch_size >= 40 && cfg.workers > 1);
    let relay = Relay::builder(cfg).publisher(rec.clone()).start().unwrap();
    assert!(wait_until(LONG, || db.count("SUCCESS") == 40));
    let stats = relay.counters();
    relay.stop(Duration::from_secs(5));
    assert_eq!(stats.claimed, 40);
    assert_eq!(stats.publish_calls, 1, "40 keys of one round in one call: {stats:?}");
    assert_eq!(rec.sent_events.lock().len(), 40);
}

/// With queue hints (the RocketMQ publisher gives them for ordered topics), an ordered round goes
/// out as one call per queue: one broker request each, acked as soon as its queue answers. A
/// key's run stays whole, in id order, in one call.
#[test]
fn with_queue_hints_an_ordered_round_goes_out_as_one_call_per_queue() {
    let db = TestDb::new("ordlanes");
    fill(&db, 40, 3);
    let rec = Recorder::ordered_over_queues(4);
    let cfg = ordered_config(&db);
    assert!(cfg.publish_batch_max >= 120 && cfg.batch_size >= 120 && cfg.workers > 1);
    let relay = Relay::builder(cfg).publisher(rec.clone()).start().unwrap();
    assert!(wait_until(LONG, || db.count("SUCCESS") == 120));
    let stats = relay.counters();
    relay.stop(Duration::from_secs(5));
    assert_eq!(stats.claimed, 120, "{stats:?}");
    let queues: std::collections::BTreeSet<u64> = (0..40).map(|k| rec.queue_of(&format!("KEY-{k}")).unwrap()).collect();
    let calls = rec.call_log.lock().clone();
    // The rows were all there before the relay started: one round claimed them all.
    assert_eq!(calls.len(), queues.len(), "one call per queue the round reached");
    let mut seen: std::collections::HashMap<String, Vec<u64>> = std::collections::HashMap::new();
    for call in &calls {
        let q = rec.queue_of(&call[0].biz_no);
        assert!(
            call.iter().all(|e| rec.queue_of(&e.biz_no) == q),
            "a call holds one queue's keys"
        );
        for e in call {
            seen.entry(e.biz_no.clone()).or_default().push(e.id);
        }
    }
    assert_eq!(seen.len(), 40);
    for (key, ids) in &seen {
        assert_eq!(ids.len(), 3, "{key}: its run of 3 in one call, each once");
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "{key}: in id order: {ids:?}");
    }
}
