//! A relay that cannot make progress says so: claims or the state changes after sends failing
//! again and again (here: a column too small for what the relay writes) show in the stats, in
//! `Relay::stalled` and in `Relay::health`, and clear once the cause is fixed.

use std::time::Duration;

use mysql::prelude::Queryable;

use crate::support::{wait_until, Recorder, TestDb};
use outbox::Relay;

const LONG: Duration = Duration::from_secs(30);

#[test]
fn claims_that_keep_failing_stall_the_relay_loudly_until_the_cause_is_fixed() {
    let db = TestDb::new("stallclaim");
    let mut cfg = db.config();
    // A claim that writes (under a lease): held claims write nothing until the sends are recorded.
    cfg.claim_strategy = outbox::ClaimStrategy::SkipLocked;
    cfg.instance_id = Some("stall-claims-instance-1".into());
    let rec = Recorder::new();
    let relay = Relay::start(cfg, rec.clone()).unwrap();
    assert_eq!(relay.stalled(), None);
    // The column shrinks under the running relay: every claim now fails (1406, data too long).
    db.conn()
        .query_drop("ALTER TABLE t_event_record MODIFY claim_owner VARCHAR(8) NULL")
        .unwrap();
    let ids = db.seed(5);
    assert!(
        wait_until(LONG, || relay.counters().claim_failures_in_a_row >= 3),
        "claims fail in a row: {:?}",
        relay.counters()
    );
    let s = relay.counters();
    let why = s.stalled.clone().expect("stalled with a reason");
    eprintln!("stalled: {why}");
    assert!(why.contains("claiming") && why.contains("claim_owner"), "{why}");
    assert!(relay.stalled().is_some());
    let json: serde_json::Value = serde_json::from_str(&s.to_json()).unwrap();
    assert!(
        json["stalled"].as_str().is_some_and(|w| w.contains("claim_owner")),
        "{json}"
    );
    assert!(json["claim_failures_in_a_row"].as_u64().unwrap() >= 3, "{json}");
    assert!(!relay.health().0, "health is not OK while stalled");
    assert_eq!(rec.total_sent(), 0);
    // Fixed: claims succeed, the rows go out, the stall clears and health is OK again.
    db.conn()
        .query_drop("ALTER TABLE t_event_record MODIFY claim_owner VARCHAR(128) NULL")
        .unwrap();
    assert!(
        wait_until(LONG, || db.count("SUCCESS") == ids.len() as u64),
        "relayed after the fix: {:?}",
        db.rows()
    );
    let s = relay.counters();
    assert_eq!(s.claim_failures_in_a_row, 0);
    assert_eq!(s.stalled, None);
    assert!(s.since_last_claim.is_some());
    assert!(relay.health().0);
    relay.stop(Duration::from_secs(5));
}

#[test]
fn acks_that_keep_failing_stall_the_relay_loudly_until_the_cause_is_fixed() {
    let db = TestDb::new("stallack");
    let mut cfg = db.config();
    cfg.instance_id = Some("stall-acks-1".into());
    let rec = Recorder::new();
    let relay = Relay::start(cfg, rec.clone()).unwrap();
    // Claims work, but every ack fails: the broker's message id no longer fits (1406).
    db.conn()
        .query_drop("ALTER TABLE t_event_record MODIFY broker_msg_id VARCHAR(2) NULL")
        .unwrap();
    let ids = db.seed(3);
    assert!(
        wait_until(LONG, || relay.counters().write_failures_in_a_row >= 5),
        "acks fail in a row: {:?}",
        relay.counters()
    );
    let why = relay.stalled().expect("stalled with a reason");
    eprintln!("stalled: {why}");
    assert!(why.contains("ack") && why.contains("broker_msg_id"), "{why}");
    assert!(!relay.health().0, "health is not OK while stalled");
    assert_eq!(db.count("SUCCESS"), 0);
    db.conn()
        .query_drop("ALTER TABLE t_event_record MODIFY broker_msg_id VARCHAR(128) NULL")
        .unwrap();
    // The worker's retries (within the lease) now succeed.
    assert!(
        wait_until(LONG, || db.count("SUCCESS") == ids.len() as u64),
        "acked after the fix: {:?}",
        db.rows()
    );
    assert!(wait_until(LONG, || relay.stalled().is_none()), "{:?}", relay.stalled());
    assert_eq!(relay.counters().write_failures_in_a_row, 0);
    assert!(relay.health().0);
    relay.stop(Duration::from_secs(5));
}

/// A database user of its own, with rights on the outbox table only (table-level rights apply
/// to open connections at their next statement), dropped at the end.
struct TableUser {
    admin: mysql::Pool,
    name: String,
}

impl Drop for TableUser {
    fn drop(&mut self) {
        if let Ok(mut c) = self.admin.get_conn() {
            let _ = c.query_drop(format!("DROP USER IF EXISTS '{}'@'%'", self.name));
        }
    }
}

#[test]
fn a_revoked_update_right_stalls_the_relay_until_it_is_granted_again() {
    let db = TestDb::new("stallgrant");
    let user = TableUser {
        admin: db.pool.clone(),
        name: format!("stall{:08x}", rand::random::<u32>()),
    };
    let mut admin = db.conn();
    admin
        .query_drop(format!("CREATE USER '{}'@'%' IDENTIFIED BY 'pw'", user.name))
        .unwrap();
    let table = format!("{}.t_event_record", db.name);
    admin
        .query_drop(format!(
            "GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO '{}'@'%'",
            user.name
        ))
        .unwrap();
    let mut cfg = db.config();
    cfg.db_url = format!(
        "{}/{}",
        crate::support::server_url().replacen("mysql://root@", &format!("mysql://{}:pw@", user.name), 1),
        db.name
    );
    cfg.instance_id = Some("stall-grant-1".into());
    cfg.claim_strategy = outbox::ClaimStrategy::SkipLocked;
    let rec = Recorder::new();
    let relay = Relay::start(cfg, rec.clone()).unwrap();
    admin
        .query_drop(format!("REVOKE UPDATE ON {table} FROM '{}'@'%'", user.name))
        .unwrap();
    let ids = db.seed(4);
    assert!(
        wait_until(LONG, || relay.stalled().is_some()),
        "claims fail without the right: {:?}",
        relay.counters()
    );
    let why = relay.stalled().unwrap();
    eprintln!("stalled: {why}");
    assert!(why.contains("claiming") && why.contains("denied"), "{why}");
    assert!(!relay.health().0);
    assert_eq!(rec.total_sent(), 0);
    admin
        .query_drop(format!("GRANT UPDATE ON {table} TO '{}'@'%'", user.name))
        .unwrap();
    assert!(
        wait_until(LONG, || db.count("SUCCESS") == ids.len() as u64),
        "relayed once the right is back: {:?}",
        db.rows()
    );
    assert_eq!(relay.stalled(), None);
    assert!(relay.health().0);
    relay.stop(Duration::from_secs(5));
}

#[test]
fn a_refused_delete_keeps_sent_rows_as_success_and_the_relay_goes_on() {
    let db = TestDb::new("nodelete");
    let user = TableUser {
        admin: db.pool.clone(),
        name: format!("nodel{:08x}", rand::random::<u32>()),
    };
    let mut admin = db.conn();
    admin
        .query_drop(format!("CREATE USER '{}'@'%' IDENTIFIED BY 'pw'", user.name))
        .unwrap();
    // Everything a held relay needs, but no DELETE on the outbox table.
    for (table, rights) in [
        ("t_event_record", "SELECT, INSERT, UPDATE"),
        ("outbox_claim", "SELECT, INSERT, UPDATE, DELETE"),
        ("outbox_audit", "SELECT, INSERT"),
        ("outbox_control", "SELECT"),
    ] {
        admin
            .query_drop(format!("GRANT {rights} ON {}.{table} TO '{}'@'%'", db.name, user.name))
            .unwrap();
    }
    let mut cfg = db.config();
    cfg.db_url = format!(
        "{}/{}",
        crate::support::server_url().replacen("mysql://root@", &format!("mysql://{}:pw@", user.name), 1),
        db.name
    );
    cfg.claim_strategy = outbox::ClaimStrategy::Held;
    cfg.sent_rows = outbox::SentRows::Delete;
    cfg.instance_id = Some("nodelete-1".into());
    let rec = Recorder::new();
    let relay = Relay::start(cfg, rec.clone()).unwrap();
    let ids = db.seed(6);
    assert!(
        wait_until(LONG, || db.count("SUCCESS") == ids.len() as u64),
        "sent rows kept once the DELETE is refused: {:?}",
        db.rows()
    );
    assert_eq!(rec.total_sent(), ids.len());
    assert_eq!(relay.counters().sent, ids.len() as u64);
    assert_eq!(relay.stalled(), None);
    relay.stop(Duration::from_secs(5));
}
