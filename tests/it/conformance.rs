//! The protocol's table (`outbox::protocol`) against MariaDB: each guard's SQL matches exactly
//! the rows [`Guard::admits`] admits, and each statement of the store changes exactly the rows
//! its transition admits, the way the table says (status, attempt). The model checker
//! (`tests/model`) runs the same table, so the model and the SQL cannot drift apart unnoticed.

use std::collections::BTreeSet;

use mysql::prelude::Queryable;

use crate::support::TestDb;
use outbox::protocol::{self, Guard, GuardContext, RowView, Status, Transition};
use outbox::store::Store;
use outbox::SentRows;

const TOKEN: u64 = 7;
const OWNER: &str = "me";
const LEASE_MS: u64 = 60_000;

/// Every state a guard can tell apart.
fn views() -> Vec<RowView> {
    let mut out = Vec::new();
    for status in [Status::Wait, Status::Sending, Status::Success, Status::Fail] {
        for mine in [false, true] {
            for lease_expired in [false, true] {
                for due in [false, true] {
                    out.push(RowView {
                        status,
                        mine,
                        lease_expired,
                        due,
                    });
                }
            }
        }
    }
    out
}

/// The claim columns of a row that is, or is not, the statement's own: not its own is another
/// claim altogether, or this token under another owner (the seed's publisher took the row over
/// without writing a token), or this owner under another token (its own earlier claim).
const CLAIMS: [(bool, u64, &str); 4] = [
    (true, TOKEN, OWNER),
    (false, TOKEN + 1, "other"),
    (false, TOKEN, "other"),
    (false, TOKEN + 1, OWNER),
];

/// One row per view and claim flavour (and `retry_count`), written as the columns say it.
fn seed(db: &TestDb, retry_count: u32) -> Vec<(u64, RowView)> {
    let views: Vec<(RowView, u64, &str)> = views()
        .into_iter()
        .flat_map(|v| CLAIMS.iter().filter(move |c| c.0 == v.mine).map(move |c| (v, c.1, c.2)))
        .collect();
    let ids = db.seed(views.len());
    let mut conn = db.conn();
    for (id, (v, token, owner)) in ids.iter().zip(&views) {
        conn.query_drop(format!(
            "UPDATE t_event_record SET status = '{status}', claim_token = {token}, claim_owner = '{owner}', \
             claimed_at = NOW(3) - INTERVAL {claimed} SECOND, next_retry_time = NOW(3) + INTERVAL {next} SECOND, \
             retry_count = {retry_count} WHERE id = {id}",
            status = v.status.sql(),
            claimed = if v.lease_expired { 600 } else { 0 },
            next = if v.due { -60 } else { 3600 },
        ))
        .unwrap();
    }
    ids.into_iter().zip(views.into_iter().map(|v| v.0)).collect()
}

fn context(owner_literal: &str) -> GuardContext<'_> {
    GuardContext {
        token: TOKEN,
        owner_literal,
        lease_us: u128::from(LEASE_MS) * 1000,
    }
}

fn admitted(rows: &[(u64, RowView)], guard: &Guard) -> BTreeSet<u64> {
    rows.iter()
        .filter(|(_, v)| guard.admits(v))
        .map(|(id, _)| *id)
        .collect()
}

#[test]
fn every_guard_matches_in_sql_exactly_the_rows_the_model_admits() {
    let db = TestDb::new("conform_guard");
    let rows = seed(&db, 0);
    let ids: Vec<String> = rows.iter().map(|(id, _)| id.to_string()).collect();
    let guards = protocol::TRANSITIONS
        .iter()
        .map(|t| (t.name, t.guard))
        .chain([("scan", protocol::SCAN)]);
    for (name, guard) in guards {
        let matched: BTreeSet<u64> = db
            .conn()
            .query(format!(
                "SELECT id FROM t_event_record WHERE id IN ({}) AND {}",
                ids.join(","),
                guard.sql(&context("'me'"))
            ))
            .unwrap()
            .into_iter()
            .collect();
        assert_eq!(
            matched,
            admitted(&rows, &guard),
            "{name}: the SQL and Guard::admits disagree"
        );
    }
}

/// `(status, retry_count)` of each row, `None` when it is gone.
fn after(db: &TestDb, rows: &[(u64, RowView)]) -> Vec<Option<(String, u32)>> {
    let mut conn = db.conn();
    rows.iter()
        .map(|(id, _)| {
            conn.query_first(format!(
                "SELECT status, retry_count FROM t_event_record WHERE id = {id}"
            ))
            .unwrap()
        })
        .collect()
}

/// Runs `statement` on rows in every state and checks that exactly the rows `t` admits changed,
/// as `t` says.
fn conforms(t: &Transition, retry_count: u32, statement: impl FnOnce(&Store, &[u64])) {
    let db = TestDb::new("conform_stmt");
    let mut cfg = db.config();
    cfg.lease = std::time::Duration::from_millis(LEASE_MS);
    cfg.sent_rows = SentRows::Delete;
    let max_retry = cfg.max_retry;
    let store = Store::new(outbox::connect(&cfg).unwrap(), &cfg, OWNER.into());
    let rows = seed(&db, retry_count);
    let ids: Vec<u64> = rows.iter().map(|(id, _)| *id).collect();
    statement(&store, &ids);
    let expected = admitted(&rows, &t.guard);
    let attempts_ok = t.attempts.admits(retry_count, max_retry);
    for ((id, view), now) in rows.iter().zip(after(&db, &rows)) {
        let changed = expected.contains(id) && attempts_ok;
        let want = if changed {
            t.to.map(|st| (st.sql().to_string(), retry_count + u32::from(t.counts_attempt)))
        } else {
            Some((view.status.sql().to_string(), retry_count))
        };
        assert_eq!(now, want, "{}: row {view:?} (retry_count {retry_count})", t.name);
    }
}

fn none_msg(ids: &[u64]) -> Vec<(u64, Option<String>)> {
    ids.iter().map(|id| (*id, None)).collect()
}

#[test]
fn the_stores_statements_change_exactly_the_rows_their_transition_admits() {
    conforms(&protocol::ACK, 0, |s, ids| {
        s.ack(TOKEN, &none_msg(ids)).unwrap();
    });
    conforms(&protocol::DELETE_SENT, 0, |s, ids| {
        s.delete_sent(TOKEN, &none_msg(ids)).unwrap();
    });
    conforms(&protocol::RETRY, 0, |s, ids| {
        s.release_for_retry(TOKEN, ids, "failed").unwrap();
    });
    conforms(&protocol::RELEASE, 0, |s, ids| {
        s.release_unsent(TOKEN, ids, "broker down").unwrap();
    });
    conforms(&protocol::FAIL, 0, |s, ids| {
        s.fail(TOKEN, ids, "poison").unwrap();
    });
    conforms(&protocol::RENEW, 0, |s, ids| {
        s.renew(TOKEN, ids).unwrap();
    });
    conforms(&protocol::CANCEL, 0, |s, ids| {
        outbox::cancel::cancel_ids(s.pool(), "t_event_record", ids, "test").unwrap();
    });
    // The reclaim takes rows by their attempts: those with one left go back to WAIT, those on
    // their last to FAIL.
    let max_retry = outbox::Config::new("mysql://x@127.0.0.1/x").max_retry;
    for rc in [0, max_retry] {
        let t = if protocol::RECLAIM.attempts.admits(rc, max_retry) {
            protocol::RECLAIM
        } else {
            protocol::RECLAIM_LAST
        };
        conforms(&t, rc, |s, _| {
            s.reclaim_expired(1000).unwrap();
        });
    }
}
