//! The held claim (`claim.strategy = held`): a round is one transaction that locks its rows
//! (`SELECT ... FOR UPDATE SKIP LOCKED`), holds the locks while the events are sent, records
//! every outcome and commits once. Nothing is written to a row to claim it: the locks are the
//! claim, and they end with the transaction or with its connection.
//!
//! What makes a lost round visible is its journal row in `outbox_claim`, committed (on another
//! connection) before anything is sent, then deleted by the round's own transaction: the
//! uncommitted DELETE locks it while the round lasts, and the round's COMMIT makes it final. A journal row older than a grace that nobody holds is a round whose connection died
//! while its events may have been sent: [`Store::recover_lost_claims`] counts an attempt on each
//! of its rows still pending (so a row that kills its sender ends FAIL) and audits each event as
//! `claim-lost`, so every copy sent twice is attributable.
//!
//! What bounds a round: the held connection's `wait_timeout` is the lease, so a relay that stalls
//! mid-send (a stopped process, a hung network) loses its locks when the server drops the idle
//! connection; its rows are claimable again and the journal tells what happened.

use std::fmt::Write as _;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use mysql::prelude::Queryable;
use mysql::{PooledConn, Row, TxOpts};

use super::{key_assignments, protocol_set, truncate, ClaimRound, Claimed, DeadLetter, ScanPosition, Scanned, Store};
use crate::db::held_wait_timeout;
use crate::error::Result;
use crate::event::EventId;
use crate::protocol::{self, Transition};
use crate::sql::{id_list, lit};

/// A held round's open transaction. Dropped without [`Store::settle_held`], it rolls back: the
/// rows are as they were, and the journal row (if written) is left for the recovery.
pub struct HeldClaim {
    conn: Option<PooledConn>,
    token: u64,
}

impl HeldClaim {
    pub fn token(&self) -> u64 {
        self.token
    }

    fn conn(&mut self) -> &mut PooledConn {
        self.conn.as_mut().expect("an open held claim has its connection")
    }

    fn end(mut self, statement: &str) -> Result<()> {
        let mut conn = self.conn.take().expect("an open held claim has its connection");
        conn.query_drop(statement)?;
        Ok(())
    }
}

impl Drop for HeldClaim {
    fn drop(&mut self) {
        if let Some(mut conn) = self.conn.take() {
            if let Err(e) = conn.query_drop("ROLLBACK") {
                log::debug!(
                    "held round {}: rollback failed ({e}); the connection ends it",
                    self.token
                );
            }
        }
    }
}

/// What a held round's sends came to, gathered from all its chunks, for [`Store::settle_held`].
/// A claimed row named in none of these lists is left as it was (unsent: due again at once).
#[derive(Debug, Default)]
pub struct Outcomes {
    /// Sent: the id, the broker's message id and the attempt number at the claim.
    pub sent: Vec<(EventId, Option<String>, u32)>,
    /// Failed, to be retried after the backoff; the first error stands for all.
    pub retry: Vec<EventId>,
    pub retry_error: String,
    /// Failed at their last allowed attempt: dead-lettered.
    pub fail: Vec<EventId>,
    pub fail_error: String,
    /// Not sent because their queue's broker is down (ordered sends): due again after `parked_delay`.
    pub parked: Vec<EventId>,
    pub parked_reason: String,
    pub parked_delay: Duration,
}

/// What [`Store::settle_held`] wrote.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Settled {
    /// Sent rows deleted (`sent.rows = delete`, first attempts).
    pub deleted: u64,
    /// Sent rows marked SUCCESS.
    pub succeeded: u64,
    pub retried: u64,
    pub failed: u64,
    pub parked: u64,
}

/// What [`Store::recover_lost_claims`] found and did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Recovered {
    /// Journal rows of rounds that ended without settling.
    pub rounds: u64,
    /// Their events, each audited as claim-lost.
    pub events: u64,
    /// Of those, rows still pending that were counted an attempt and are due again.
    pub returned: u64,
    /// Rows whose counted attempt was their last: dead-lettered.
    pub dead: Vec<DeadLetter>,
}

/// How long a journal row may stay unlocked before it is taken for a lost round: the time
/// between its commit and its round's lock, with a wide margin.
pub const JOURNAL_GRACE: Duration = Duration::from_secs(2);

/// Ids as ranges (`3-9,12`): a round's rows are mostly consecutive.
pub fn encode_ids(ids: &[EventId]) -> String {
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut out = String::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        let mut end = start;
        while i + 1 < sorted.len() && sorted[i + 1] == end + 1 {
            i += 1;
            end = sorted[i];
        }
        if !out.is_empty() {
            out.push(',');
        }
        if end == start {
            let _ = write!(out, "{start}");
        } else {
            let _ = write!(out, "{start}-{end}");
        }
        i += 1;
    }
    out
}

/// The inverse of [`encode_ids`]; `None` for text it did not write.
pub fn decode_ids(text: &str) -> Option<Vec<EventId>> {
    let mut ids = Vec::new();
    for part in text.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u64, u64) = (a.parse().ok()?, b.parse().ok()?);
                if b < a || b - a > 1_000_000 {
                    return None;
                }
                ids.extend(a..=b);
            }
            None => ids.push(part.parse().ok()?),
        }
    }
    Some(ids)
}

impl Outcomes {
    /// What a settle of these outcomes wrote, had every row still been pending: for a round
    /// that committed though its connection reported an error (sent rows all counted as
    /// `succeeded`: which were deleted is not known).
    pub fn as_settled(&self) -> Settled {
        Settled {
            deleted: 0,
            succeeded: self.sent.len() as u64,
            retried: self.retry.len() as u64,
            failed: self.fail.len() as u64,
            parked: self.parked.len() as u64,
        }
    }
}

impl Store {
    /// A connection for a held round: from the held pool (its sessions' `wait_timeout` is the
    /// lease), or from the main pool with the timeout set for the round.
    fn held_conn(&self) -> Result<PooledConn> {
        match &self.held_pool {
            Some(pool) => Ok(pool.get_conn()?),
            None => {
                let mut conn = self.conn()?;
                conn.query_drop(format!("SET SESSION wait_timeout = {}", self.held_wait_timeout()))?;
                Ok(conn)
            }
        }
    }

    /// The held connection's `wait_timeout`, in whole seconds: the lease, rounded up.
    pub fn held_wait_timeout(&self) -> u64 {
        held_wait_timeout(self.lease)
    }

    /// Opens a held round: locks up to `limit` due WAIT rows (strictly after `after` in scan
    /// order, or from the head), journals them, and returns them with the open transaction.
    /// Rows without an event key get one in this transaction and are not sent by this round (a
    /// key must be committed before any copy of the event carries it): the next round sends them.
    pub fn claim_held(&self, limit: usize, after: Option<&ScanPosition>) -> Result<(ClaimRound, Option<HeldClaim>)> {
        let mut claim = HeldClaim {
            conn: Some(self.held_conn()?),
            token: super::new_token(),
        };
        claim.conn().query_drop("START TRANSACTION")?;
        let rows: Vec<Row> = claim.conn().query(self.scan_sql_after(limit, true, after))?;
        if rows.is_empty() {
            claim.end("COMMIT")?;
            return Ok((ClaimRound::default(), None));
        }
        let Scanned { events, last, new_keys } = self.events_from_rows(rows);
        if !new_keys.is_empty() {
            let keys = key_assignments(events.iter().map(|(e, _)| e), &new_keys, |_| true);
            claim.conn().query_drop(format!(
                "UPDATE {t} FORCE INDEX (PRIMARY) SET {keys} WHERE id IN ({ids})",
                t = self.table,
                keys = keys.trim_start_matches(", "),
                ids = id_list(new_keys.iter().copied()),
            ))?;
        }
        let events: Vec<_> = events.into_iter().filter(|(e, _)| !new_keys.contains(&e.id)).collect();
        let round = |claimed: Vec<Claimed>| ClaimRound {
            claimed,
            last: last.clone(),
            ..ClaimRound::default()
        };
        if events.is_empty() {
            claim.end("COMMIT")?;
            return Ok((round(Vec::new()), None));
        }
        let token = claim.token;
        let ids: Vec<EventId> = events.iter().map(|(e, _)| e.id).collect();
        self.conn()?.exec_drop(
            "INSERT INTO outbox_claim (token, table_name, owner, ids, events) VALUES (?, ?, ?, ?, ?)",
            (token, &self.table, &self.owner, encode_ids(&ids), ids.len() as u64),
        )?;
        // The round's own DELETE locks the journal row until it ends: committed with the
        // round's record, or rolled back with its connection (the row is back for the recovery).
        claim
            .conn()
            .query_drop(format!("DELETE FROM outbox_claim WHERE token = {token}"))?;
        if claim.conn().affected_rows() == 0 {
            // Taken for a lost round before this one locked it (a stall longer than the grace):
            // nothing was sent; the rows stay as they are, with the attempt it counted.
            log::warn!("held round {token}: its journal row was taken before the round locked it; nothing sent");
            return Ok((round(Vec::new()), None));
        }
        let claimed = events
            .into_iter()
            .map(|(event, age)| Claimed { event, token, age })
            .collect();
        Ok((round(claimed), Some(claim)))
    }

    /// Records a held round's outcomes and commits: sent rows deleted (`sent.rows = delete`, first
    /// attempts) or marked SUCCESS, failures retried or dead-lettered, parked rows due later, the
    /// journal row deleted. An error leaves nothing written (the transaction is gone with it):
    /// the rows are claimable again and the journal row is recovered as a lost round.
    pub fn settle_held(&self, mut claim: HeldClaim, o: &Outcomes) -> Result<Settled> {
        let t = &self.table;
        let mut done = Settled::default();
        let (delete, keep): (Vec<_>, Vec<_>) = o.sent.iter().partition(|(_, _, attempt)| self.deletes_sent(*attempt));
        if !delete.is_empty() {
            let sql = format!(
                "DELETE FROM {t} WHERE id IN ({}) AND {} LIMIT {}",
                id_list(delete.iter().map(|d| d.0)),
                self.guard_sql(protocol::HELD_DELETE_SENT.guard, claim.token),
                delete.len()
            );
            match claim.conn().query_drop(sql) {
                Ok(()) => done.deleted = claim.conn().affected_rows(),
                Err(e) if is_denied(&e) => {
                    // The statement failed alone; the transaction goes on. Sent rows are kept.
                    self.refuse_delete(&e);
                    done.succeeded += self.mark_sent(&mut claim, &delete)?;
                }
                Err(e) => return Err(e.into()),
            }
        }
        if !keep.is_empty() {
            done.succeeded += self.mark_sent(&mut claim, &keep)?;
        }
        let token = claim.token;
        let mut update = |transition: &Transition, ids: &[EventId], rest: String| -> Result<u64> {
            if ids.is_empty() {
                return Ok(0);
            }
            let sql = format!(
                "UPDATE {t} FORCE INDEX (PRIMARY) SET {} WHERE id IN ({}) AND {}",
                protocol_set(transition, &rest),
                id_list(ids.iter().copied()),
                self.guard_sql(transition.guard, token),
            );
            claim.conn().query_drop(sql)?;
            Ok(claim.conn().affected_rows())
        };
        done.retried = update(&protocol::HELD_RETRY, &o.retry, self.retry_assignments(&o.retry_error))?;
        done.failed = update(
            &protocol::HELD_FAIL,
            &o.fail,
            format!(
                "claim_owner = {}, claim_token = {token}, last_error = {}",
                lit(&self.owner),
                lit(&truncate(&o.fail_error))
            ),
        )?;
        done.parked = update(
            &protocol::HELD_PARK,
            &o.parked,
            super::parked_assignments(&o.parked_reason, o.parked_delay),
        )?;
        claim.end("COMMIT")?;
        Ok(done)
    }

    /// After [`Store::settle_held`] failed: whether the round's COMMIT was applied all the same
    /// (the connection dropped after the server committed). The round deleted its journal row
    /// in its own transaction, so the row is gone if and only if that transaction committed, or
    /// a recovery took the round for lost, which it audits under the round's token.
    pub fn held_round_committed(&self, token: u64) -> Result<bool> {
        let mut conn = self.conn()?;
        let journal: Option<u64> =
            conn.query_first(format!("SELECT COUNT(*) FROM outbox_claim WHERE token = {token}"))?;
        if journal.unwrap_or(0) > 0 {
            return Ok(false);
        }
        let recovered: Option<u64> = conn.query_first(format!(
            "SELECT COUNT(*) FROM outbox_audit WHERE table_name = {t} AND action = 'claim-lost' \
             AND actor = {o} AND detail LIKE {pattern}",
            t = lit(&self.table),
            o = lit(&self.owner),
            pattern = lit(&format!("held round {token} %")),
        ))?;
        Ok(recovered.unwrap_or(0) == 0)
    }

    /// Sent rows kept: SUCCESS, stamped with this round's owner and token.
    fn mark_sent(&self, claim: &mut HeldClaim, sent: &[&(EventId, Option<String>, u32)]) -> Result<u64> {
        let pairs: Vec<(EventId, Option<String>)> = sent.iter().map(|(id, m, _)| (*id, m.clone())).collect();
        let sql = format!(
            "UPDATE {t} FORCE INDEX (PRIMARY) SET {set} WHERE id IN ({ids}) AND {guard}",
            t = self.table,
            set = protocol_set(
                &protocol::HELD_SENT,
                &format!(
                    "sent_at = NOW(3), broker_msg_id = {m}, last_error = NULL, claim_owner = {owner}, \
                     claim_token = {token}, claimed_at = NOW(3)",
                    m = super::msg_id_sql(&pairs),
                    owner = lit(&self.owner),
                    token = claim.token,
                )
            ),
            ids = id_list(pairs.iter().map(|p| p.0)),
            guard = self.guard_sql(protocol::HELD_SENT.guard, claim.token),
        );
        claim.conn().query_drop(sql)?;
        Ok(claim.conn().affected_rows())
    }

    pub(super) fn refuse_delete(&self, e: &mysql::Error) {
        if !self.delete_refused.swap(true, Relaxed) {
            log::error!(
                "sent.rows = delete: the database refused the DELETE on {} ({e}); sent rows are kept as SUCCESS \
                 from now on (grant DELETE, or set sent.rows = keep)",
                self.table
            );
        }
    }

    /// Takes journal rows of held rounds that ended without settling (older than `grace`, held
    /// by no transaction): each of their rows still pending and not claimed again right now is
    /// counted an attempt (FAIL past `max.retry`); every event is audited as claim-lost; the
    /// journal row is deleted. At most `limit` rounds per call.
    pub fn recover_lost_claims(&self, grace: Duration, limit: usize) -> Result<Recovered> {
        let mut conn = self.conn()?;
        let mut tx = conn.start_transaction(TxOpts::default())?;
        let lost: Vec<(u64, String, String)> = tx.query(format!(
            "SELECT token, owner, ids FROM outbox_claim WHERE table_name = {t} \
             AND claimed_at < NOW(3) - INTERVAL {us} MICROSECOND ORDER BY claimed_at LIMIT {limit} FOR UPDATE SKIP LOCKED",
            t = lit(&self.table),
            us = grace.as_micros(),
        ))?;
        let mut found = Recovered::default();
        for (token, owner, text) in lost {
            found.rounds += 1;
            let ids = decode_ids(&text).unwrap_or_else(|| {
                log::error!("outbox_claim row {token} names its rows as {text:?}, which is not an id list; dropped");
                Vec::new()
            });
            found.events += ids.len() as u64;
            if !ids.is_empty() {
                let pending: Vec<(u64, String, String, u32)> = tx.query(format!(
                    "SELECT id, biz_no, event_type, retry_count FROM {t} FORCE INDEX (PRIMARY) \
                     WHERE id IN ({ids}) AND {guard} FOR UPDATE SKIP LOCKED",
                    t = self.table,
                    ids = id_list(ids.iter().copied()),
                    guard = self.guard_sql(protocol::LOST_ROUND.guard, token),
                ))?;
                let err = format!("claim lost: held round {token} of {owner} ended without recording its sends");
                let (back, dead): (Vec<_>, Vec<_>) = pending
                    .into_iter()
                    .partition(|r| protocol::LOST_ROUND.attempts.admits(r.3, self.max_retry));
                if !back.is_empty() {
                    tx.query_drop(format!(
                        "UPDATE {t} FORCE INDEX (PRIMARY) SET {set} WHERE id IN ({ids})",
                        t = self.table,
                        set = protocol_set(&protocol::LOST_ROUND, &format!("last_error = {}", lit(&truncate(&err)))),
                        ids = id_list(back.iter().map(|r| r.0)),
                    ))?;
                    found.returned += back.len() as u64;
                }
                if !dead.is_empty() {
                    let last = format!("{err}, on the last allowed attempt");
                    tx.query_drop(format!(
                        "UPDATE {t} FORCE INDEX (PRIMARY) SET {set} WHERE id IN ({ids})",
                        t = self.table,
                        set = protocol_set(
                            &protocol::LOST_ROUND_LAST,
                            &format!("last_error = {}", lit(&truncate(&last)))
                        ),
                        ids = id_list(dead.iter().map(|r| r.0)),
                    ))?;
                    found
                        .dead
                        .extend(dead.into_iter().map(|(id, biz_no, event_type, rc)| DeadLetter {
                            id,
                            biz_no,
                            event_type,
                            retry_count: rc + 1,
                            last_error: last.clone(),
                        }));
                }
                let detail = lit(&format!(
                    "held round {token} ended without recording its sends: the event may have been sent (a duplicate follows)"
                ));
                let mut values = String::new();
                for id in &ids {
                    if !values.is_empty() {
                        values.push(',');
                    }
                    let _ = write!(
                        values,
                        "({t}, {id}, 'claim-lost', {o}, {detail})",
                        t = lit(&self.table),
                        o = lit(&owner)
                    );
                }
                tx.query_drop(format!(
                    "INSERT INTO outbox_audit (table_name, event_id, action, actor, detail) VALUES {values}"
                ))?;
            }
            tx.query_drop(format!("DELETE FROM outbox_claim WHERE token = {token}"))?;
        }
        tx.commit()?;
        Ok(found)
    }
}

/// Whether the server refused the statement for want of a privilege (1142, 1143, 1044, 1045).
pub(super) fn is_denied(e: &mysql::Error) -> bool {
    matches!(e, mysql::Error::MySqlError(m) if matches!(m.code, 1142 | 1143 | 1044 | 1045))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_travel_as_ranges() {
        let ids = [9, 3, 4, 5, 12, 7, 6, 14, 15];
        let text = encode_ids(&ids);
        assert_eq!(text, "3-7,9,12,14-15");
        let mut sorted = ids.to_vec();
        sorted.sort_unstable();
        assert_eq!(decode_ids(&text), Some(sorted));
        assert_eq!(decode_ids(""), Some(vec![]));
        assert_eq!(decode_ids("3-x"), None);
        assert_eq!(decode_ids("9-3"), None);
    }
}
