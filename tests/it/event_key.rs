//! The event key: every claimed row gets a dedup key unique across tables and databases, stored
//! with the row at its first claim and never changed, so every copy of an event carries the same
//! key.

use std::collections::{HashMap, HashSet};

use mysql::prelude::Queryable;

use crate::support::TestDb;
use outbox::store::Store;
use outbox::Config;

fn store(cfg: &Config, owner: &str) -> Store {
    Store::new(outbox::connect(cfg).unwrap(), cfg, owner.into())
}

fn stored_keys(db: &TestDb) -> HashMap<u64, Option<String>> {
    db.conn()
        .query_map(
            "SELECT id, event_key FROM t_event_record",
            |(id, k): (u64, Option<String>)| (id, k),
        )
        .unwrap()
        .into_iter()
        .collect()
}

#[test]
fn every_claim_strategy_stores_the_key_it_hands_out_and_a_later_claim_reuses_it() {
    let db = TestDb::new("evkey");
    let ids = db.seed(30);
    // Rows inserted without a key (a producer's own INSERT, a seed-era statement).
    db.conn()
        .query_drop("UPDATE t_event_record SET event_key = NULL")
        .unwrap();
    assert!(
        stored_keys(&db).values().all(Option::is_none),
        "no key before the first claim"
    );
    let cfg = db.config();
    let s = store(&cfg, "k1-1-000000");
    let mut first: HashMap<u64, String> = HashMap::new();
    // Ten rows by each strategy (the ordered claim on distinct keys takes a row per key).
    let rounds = [
        s.claim_skip_locked(10).unwrap(),
        s.claim_per_row(10).unwrap(),
        s.claim_ordered(10, 10).unwrap(),
    ];
    for r in &rounds {
        assert_eq!(r.claimed.len(), 10);
        for c in &r.claimed {
            first.insert(c.event.id, c.event.key.clone());
        }
    }
    assert_eq!(first.len(), 30);
    let stored = stored_keys(&db);
    for id in &ids {
        assert_eq!(
            stored[id].as_deref(),
            Some(first[id].as_str()),
            "row {id}: stored key = key handed out"
        );
    }
    let distinct: HashSet<&String> = first.values().collect();
    assert_eq!(distinct.len(), 30, "keys are distinct");
    // Back to WAIT (a retry and an unsent release), claimed again: the same keys go out.
    for r in &rounds {
        let ids: Vec<u64> = r.claimed.iter().map(|c| c.event.id).collect();
        let (half_a, half_b) = ids.split_at(5);
        s.release_unsent(r.claimed[0].token, half_a, "test").unwrap();
        s.release_unsent(r.claimed[0].token, half_b, "test").unwrap();
    }
    let mut again = 0;
    for r in [s.claim_skip_locked(15).unwrap(), s.claim_per_row(15).unwrap()] {
        for c in &r.claimed {
            assert_eq!(c.event.key, first[&c.event.id], "row {} got another key", c.event.id);
            again += 1;
        }
    }
    assert_eq!(again, 30);
    assert_eq!(stored_keys(&db).into_values().flatten().count(), 30);
}

#[test]
fn a_key_the_producer_wrote_is_kept() {
    let db = TestDb::new("evkey_own");
    db.conn()
        .query_drop(
            "INSERT INTO t_event_record (biz_no, event_type, payload, status, retry_count, next_retry_time, event_key) \
             VALUES ('ORD-1', 'T', 'x', 'WAIT', 0, NOW(3), 'producer-chosen-key')",
        )
        .unwrap();
    let s = store(&db.config(), "k2-1-000000");
    let r = s.claim_skip_locked(10).unwrap();
    assert_eq!(r.claimed.len(), 1);
    assert_eq!(r.claimed[0].event.key, "producer-chosen-key");
    let stored = stored_keys(&db);
    assert_eq!(stored.values().next().unwrap().as_deref(), Some("producer-chosen-key"));
}

#[test]
fn two_tables_with_the_same_ids_give_different_keys() {
    let a = TestDb::new("evkey_a");
    let b = TestDb::new("evkey_b");
    let ids_a = a.seed(20);
    let ids_b = b.seed(20);
    assert_eq!(ids_a, ids_b, "both tables number their rows alike");
    let keys = |db: &TestDb, owner: &str| -> HashSet<String> {
        store(&db.config(), owner)
            .claim_skip_locked(20)
            .unwrap()
            .claimed
            .into_iter()
            .map(|c| c.event.key)
            .collect()
    };
    let (ka, kb) = (keys(&a, "ka-1-000000"), keys(&b, "kb-1-000000"));
    assert_eq!(ka.len(), 20);
    assert_eq!(kb.len(), 20);
    assert!(ka.is_disjoint(&kb));
}

#[test]
fn a_relay_refuses_a_table_without_the_key_column_naming_it() {
    let db = TestDb::new("evkey_shape");
    db.conn()
        .query_drop("ALTER TABLE t_event_record DROP COLUMN event_key")
        .unwrap();
    let cfg = db.config();
    let err = outbox::Relay::builder(cfg)
        .publisher(crate::support::Recorder::new())
        .start()
        .expect_err("a table without event_key is refused");
    let text = err.to_string();
    assert!(text.contains("event_key") && text.contains("V9"), "{text}");
}

#[test]
fn the_library_insert_writes_a_key_of_its_own() {
    let db = TestDb::new("evkey_insert");
    db.seed(5);
    let keys: HashSet<String> = stored_keys(&db).into_values().map(|k| k.expect("a key")).collect();
    assert_eq!(keys.len(), 5, "distinct keys: {keys:?}");
    assert!(keys.iter().all(|k| k.len() == 36), "{keys:?}");
}

#[test]
fn a_held_round_keys_keyless_rows_and_the_next_round_sends_them_with_that_key() {
    let db = TestDb::new("evkey_held");
    let ids = db.seed(6);
    db.conn()
        .query_drop(format!(
            "UPDATE t_event_record SET event_key = NULL WHERE id <= {}",
            ids[2]
        ))
        .unwrap();
    let s = store(&db.config(), "kh-1-000000");
    // The first round sends only the rows that had a key; it stores keys for the others.
    let (round, claim) = s.claim_held(10, None).unwrap();
    let sent: Vec<u64> = round.claimed.iter().map(|c| c.event.id).collect();
    assert_eq!(sent, ids[3..].to_vec());
    s.settle_held(claim.expect("an open round"), &outbox::store::Outcomes::default())
        .unwrap();
    let stored = stored_keys(&db);
    assert!(stored.values().all(Option::is_some), "{stored:?}");
    // The next round hands out what was stored, for all six (none was recorded as sent).
    let (round, claim) = s.claim_held(10, None).unwrap();
    assert_eq!(round.claimed.len(), 6);
    for c in &round.claimed {
        assert_eq!(Some(&c.event.key), stored[&c.event.id].as_ref(), "row {}", c.event.id);
    }
    drop(claim);
}
