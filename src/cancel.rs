//! Cancelling events before they leave (`docs/scheduling.md`): by id, or by `biz_no` (and
//! type). A cancel racing a relay has exactly one outcome per event, reported to the caller:
//! its locking read waits for a held round's transaction to end (the round's row locks are its
//! claim), so the event is either still pending then, and deleted by the cancel
//! ([`protocol::CANCEL`]), or sent by that round; a row a lease claim has made SENDING is in
//! flight and will be sent. Every cancel is audited (`outbox_audit`, action `cancel`), which
//! also lets a second cancel of the same event say it was cancelled already.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use mysql::prelude::Queryable;
use mysql::{Pool, TxOpts};

use crate::config::table_name;
use crate::error::{Error, Result};
use crate::event::EventId;
use crate::protocol::{self, GuardContext};
use crate::sql::lit;

/// Most events one cancel takes (by `biz_no`: the first ones by id).
pub const MAX_CANCEL: usize = 10_000;

/// What a cancel did to one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelOutcome {
    /// Deleted before it was sent. `attempts`: failed attempts made before (a timed-out one may
    /// have reached the broker, as for any retry).
    Cancelled { attempts: u32 },
    /// A cancel before this one (audited) removed it.
    AlreadyCancelled,
    /// Claimed by a relay (SENDING under a lease): it will be sent.
    InFlight,
    /// Sent (its row kept as SUCCESS, or deleted as sent while this cancel waited for it).
    AlreadySent,
    /// Dead-lettered (FAIL): not sent; `outboxd dead-letters discard` removes it.
    DeadLettered,
    /// Not in the table and never cancelled: sent and deleted (`sent.rows = delete`), purged by
    /// retention, discarded, or never committed.
    Gone,
}

impl CancelOutcome {
    pub fn name(self) -> &'static str {
        match self {
            CancelOutcome::Cancelled { .. } => "cancelled",
            CancelOutcome::AlreadyCancelled => "already cancelled",
            CancelOutcome::InFlight => "in flight",
            CancelOutcome::AlreadySent => "already sent",
            CancelOutcome::DeadLettered => "dead-lettered",
            CancelOutcome::Gone => "gone",
        }
    }

    /// The code the C ABI, JNI and Go report (stable).
    pub fn code(self) -> i32 {
        match self {
            CancelOutcome::Cancelled { .. } => 0,
            CancelOutcome::AlreadyCancelled => 1,
            CancelOutcome::InFlight => 2,
            CancelOutcome::AlreadySent => 3,
            CancelOutcome::DeadLettered => 4,
            CancelOutcome::Gone => 5,
        }
    }
}

/// What one cancel call did, event by event (by id).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CancelReport {
    pub outcomes: BTreeMap<EventId, CancelOutcome>,
}

impl CancelReport {
    pub fn cancelled(&self) -> usize {
        self.outcomes
            .values()
            .filter(|o| matches!(o, CancelOutcome::Cancelled { .. }))
            .count()
    }

    /// `cancelled 2, in flight 1` (outcomes that occurred, in a fixed order).
    pub fn summary(&self) -> String {
        let mut counts: BTreeMap<i32, (&str, usize)> = BTreeMap::new();
        for o in self.outcomes.values() {
            counts.entry(o.code()).or_insert((o.name(), 0)).1 += 1;
        }
        if counts.is_empty() {
            return "no event matched".into();
        }
        counts
            .values()
            .map(|(name, n)| format!("{name} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    pub fn to_json(&self) -> String {
        serde_json::json!({
            "cancelled": self.cancelled(),
            "events": self.outcomes.iter().map(|(id, o)| {
                let mut v = serde_json::json!({"id": id, "outcome": o.name()});
                if let CancelOutcome::Cancelled { attempts } = o {
                    v["attempts"] = (*attempts).into();
                }
                v
            }).collect::<Vec<_>>(),
        })
        .to_string()
    }
}

/// Cancels the events `ids` of `table` that are still pending; audited as done by `actor`. An
/// id the table never issued (beyond its `AUTO_INCREMENT`) is an error naming it, and nothing
/// is changed.
pub fn cancel_ids(pool: &Pool, table: &str, ids: &[EventId], actor: &str) -> Result<CancelReport> {
    let t = table_name("table", table)?;
    if ids.is_empty() {
        return Ok(CancelReport::default());
    }
    if ids.len() > MAX_CANCEL {
        return Err(invalid(format!(
            "{} ids, more than {MAX_CANCEL} in one cancel",
            ids.len()
        )));
    }
    let mut conn = pool.get_conn()?;
    let next: Option<Option<u64>> = conn.exec_first(
        "SELECT AUTO_INCREMENT FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?",
        (&t,),
    )?;
    let next = next.flatten().unwrap_or(1);
    if let Some(id) = ids.iter().find(|id| **id == 0 || **id >= next) {
        return Err(invalid(format!(
            "{id} is not an event of {t} (its ids run from 1 to {})",
            next.saturating_sub(1)
        )));
    }
    cancel_in(&mut conn, &t, ids, actor)
}

/// Cancels the pending events of `biz_no` (and `event_type`, when given) in `table`, the first
/// [`MAX_CANCEL`] by id; audited as done by `actor`.
pub fn cancel_by_biz_no(
    pool: &Pool,
    table: &str,
    biz_no: &str,
    event_type: Option<&str>,
    actor: &str,
) -> Result<CancelReport> {
    let t = table_name("table", table)?;
    if biz_no.trim().is_empty() {
        return Err(Error::InvalidEvent {
            field: "biz_no",
            reason: "is required to cancel by business key".into(),
        });
    }
    let mut conn = pool.get_conn()?;
    let by_type = event_type
        .map(|ty| format!(" AND event_type = {}", lit(ty)))
        .unwrap_or_default();
    // `idx_biz_no (biz_no, id)`: the key's rows, pending or not (a sent one kept as SUCCESS
    // reports as already sent).
    let ids: Vec<EventId> = conn.query(format!(
        "SELECT id FROM {t} WHERE biz_no = {}{by_type} ORDER BY id LIMIT {MAX_CANCEL}",
        lit(biz_no)
    ))?;
    cancel_in(&mut conn, &t, &ids, actor)
}

fn invalid(reason: String) -> Error {
    Error::InvalidEvent { field: "id", reason }
}

fn cancel_in(conn: &mut mysql::PooledConn, t: &str, ids: &[EventId], actor: &str) -> Result<CancelReport> {
    let mut report = CancelReport::default();
    if ids.is_empty() {
        return Ok(report);
    }
    let list = crate::sql::id_list(ids.iter().copied());
    let mut tx = conn.start_transaction(TxOpts::default())?;
    // What was there before any wait (the transaction's snapshot), then the rows as they are once
    // no other transaction holds them (a locking read waits for a held round to end).
    let before: Vec<(EventId, String)> = tx.query(format!("SELECT id, status FROM {t} WHERE id IN ({list})"))?;
    let now: Vec<(EventId, String, u32)> = tx.query(format!(
        "SELECT id, status, retry_count FROM {t} WHERE id IN ({list}) FOR UPDATE"
    ))?;
    let now: BTreeMap<EventId, (String, u32)> = now.into_iter().map(|(id, st, n)| (id, (st, n))).collect();
    let before: BTreeMap<EventId, String> = before.into_iter().collect();
    let mut missing = Vec::new();
    let mut delete = Vec::new();
    for &id in ids {
        let outcome = match now.get(&id) {
            Some((st, n)) if st == protocol::Status::Wait.sql() => {
                delete.push((id, *n));
                CancelOutcome::Cancelled { attempts: *n }
            }
            Some((st, _)) if st == protocol::Status::Sending.sql() => CancelOutcome::InFlight,
            Some((st, _)) if st == protocol::Status::Success.sql() => CancelOutcome::AlreadySent,
            Some(_) => CancelOutcome::DeadLettered,
            None => {
                missing.push(id);
                match before.get(&id) {
                    // Pending a moment ago and gone now: a relay sent it (and deleted it) or a
                    // cancel took it while this one waited; the audit below tells which.
                    Some(_) => CancelOutcome::AlreadySent,
                    None => CancelOutcome::Gone,
                }
            }
        };
        report.outcomes.insert(id, outcome);
    }
    if !missing.is_empty() {
        let cancelled: Vec<EventId> = tx.query(format!(
            "SELECT DISTINCT event_id FROM outbox_audit WHERE table_name = {} AND action = 'cancel' AND event_id IN ({})",
            lit(t),
            crate::sql::id_list(missing.iter().copied())
        ))?;
        for id in cancelled {
            report.outcomes.insert(id, CancelOutcome::AlreadyCancelled);
        }
    }
    if !delete.is_empty() {
        let guard = protocol::CANCEL.guard.sql(&GuardContext::UNCLAIMED);
        let deleted = tx
            .query_iter(format!(
                "DELETE FROM {t} WHERE id IN ({}) AND {guard}",
                crate::sql::id_list(delete.iter().map(|(id, _)| *id))
            ))?
            .affected_rows();
        // The rows are locked by this transaction: nothing else changed them since the read.
        debug_assert_eq!(deleted as usize, delete.len());
        let mut rows = Vec::with_capacity(delete.len());
        for (id, attempts) in &delete {
            let mut detail = String::from("cancelled before it was sent");
            if *attempts > 0 {
                let _ = write!(detail, " (after {attempts} failed attempt(s))");
            }
            rows.push((*id, Some(detail)));
        }
        crate::admin::audit(&mut tx, t, "cancel", actor, &rows)?;
    }
    tx.commit()?;
    Ok(report)
}
