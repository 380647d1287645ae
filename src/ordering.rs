//! Per-key ordering (`ordering = per-biz-no`): the ordered claim's reads and how it picks runs.
//! The stable queue of a key lives in [`crate::queues`] (re-exported here).
//!
//! See `docs/ordering.md` for the design and its invariants. In short:
//!
//! - **The claim** is the unordered one (due WAIT rows in `idx_status_next_retry` order, `FOR
//!   UPDATE SKIP LOCKED`) followed by two set-based reads of `idx_biz_no (biz_no, status, id)`:
//!   the smallest pending id of each candidate key (a loose index scan: a few index reads per key
//!   whatever its backlog), and, for the keys whose smallest pending row is one of the candidates,
//!   the pending ids from that head to the key's last candidate (a range read as long as the run).
//!   A key's **run** is its candidates from the head on, as long as they follow each other with no
//!   pending row of the key in between. Only runs are claimed; every other candidate stays WAIT.
//!   So a round reads about as many rows as it claims, never the backlog of a key.
//! - **Heads behind the window.** A key's head that failed or was parked is due again later than
//!   the key's newer rows (and than a backlog of other keys), so the scan window can be full of
//!   rows blocked by heads it never reaches. The keys of a window whose head is WAIT but not a
//!   candidate have that head read by id (one statement); a due one joins the candidates, one
//!   still waiting is remembered until it is due, so it costs no statement per round.
//! - **One run in flight per key.** While a run is SENDING, its key's head is SENDING and no
//!   instance can claim the key's later rows. A run travels in one chunk, and the publisher sends
//!   it in id order to one queue, stopping the key at its first failure.
//! - **The queue of a key** is chosen by [`queue_index`] over a stable, ordered set of queues (the
//!   queue book, [`crate::queues`]): every queue ever seen in the topic's route, not only the
//!   live ones.

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::config::DeadHeadPolicy;
use crate::event::EventId;
pub use crate::queues::{queue_index, queue_key, QueueBook};
pub use crate::wire::QueueRef;

/// The statuses of a key's rows that hold back its later rows.
pub(crate) fn blocking_statuses(policy: DeadHeadPolicy) -> &'static str {
    match policy {
        DeadHeadPolicy::Skip => "'WAIT', 'SENDING'",
        DeadHeadPolicy::Block => "'WAIT', 'SENDING', 'FAIL'",
    }
}

/// The identity of a key as the database compares `biz_no` (its collation, trailing spaces
/// ignored): two spellings the database treats as one key get the same identity.
pub(crate) const KEY_IDENTITY_SQL: &str = "WEIGHT_STRING(RTRIM(biz_no))";

/// The smallest pending id of every key of `keys` (SQL literals), per status: a loose index scan
/// of `idx_biz_no` ("Using index for group-by"), one or two index reads per key and status.
pub(crate) fn head_sql(table: &str, statuses: &str, keys: &[String]) -> String {
    format!(
        "SELECT {KEY_IDENTITY_SQL}, status, MIN(id) FROM {table} FORCE INDEX (idx_biz_no) \
         WHERE biz_no IN ({keys}) AND status IN ({statuses}) GROUP BY biz_no, status",
        keys = keys.join(", "),
    )
}

/// The pending ids of each key between its head and its last candidate: one range of
/// `idx_biz_no` per key and status. `ranges` holds (key literal, head id, last candidate id).
pub(crate) fn run_sql(table: &str, statuses: &str, ranges: &[(String, EventId, EventId)]) -> String {
    let mut cond = String::new();
    for (key, from, to) in ranges {
        if !cond.is_empty() {
            cond.push_str(" OR ");
        }
        let _ = write!(cond, "(biz_no = {key} AND id BETWEEN {from} AND {to})");
    }
    format!(
        "SELECT {KEY_IDENTITY_SQL}, id FROM {table} FORCE INDEX (idx_biz_no) \
         WHERE status IN ({statuses}) AND ({cond})"
    )
}

/// The rows of `ids` (keys' oldest pending ids) that are WAIT, locked as the scan locks its
/// rows, with `cols` and how long each is still to wait (`wait_us`, 0 when due): the heads that
/// lie behind the scan window. A head released after a failure or a park is due again later than
/// the key's newer rows and than a backlog of other keys, so the window may never reach it.
pub(crate) fn heads_behind_sql(table: &str, cols: &str, ids: &[EventId]) -> String {
    let ids = ids.iter().map(|id| id.to_string()).collect::<Vec<_>>().join(", ");
    format!(
        "SELECT {cols}, GREATEST(0, TIMESTAMPDIFF(MICROSECOND, NOW(3), next_retry_time)) AS wait_us \
         FROM {table} WHERE id IN ({ids}) AND status = 'WAIT' FOR UPDATE SKIP LOCKED"
    )
}

/// One candidate of a round: its position in the scan, its id and its key identity.
#[derive(Debug, Clone)]
pub(crate) struct Candidate {
    pub pos: usize,
    pub id: EventId,
    pub key: Vec<u8>,
}

/// A key whose smallest pending row is one of the candidates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Head {
    pub key: Vec<u8>,
    /// Positions (in the scan) of the key's candidates, in id order; the first is the head.
    pub positions: Vec<usize>,
    pub first: EventId,
    pub last: EventId,
}

/// The keys of `candidates` whose head (smallest pending id, from `heads`) is a candidate. A key
/// missing from `heads` has no pending row the database could see: its candidates are not
/// claimed this round (they are WAIT, so this only happens if they changed meanwhile).
pub(crate) fn claimable_heads(candidates: &[Candidate], heads: &HashMap<Vec<u8>, EventId>) -> Vec<Head> {
    let mut by_key: HashMap<&[u8], Vec<&Candidate>> = HashMap::new();
    let mut order: Vec<&[u8]> = Vec::new();
    for c in candidates {
        let e = by_key.entry(c.key.as_slice()).or_default();
        if e.is_empty() {
            order.push(c.key.as_slice());
        }
        e.push(c);
    }
    let mut out = Vec::new();
    for key in order {
        let mut cs = by_key.remove(key).unwrap_or_default();
        cs.sort_by_key(|c| c.id);
        let first = cs[0].id;
        if heads.get(key) != Some(&first) {
            continue;
        }
        out.push(Head {
            key: key.to_vec(),
            positions: cs.iter().map(|c| c.pos).collect(),
            first,
            last: cs[cs.len() - 1].id,
        });
    }
    out
}

/// The run of each head: its candidates from the head on while they are exactly the key's
/// pending ids in order (`pending`: every pending id of the key from the head to its last
/// candidate), at most `run_max` long. Returns, per head, the positions of the run's rows.
pub(crate) fn runs(
    heads: &[Head],
    candidates: &[Candidate],
    pending: &HashMap<Vec<u8>, Vec<EventId>>,
    run_max: usize,
) -> Vec<Vec<usize>> {
    let run_max = run_max.max(1);
    heads
        .iter()
        .map(|h| {
            if h.positions.len() == 1 {
                return vec![h.positions[0]];
            }
            let Some(ids) = pending.get(&h.key) else {
                // The range read found nothing: the head changed meanwhile; claim nothing.
                return Vec::new();
            };
            let mut ids = ids.clone();
            ids.sort_unstable();
            h.positions
                .iter()
                .zip(ids)
                .take_while(|(&pos, id)| candidates[pos].id == *id)
                .take(run_max)
                .map(|(&pos, _)| pos)
                .collect()
        })
        .filter(|run: &Vec<usize>| !run.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(pos: usize, id: EventId, key: &str) -> Candidate {
        Candidate {
            pos,
            id,
            key: key.as_bytes().to_vec(),
        }
    }

    #[test]
    fn only_keys_whose_head_is_a_candidate_are_claimable() {
        let cs = vec![cand(0, 10, "A"), cand(1, 11, "B"), cand(2, 12, "A"), cand(3, 13, "C")];
        let heads: HashMap<Vec<u8>, EventId> = [(b"A".to_vec(), 10), (b"B".to_vec(), 5), (b"C".to_vec(), 13)]
            .into_iter()
            .collect();
        let h = claimable_heads(&cs, &heads);
        assert_eq!(h.len(), 2);
        assert_eq!(h[0].key, b"A");
        assert_eq!(h[0].positions, vec![0, 2]);
        assert_eq!((h[0].first, h[0].last), (10, 12));
        assert_eq!(h[1].key, b"C");
    }

    #[test]
    fn a_run_stops_at_the_first_pending_row_that_is_not_a_candidate() {
        // Key A: candidates 10, 12, 14; pending 10, 12, 13 (locked by someone else), 14.
        let cs = vec![cand(0, 10, "A"), cand(1, 12, "A"), cand(2, 14, "A")];
        let heads: HashMap<Vec<u8>, EventId> = [(b"A".to_vec(), 10)].into_iter().collect();
        let h = claimable_heads(&cs, &heads);
        let pending: HashMap<Vec<u8>, Vec<EventId>> = [(b"A".to_vec(), vec![14, 10, 13, 12])].into_iter().collect();
        assert_eq!(runs(&h, &cs, &pending, 100), vec![vec![0, 1]]);
        // And never longer than run_max.
        let pending: HashMap<Vec<u8>, Vec<EventId>> = [(b"A".to_vec(), vec![10, 12, 14])].into_iter().collect();
        assert_eq!(runs(&h, &cs, &pending, 2), vec![vec![0, 1]]);
        assert_eq!(runs(&h, &cs, &pending, 100), vec![vec![0, 1, 2]]);
    }
}
