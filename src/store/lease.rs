//! The lease strategy's transitions (`claim.strategy = skip-locked` and `per-row`, and ordered
//! relays): every statement after a lease claim matches the row's id, SENDING, the claim token
//! and this instance as owner; the reclaim of expired leases.

use std::time::Duration;

use mysql::prelude::Queryable;
use mysql::TxOpts;

use super::{
    dedup_join, msg_id_sql, parked_assignments, protocol_set, truncate, DeadLetter, Reclaimed, SentRows, Store,
};
use crate::error::Result;
use crate::event::EventId;
use crate::protocol::{self, Transition};
use crate::sql::{id_list, lit};

impl Store {
    /// Marks rows SUCCESS under their claim. `msg_ids` holds the broker's message id per row (or
    /// `None`). Returns how many rows were still ours; the others had lost their lease.
    pub fn ack(&self, token: u64, acks: &[(EventId, Option<String>)]) -> Result<u64> {
        if acks.is_empty() {
            return Ok(0);
        }
        let msg_id_sql = msg_id_sql(acks);
        self.transition(
            &protocol::ACK,
            token,
            acks.iter().map(|(id, _)| *id),
            &format!("sent_at = NOW(3), next_retry_time = NOW(3), broker_msg_id = {msg_id_sql}, last_error = NULL"),
        )
    }

    /// Whether a row sent at `attempt` is deleted rather than kept (`sent.rows = delete`, first
    /// attempts, while the server allows the DELETE).
    pub fn deletes_sent(&self, attempt: u32) -> bool {
        self.sent_rows == SentRows::Delete
            && attempt == 0
            && !self.delete_refused.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Deletes sent rows under their claim (`sent.rows = delete`). Returns how many were still
    /// ours. Refused by the server (no DELETE privilege), it marks them SUCCESS instead, and does
    /// so for every later send (one ERROR says why).
    pub fn delete_sent(&self, token: u64, acks: &[(EventId, Option<String>)]) -> Result<u64> {
        let ids = id_list(acks.iter().map(|a| a.0));
        if ids.is_empty() {
            return Ok(0);
        }
        let mut conn = self.conn()?;
        match conn.query_drop(format!(
            "DELETE FROM {t} WHERE id IN ({ids}) AND {guard} LIMIT {n}",
            t = self.table,
            guard = self.guard_sql(protocol::DELETE_SENT.guard, token),
            n = acks.len(),
        )) {
            Ok(()) => Ok(conn.affected_rows()),
            Err(e) if super::held::is_denied(&e) => {
                self.refuse_delete(&e);
                self.ack(token, acks)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Returns rows to WAIT after a failed attempt: `retry_count + 1` in SQL and the next try
    /// after the configured backoff on the DB clock.
    pub fn release_for_retry(&self, token: u64, ids: &[EventId], error: &str) -> Result<u64> {
        self.back_to_wait(&protocol::RETRY, token, ids, &self.retry_assignments(error))
    }

    /// Returns rows to WAIT without using an attempt (broker outage, shutdown): due at once.
    pub fn release_unsent(&self, token: u64, ids: &[EventId], reason: &str) -> Result<u64> {
        self.back_to_wait(
            &protocol::RELEASE,
            token,
            ids,
            &format!("next_retry_time = NOW(3), last_error = {}", lit(&truncate(reason))),
        )
    }

    /// Returns rows to WAIT without using an attempt, due again after `delay`: ordered events
    /// whose queue's broker is down (parked), so they are not claimed again at once.
    pub fn release_parked(&self, token: u64, ids: &[EventId], reason: &str, delay: Duration) -> Result<u64> {
        self.back_to_wait(&protocol::RELEASE, token, ids, &parked_assignments(reason, delay))
    }

    /// Returns rows held under `token` to WAIT, unowned, with `rest` (when they are due, why).
    fn back_to_wait(&self, to_wait: &Transition, token: u64, ids: &[EventId], rest: &str) -> Result<u64> {
        self.transition(
            to_wait,
            token,
            ids.iter().copied(),
            &format!("claim_owner = NULL, claimed_at = NULL, {rest}"),
        )
    }

    /// Dead-letters rows whose last allowed attempt failed.
    pub fn fail(&self, token: u64, ids: &[EventId], error: &str) -> Result<u64> {
        self.transition(
            &protocol::FAIL,
            token,
            ids.iter().copied(),
            &format!("next_retry_time = NOW(3), last_error = {}", lit(&truncate(error))),
        )
    }

    /// Extends the lease of rows still held under `token`. Returns how many still were.
    pub fn renew(&self, token: u64, ids: &[EventId]) -> Result<u64> {
        self.transition(
            &protocol::RENEW,
            token,
            ids.iter().copied(),
            &format!("claimed_at = NOW(3), {}", self.lease_end()),
        )
    }

    /// Every transition after the claim matches id, status SENDING, the claim token and this
    /// instance as `claim_owner`. The owner guards against claims that never write the token:
    /// the seed's publisher, running beside this one on the same table, reclaims a row without
    /// clearing `claim_token` and claims it without setting it, so the token alone would still
    /// match after a seed instance took the row over.
    ///
    /// The guard and the status and attempt assignments come from `transition`
    /// ([`crate::protocol`], which the model checks); `rest` adds the other columns.
    fn transition(
        &self,
        transition: &Transition,
        token: u64,
        ids: impl Iterator<Item = EventId>,
        rest: &str,
    ) -> Result<u64> {
        let ids = id_list(ids);
        if ids.is_empty() {
            return Ok(0);
        }
        let mut conn = self.conn()?;
        conn.query_drop(format!(
            "UPDATE {t} SET {set} WHERE id IN ({ids}) AND {guard}",
            t = self.table,
            set = protocol_set(transition, rest),
            guard = self.guard_sql(transition.guard, token),
        ))?;
        Ok(conn.affected_rows())
    }

    /// Returns SENDING rows whose lease (`lease.ms`) has expired to WAIT ([`Store::reclaim_sql`]).
    /// A reclaim counts as an attempt: rows that have used all their attempts go to FAIL instead,
    /// so a row that kills its sender does not loop forever. At most `limit` rows per call.
    pub fn reclaim_expired(&self, limit: usize) -> Result<Reclaimed> {
        let none = || Reclaimed {
            returned: 0,
            dead: Vec::new(),
        };
        let mut conn = self.conn()?;
        // The candidates first, outside any transaction: when no lease has expired (nearly every
        // round) that read is all the reclaim costs.
        let candidates: Vec<EventId> = conn.query(self.reclaim_sql(limit))?;
        if candidates.is_empty() {
            return Ok(none());
        }
        let mut tx = conn.start_transaction(TxOpts::default())?;
        let rows: Vec<(u64, String, String, u32, Option<String>)> = tx.query(self.reclaim_lock_sql(&candidates))?;
        if rows.is_empty() {
            tx.commit()?;
            return Ok(none());
        }
        let (back, dead): (Vec<_>, Vec<_>) = rows
            .into_iter()
            .partition(|r| protocol::RECLAIM.attempts.admits(r.3, self.max_retry));
        if !back.is_empty() {
            let owners: Vec<&str> = back.iter().filter_map(|r| r.4.as_deref()).collect();
            let err = lit(&truncate(&format!("lease expired (owner {})", dedup_join(&owners))));
            tx.query_drop(format!(
                "UPDATE {t} SET {set} WHERE id IN ({ids})",
                t = self.table,
                set = protocol_set(
                    &protocol::RECLAIM,
                    &format!(
                        "claim_owner = NULL, claimed_at = NULL, claim_token = NULL, next_retry_time = NOW(3), \
                         last_error = {err}"
                    )
                ),
                ids = id_list(back.iter().map(|r| r.0)),
            ))?;
        }
        let mut dead_letters = Vec::new();
        if !dead.is_empty() {
            let err = "lease expired on the last allowed attempt";
            tx.query_drop(format!(
                "UPDATE {t} SET {set} WHERE id IN ({ids})",
                t = self.table,
                set = protocol_set(
                    &protocol::RECLAIM_LAST,
                    &format!("next_retry_time = NOW(3), last_error = {}", lit(err))
                ),
                ids = id_list(dead.iter().map(|r| r.0)),
            ))?;
            dead_letters = dead
                .into_iter()
                .map(|(id, biz_no, event_type, rc, _)| DeadLetter {
                    id,
                    biz_no,
                    event_type,
                    retry_count: rc + 1,
                    last_error: err.into(),
                })
                .collect();
        }
        tx.commit()?;
        Ok(Reclaimed {
            returned: back.len() as u64,
            dead: dead_letters,
        })
    }
}
