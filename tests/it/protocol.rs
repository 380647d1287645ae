//! The protocol at the statement level: claims, fencing, retries, reclaims.

use std::collections::HashSet;
use std::time::Duration;

use mysql::prelude::Queryable;
use mysql::{Row, TxOpts};

use crate::support::{wait_until, TestDb};
use outbox::store::Store;
use outbox::{BackoffPolicy, Config, NewEvent};

fn store(cfg: &Config, owner: &str) -> Store {
    Store::new(outbox::connect(cfg).unwrap(), cfg, owner.into())
}

#[test]
fn rolled_back_transaction_leaves_no_row() {
    let db = TestDb::new("rollback");
    let mut conn = db.conn();
    conn.query_drop("CREATE TABLE orders (id INT PRIMARY KEY)").unwrap();
    let mut tx = conn.start_transaction(TxOpts::default()).unwrap();
    tx.query_drop("INSERT INTO orders VALUES (1)").unwrap();
    let id = outbox::enqueue_in_tx(&mut tx, &NewEvent::new("ORD-1", "ORDER_CREATED", "{}")).unwrap();
    assert!(id > 0);
    tx.rollback().unwrap();
    assert!(db.rows().is_empty());
    let orders: Option<u64> = db.conn().query_first("SELECT COUNT(*) FROM orders").unwrap();
    assert_eq!(orders, Some(0));
}

#[test]
fn invalid_events_are_refused_naming_the_field() {
    let db = TestDb::new("invalid");
    let mut conn = db.conn();
    let mut tx = conn.start_transaction(TxOpts::default()).unwrap();
    let cases = [
        (NewEvent::new("", "ORDER_CREATED", "x"), "biz_no"),
        (NewEvent::new("ORD", " ", "x"), "event_type"),
        (NewEvent::new("ORD", "T", ""), "payload"),
        (NewEvent::new("ORD", "T", vec![1u8; 4 * 1024 * 1024 + 1]), "payload"),
        (NewEvent::new("ORD", "T", "x").with_topic("bad topic"), "topic"),
        (NewEvent::new("ORD", "T", "x").with_header("eventId", "7"), "headers"),
        (NewEvent::new("x".repeat(65), "T", "x"), "biz_no"),
    ];
    for (e, field) in cases {
        let err = outbox::enqueue_in_tx(&mut tx, &e).unwrap_err();
        match &err {
            outbox::Error::InvalidEvent { field: f, .. } => assert_eq!(*f, field, "{err}"),
            other => panic!("expected InvalidEvent for {field}, got {other}"),
        }
        assert!(err.to_string().contains(field));
    }
    tx.commit().unwrap();
    assert!(db.rows().is_empty());
}

#[test]
fn a_round_after_a_scan_position_starts_past_it_and_a_head_round_finds_rows_behind_it() {
    let db = TestDb::new("scanpos");
    let ids = db.seed(10);
    let s = store(&db.config(), "pos-1-abcdef");
    let first = s.claim_skip_locked(4).unwrap();
    let position = first.last.clone().expect("position of the last claimed row");
    assert_eq!(first.claimed.last().unwrap().event.id, ids[3]);
    // A row that becomes due behind the position (a transaction that committed late).
    let late = db.seed(1)[0];
    db.conn()
        .exec_drop(
            "UPDATE t_event_record SET next_retry_time = NOW(3) - INTERVAL 1 HOUR WHERE id = ?",
            (late,),
        )
        .unwrap();
    let next = s.claim_skip_locked_after(100, Some(&position)).unwrap();
    let got: Vec<u64> = next.claimed.iter().map(|c| c.event.id).collect();
    assert_eq!(
        got,
        ids[4..].to_vec(),
        "a round after the position returns what follows it, in order"
    );
    let head = s.claim_skip_locked(100).unwrap();
    let got: Vec<u64> = head.claimed.iter().map(|c| c.event.id).collect();
    assert_eq!(
        got,
        vec![late],
        "a round from the head finds the row behind the position"
    );
}

#[test]
fn skip_locked_claimers_get_disjoint_non_empty_batches() {
    let db = TestDb::new("skiplock");
    db.seed(40);
    let cfg = db.config();
    let a = store(&cfg, "a-1-aaaaaa");
    let b = store(&cfg, "b-1-bbbbbb");
    // Hold A's claim transaction open (its row locks taken) while B claims.
    let mut conn = a.pool().get_conn().unwrap();
    let mut tx = conn.start_transaction(TxOpts::default()).unwrap();
    let held: Vec<Row> = tx.query(a.scan_sql(10, true)).unwrap();
    let held: HashSet<u64> = held.into_iter().map(|r| r.get::<u64, _>("id").unwrap()).collect();
    assert_eq!(held.len(), 10);
    let started = std::time::Instant::now();
    let got = b.claim_skip_locked(10).unwrap();
    assert!(started.elapsed() < Duration::from_secs(5), "B waited on A's locks");
    let got: HashSet<u64> = got.claimed.iter().map(|c| c.event.id).collect();
    assert_eq!(
        got.len(),
        10,
        "B got nothing while A held its batch: SKIP LOCKED is locking every row"
    );
    assert!(got.is_disjoint(&held), "{got:?} overlaps {held:?}");
    tx.rollback().unwrap();

    // And racing flat out, two claimers split everything with no overlap.
    let a2 = a.clone();
    let t = std::thread::spawn(move || {
        let mut mine = Vec::new();
        loop {
            let r = a2.claim_skip_locked(3).unwrap();
            if r.claimed.is_empty() {
                return mine;
            }
            mine.extend(r.claimed.iter().map(|c| c.event.id));
        }
    });
    let mut mine_b: Vec<u64> = got.into_iter().collect();
    loop {
        let r = b.claim_skip_locked(3).unwrap();
        if r.claimed.is_empty() {
            break;
        }
        mine_b.extend(r.claimed.iter().map(|c| c.event.id));
    }
    let mine_a = t.join().unwrap();
    let sa: HashSet<u64> = mine_a.iter().copied().collect();
    let sb: HashSet<u64> = mine_b.iter().copied().collect();
    assert!(sa.is_disjoint(&sb));
    assert_eq!(sa.len() + sb.len(), 40);
    assert_eq!(db.count("SENDING"), 40);
}

#[test]
fn per_row_claims_are_decided_by_affected_rows() {
    let db = TestDb::new("perrow");
    db.seed(30);
    let cfg = db.config();
    let stores: Vec<Store> = (0..3).map(|i| store(&cfg, &format!("s{i}-1-000000"))).collect();
    let handles: Vec<_> = stores
        .into_iter()
        .map(|s| {
            std::thread::spawn(move || {
                let (mut ids, mut conflicts) = (Vec::new(), 0);
                loop {
                    let r = s.claim_per_row(30).unwrap();
                    conflicts += r.conflicts;
                    if r.claimed.is_empty() && r.conflicts == 0 {
                        return (ids, conflicts);
                    }
                    ids.extend(r.claimed.iter().map(|c| c.event.id));
                }
            })
        })
        .collect();
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.join().unwrap().0);
    }
    let distinct: HashSet<u64> = all.iter().copied().collect();
    assert_eq!(all.len(), 30, "a row was claimed twice");
    assert_eq!(distinct.len(), 30);
}

#[test]
fn a_late_ack_from_an_earlier_claim_changes_nothing_even_from_the_same_instance() {
    let db = TestDb::new("aba");
    let id = db.seed(1)[0];
    let mut cfg = db.config();
    cfg.lease = Duration::ZERO;
    let s = store(&cfg, "order-8083-a1b2c3");
    let first = s.claim_skip_locked(1).unwrap().claimed.remove(0);
    // The lease (zero here) expires, and the SAME instance claims again.
    let r = wait_reclaim(&s);
    assert_eq!(r, 1);
    let second = s.claim_skip_locked(1).unwrap().claimed.remove(0);
    assert_eq!(second.event.id, id);
    assert_ne!(first.token, second.token);
    // The owner matches, but the token does not: the late ack of the first attempt is fenced off.
    assert_eq!(s.ack(first.token, &[(id, Some("late".into()))]).unwrap(), 0);
    assert_eq!(s.release_for_retry(first.token, &[id], "late failure").unwrap(), 0);
    assert_eq!(s.fail(first.token, &[id], "late failure").unwrap(), 0);
    assert_eq!(db.count("SENDING"), 1);
    assert_eq!(s.ack(second.token, &[(id, Some("M2".into()))]).unwrap(), 1);
    let (status, msg): (String, Option<String>) = db
        .conn()
        .query_first("SELECT status, broker_msg_id FROM t_event_record")
        .unwrap()
        .unwrap();
    assert_eq!((status.as_str(), msg.as_deref()), ("SUCCESS", Some("M2")));
}

/// A rolling upgrade: a seed-era publisher (the article's statements, verbatim) runs beside
/// this relay on one table. Our instance stalls past its lease; the seed's `reclaimStuck` returns
/// its rows to WAIT (it never touches `claim_token`) and a seed instance claims them (it never
/// writes the token). Our late transitions must change none of those rows, and the seed's
/// `markSuccess` must still find each one.
#[test]
fn a_seed_publisher_that_takes_over_a_stalled_claim_is_not_overwritten_by_our_late_transitions() {
    let db = TestDb::new("seedfence");
    let ids = db.seed(3);
    let mut c = db.conn();
    // Rows that have been waiting a while (the seed's scan compares with second-precision NOW()).
    c.query_drop("UPDATE t_event_record SET next_retry_time = NOW(3) - INTERVAL 1 MINUTE")
        .unwrap();
    let cfg = db.config();
    let ours = store(&cfg, "outboxd-9000-abcdef");
    let claim = ours.claim_skip_locked(10).unwrap();
    assert_eq!(claim.claimed.len(), 3);
    let token = claim.claimed[0].token;
    // Our instance stalls (GC, SIGSTOP) for 11 minutes: its claims look 11 minutes old, and
    // their lease's end (`next_retry_time`) is as far in the past.
    c.query_drop(
        "UPDATE t_event_record SET claimed_at = claimed_at - INTERVAL 11 MINUTE, \
         next_retry_time = next_retry_time - INTERVAL 11 MINUTE",
    )
    .unwrap();

    // The seed instance: reclaimStuck (lease 10 min), scan, claim each candidate.
    let seed_owner = "order-8083-a1b2c3";
    c.exec_drop(
        "UPDATE t_event_record SET status = 'WAIT', claim_owner = NULL, claimed_at = NULL, update_time = NOW() \
         WHERE status = 'SENDING' AND claimed_at < DATE_SUB(NOW(), INTERVAL ? MINUTE)",
        (10,),
    )
    .unwrap();
    assert_eq!(
        c.affected_rows(),
        3,
        "the seed's reclaimStuck takes the stalled rows back"
    );
    let candidates: Vec<Row> = c
        .exec(
            "SELECT * FROM t_event_record WHERE status = 'WAIT' AND next_retry_time <= NOW() \
             ORDER BY next_retry_time ASC LIMIT ?",
            (20,),
        )
        .unwrap();
    assert_eq!(candidates.len(), 3);
    for row in candidates {
        let id: u64 = row.get("id").unwrap();
        c.exec_drop(
            "UPDATE t_event_record SET status = 'SENDING', claim_owner = ?, claimed_at = NOW() \
             WHERE id = ? AND status = 'WAIT'",
            (seed_owner, id),
        )
        .unwrap();
        assert_eq!(c.affected_rows(), 1, "the seed claims event {id}");
    }
    let tokens: Vec<Option<u64>> = c.query("SELECT claim_token FROM t_event_record ORDER BY id").unwrap();
    assert!(
        tokens.iter().all(|t| *t == Some(token)),
        "the seed's statements leave our token in place: {tokens:?}"
    );

    // Our instance resumes: every late transition under the old claim changes nothing.
    assert_eq!(ours.renew(token, &ids).unwrap(), 0, "late renew");
    assert_eq!(
        ours.release_unsent(token, &ids, "late release").unwrap(),
        0,
        "late release"
    );
    assert_eq!(
        ours.release_for_retry(token, &ids, "late retry").unwrap(),
        0,
        "late retry"
    );
    assert_eq!(ours.fail(token, &ids, "late fail").unwrap(), 0, "late fail");
    let acks: Vec<(u64, Option<String>)> = ids.iter().map(|id| (*id, Some("LATE".into()))).collect();
    assert_eq!(ours.ack(token, &acks).unwrap(), 0, "late ack");
    let rows = db.rows();
    assert!(
        rows.iter()
            .all(|(_, st, rc, owner)| st == "SENDING" && *rc == 0 && owner.as_deref() == Some(seed_owner)),
        "the seed instance still owns its claims untouched: {rows:?}"
    );

    // The seed's markSuccess finds each row it owns.
    for id in &ids {
        c.exec_drop(
            "UPDATE t_event_record SET status = 'SUCCESS', update_time = NOW() \
             WHERE id = ? AND status = 'SENDING' AND claim_owner = ?",
            (id, seed_owner),
        )
        .unwrap();
        assert_eq!(c.affected_rows(), 1, "the seed's markSuccess of event {id}");
    }
    assert_eq!(db.count("SUCCESS"), 3);
}

fn wait_reclaim(s: &Store) -> u64 {
    let mut n = 0;
    // claimed_at has millisecond precision: the row is expired once the DB clock moves past it.
    assert!(wait_until(Duration::from_secs(5), || {
        let r = s.reclaim_expired(100).unwrap();
        n = r.returned + r.dead.len() as u64;
        n > 0
    }));
    n
}

#[test]
fn retry_count_is_incremented_in_sql_and_backoff_follows_the_db_clock() {
    let db = TestDb::new("backoff");
    let id = db.seed(1)[0];
    let mut cfg = db.config();
    cfg.backoff.policy = BackoffPolicy::Quadratic;
    cfg.backoff.base = Duration::from_millis(1000);
    let s = store(&cfg, "backoff-1-000000");
    for n in 1u64..=3 {
        let c = s.claim_skip_locked(1).unwrap().claimed.remove(0);
        assert_eq!(c.event.attempt as u64, n - 1);
        assert_eq!(s.release_for_retry(c.token, &[id], "boom").unwrap(), 1);
        let (rc, delay_ms, status): (u32, i64, String) = db
            .conn()
            .query_first(
                "SELECT retry_count, TIMESTAMPDIFF(MICROSECOND, update_time, next_retry_time) DIV 1000, status FROM t_event_record",
            )
            .unwrap()
            .unwrap();
        assert_eq!(rc as u64, n);
        assert_eq!(status, "WAIT");
        assert_eq!(delay_ms as u64, n * n * 1000, "attempt {n}");
        // Make it due again without waiting for the backoff.
        db.conn()
            .query_drop("UPDATE t_event_record SET next_retry_time = NOW(3)")
            .unwrap();
    }
}

#[test]
fn exponential_backoff_is_capped() {
    let db = TestDb::new("expo");
    let id = db.seed(1)[0];
    let mut cfg = db.config();
    cfg.backoff.policy = BackoffPolicy::Exponential;
    cfg.backoff.base = Duration::from_millis(100);
    cfg.backoff.max = Duration::from_millis(350);
    let s = store(&cfg, "expo-1-000000");
    let mut seen = Vec::new();
    for _ in 0..4 {
        let c = s.claim_skip_locked(1).unwrap().claimed.remove(0);
        s.release_for_retry(c.token, &[id], "boom").unwrap();
        let d: i64 = db
            .conn()
            .query_first("SELECT TIMESTAMPDIFF(MICROSECOND, update_time, next_retry_time) DIV 1000 FROM t_event_record")
            .unwrap()
            .unwrap();
        seen.push(d);
        db.conn()
            .query_drop("UPDATE t_event_record SET next_retry_time = NOW(3)")
            .unwrap();
    }
    assert_eq!(seen, vec![100, 200, 350, 350]);
}

#[test]
fn a_row_that_keeps_killing_its_sender_ends_fail_through_reclaims() {
    let db = TestDb::new("poison");
    let id = db.seed(1)[0];
    let mut cfg = db.config();
    cfg.max_retry = 3;
    cfg.lease = Duration::ZERO;
    let s = store(&cfg, "doomed-1-000000");
    let mut dead = Vec::new();
    for round in 0..=3 {
        // The instance claims and dies before acking: the only way back is the lease.
        let c = s.claim_skip_locked(1).unwrap();
        assert_eq!(c.claimed.len(), 1, "round {round}");
        let mut got = None;
        assert!(wait_until(Duration::from_secs(5), || {
            let r = s.reclaim_expired(10).unwrap();
            let hit = r.returned > 0 || !r.dead.is_empty();
            if hit {
                got = Some(r);
            }
            hit
        }));
        let r = got.unwrap();
        if round < 3 {
            assert_eq!((r.returned, r.dead.len()), (1, 0), "round {round}");
        } else {
            dead = r.dead;
        }
    }
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].id, id);
    assert_eq!(dead[0].retry_count, 4);
    let rows = db.rows();
    assert_eq!(rows[0].1, "FAIL");
    assert_eq!(rows[0].2, 4);
    assert!(s.claim_skip_locked(1).unwrap().claimed.is_empty());
}

#[test]
fn a_row_that_keeps_killing_its_held_round_ends_fail_through_recoveries() {
    let db = TestDb::new("poison_held");
    let id = db.seed(1)[0];
    let mut cfg = db.config();
    cfg.max_retry = 3;
    let s = store(&cfg, "doomed-2-000000");
    let mut dead = Vec::new();
    for round in 0..=3 {
        // The round claims and dies before recording: its transaction rolls back, the row is
        // WAIT and claimable again at once, and only its journal row tells what happened.
        let (c, claim) = s.claim_held(1, None).unwrap();
        assert_eq!(c.claimed.len(), 1, "round {round}");
        drop(claim);
        assert_eq!(db.rows()[0].1, "WAIT");
        // The journal row must be older than the grace (here 0): its `claimed_at` has
        // millisecond precision, so the first call may come within the same millisecond.
        let mut got = None;
        assert!(wait_until(Duration::from_secs(5), || {
            let r = s.recover_lost_claims(Duration::ZERO, 10).unwrap();
            let hit = r.rounds > 0;
            if hit {
                got = Some(r);
            }
            hit
        }));
        let r = got.unwrap();
        assert_eq!((r.rounds, r.events), (1, 1), "round {round}");
        // Its relay, asking after an error, learns that the round did not commit.
        assert!(!s.held_round_committed(c.claimed[0].token).unwrap());
        if round < 3 {
            assert_eq!((r.returned, r.dead.len()), (1, 0), "round {round}");
        } else {
            dead = r.dead;
        }
    }
    assert_eq!(dead.len(), 1);
    assert_eq!((dead[0].id, dead[0].retry_count), (id, 4));
    let rows = db.rows();
    assert_eq!((rows[0].1.as_str(), rows[0].2), ("FAIL", 4));
    let audits: u64 = db
        .conn()
        .exec_first(
            "SELECT COUNT(*) FROM outbox_audit WHERE event_id = ? AND action = 'claim-lost' AND actor = 'doomed-2-000000'",
            (id,),
        )
        .unwrap()
        .unwrap();
    assert_eq!(audits, 4);
    let (c, claim) = s.claim_held(1, None).unwrap();
    assert!(c.claimed.is_empty() && claim.is_none());
}

#[test]
fn a_live_held_round_is_not_taken_for_a_lost_one() {
    let db = TestDb::new("held_live");
    db.seed(3);
    let cfg = db.config();
    let s = store(&cfg, "alive-1-000000");
    let (c, claim) = s.claim_held(10, None).unwrap();
    assert_eq!(c.claimed.len(), 3);
    let token = c.claimed[0].token;
    assert!(!s.held_round_committed(token).unwrap(), "open, not committed");
    // The round's transaction holds its journal row: a recovery, however late, skips it.
    let r = s.recover_lost_claims(Duration::ZERO, 10).unwrap();
    assert_eq!(r, outbox::store::Recovered::default());
    // Another claimer skips the locked rows.
    let other = store(&cfg, "other-1-000000");
    let (c2, claim2) = other.claim_held(10, None).unwrap();
    assert!(c2.claimed.is_empty() && claim2.is_none());
    let o = outbox::store::Outcomes {
        sent: c.claimed.iter().map(|x| (x.event.id, None, 0)).collect(),
        ..Default::default()
    };
    let done = s.settle_held(claim.unwrap(), &o).unwrap();
    // Test configs keep sent rows: SUCCESS, stamped with the round's owner and token.
    assert_eq!(done.succeeded, 3);
    assert_eq!(db.count("SUCCESS"), 3);
    let journal: u64 = db
        .conn()
        .query_first("SELECT COUNT(*) FROM outbox_claim")
        .unwrap()
        .unwrap();
    assert_eq!(journal, 0);
    // What a relay whose connection dropped after the COMMIT learns when it asks.
    assert!(s.held_round_committed(token).unwrap());
}

#[test]
fn insert_statement_is_the_one_the_bindings_use() {
    let db = TestDb::new("insert");
    let sql = outbox::insert_statement("t_event_record").unwrap();
    let refused = outbox::insert_statement("t_event_record; DROP TABLE x")
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("table") && refused.contains("DROP TABLE x"),
        "{refused}"
    );
    assert_eq!(
        outbox::INSERT_PARAMS,
        &["biz_no", "event_type", "payload", "topic", "tag", "headers"]
    );
    assert_eq!(
        outbox::INSERT_SCHEDULED_PARAMS,
        &[
            "biz_no",
            "event_type",
            "payload",
            "topic",
            "tag",
            "headers",
            "deliver_at_ms",
            "delay_ms"
        ]
    );
    // An event due now leaves its due time to the column's default; a scheduled one computes it.
    assert!(!sql.contains("next_retry_time"), "{sql}");
    let scheduled = outbox::insert_scheduled_statement("t_event_record").unwrap();
    assert!(scheduled.contains("next_retry_time"), "{scheduled}");
    let row = (
        "ORD-9",
        "ORDER_PAID",
        b"{}".to_vec(),
        Some("T1"),
        None::<String>,
        Some("{\"k\":\"v\"}"),
    );
    let mut c = db.conn();
    c.exec_drop(&sql, row.clone()).unwrap();
    let (biz, ty, payload, topic, tag, headers) = row;
    c.exec_drop(
        &scheduled,
        (biz, ty, payload, topic, tag, headers, None::<i64>, Some(3_600_000i64)),
    )
    .unwrap();
    // Due at its INSERT (the default's NOW(3)), and an hour after it.
    let due: Vec<i64> = c
        .query("SELECT TIMESTAMPDIFF(SECOND, create_time, next_retry_time) FROM t_event_record ORDER BY id")
        .unwrap();
    assert_eq!(due, [0, 3600]);
    let s = store(&db.config(), "ins-1-000000");
    let c = s.claim_skip_locked(2).unwrap().claimed;
    assert_eq!(c.len(), 1, "only the first is due");
    assert_eq!(c[0].event.topic, "T1");
    assert_eq!(c[0].event.headers.get("k").map(String::as_str), Some("v"));
    assert_eq!(c[0].event.payload, b"{}");
}

/// A lease claim sets `next_retry_time` to its lease's end and a renew moves it on, so the
/// reclaim walks the scan's index; `claimed_at` still decides, so a row claimed by the seed's
/// publisher (which leaves `next_retry_time` in the past) comes back only once its lease is over.
#[test]
fn the_reclaim_takes_expired_leases_only_whoever_claimed_them() {
    let db = TestDb::new("leaseend");
    let ids = db.seed(3);
    let mut cfg = db.config();
    cfg.lease = Duration::from_secs(60);
    let s = store(&cfg, "outboxd-1-abcdef");
    let ours = s.claim_skip_locked(1).unwrap().claimed.remove(0);
    let mut c = db.conn();
    let lease_left = |c: &mut mysql::PooledConn, id: u64| -> i64 {
        c.exec_first(
            "SELECT TIMESTAMPDIFF(SECOND, NOW(3), next_retry_time) FROM t_event_record WHERE id = ?",
            (id,),
        )
        .unwrap()
        .unwrap()
    };
    assert!((58..=60).contains(&lease_left(&mut c, ours.event.id)));
    // A seed-style claim of the other two: one just now, one eleven minutes ago.
    c.exec_drop(
        "UPDATE t_event_record SET status = 'SENDING', claim_owner = 'order-8083-a1b2c3', claimed_at = NOW(3), \
         next_retry_time = NOW(3) - INTERVAL 1 HOUR WHERE id IN (?, ?)",
        (ids[1], ids[2]),
    )
    .unwrap();
    c.exec_drop(
        "UPDATE t_event_record SET claimed_at = NOW(3) - INTERVAL 11 MINUTE WHERE id = ?",
        (ids[2],),
    )
    .unwrap();
    let r = s.reclaim_expired(100).unwrap();
    assert_eq!((r.returned, r.dead.len()), (1, 0), "only the seed claim past its lease");
    let back: Vec<u64> = c.query("SELECT id FROM t_event_record WHERE status = 'WAIT'").unwrap();
    assert_eq!(back, vec![ids[2]]);
    // Our lease, renewed, ends a lease from now again; acked, the row's time is its sending.
    c.exec_drop(
        "UPDATE t_event_record SET next_retry_time = NOW(3) + INTERVAL 1 SECOND WHERE id = ?",
        (ours.event.id,),
    )
    .unwrap();
    assert_eq!(s.renew(ours.token, &[ours.event.id]).unwrap(), 1);
    assert!((58..=60).contains(&lease_left(&mut c, ours.event.id)));
    assert_eq!(s.ack(ours.token, &[(ours.event.id, None)]).unwrap(), 1);
    assert!(lease_left(&mut c, ours.event.id) <= 0);
}

/// Regression: the reclaim's read of expired leases once locked its range with `FOR UPDATE SKIP
/// LOCKED`, and InnoDB then also locks the first index entry past the range (with no lease
/// expired: the oldest due WAIT row) until the reclaim's transaction ends; a claim running
/// meanwhile skipped that row (a held stop then reported 18 released of 19, a send order began
/// with the second row). The candidates are now read without a lock and locked by primary key.
#[test]
fn a_claim_during_a_reclaim_takes_every_due_row_the_oldest_first() {
    let db = TestDb::new("reclaimlock");
    let ids = db.seed(20);
    let cfg = db.config();
    let reclaimer = store(&cfg, "outboxd-1-reclaim");
    let claimer = store(&cfg, "outboxd-2-claimer");
    // The reclaim's transaction, open: its candidates read, nothing expired.
    let mut conn = db.conn();
    let mut tx = conn.start_transaction(TxOpts::default()).unwrap();
    let candidates: Vec<u64> = tx.query(reclaimer.reclaim_sql(50)).unwrap();
    assert!(candidates.is_empty());
    let round = claimer.claim_skip_locked(20).unwrap();
    let claimed: Vec<u64> = round.claimed.iter().map(|c| c.event.id).collect();
    assert_eq!(claimed, ids, "every due row, in order, none skipped");
    tx.commit().unwrap();
}
