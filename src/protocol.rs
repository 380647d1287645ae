//! The outbox row's protocol as data: the guards a relay's statements match a row on, and the
//! transitions they make. `store/` renders its WHERE clauses and its status and attempt
//! assignments from this table; `tests/model/` runs the same table in a model checker
//! (stateright) with several relays, crashes, stalls and a broker that loses or duplicates; and
//! `tests/it/conformance.rs` runs each guard's SQL on MariaDB against rows in every state and
//! compares what it matched with [`Guard::admits`]. A change to a guard changes the statements
//! and the model together, and a change to one side alone fails a test
//! (`docs/guarantees.md`, "The checked model").

/// A row's status (the `status` column). A deleted row (`sent.rows = delete`) has none.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Status {
    Wait,
    Sending,
    Success,
    Fail,
}

impl Status {
    pub const fn sql(self) -> &'static str {
        match self {
            Status::Wait => "WAIT",
            Status::Sending => "SENDING",
            Status::Success => "SUCCESS",
            Status::Fail => "FAIL",
        }
    }
}

/// What a guard can see of one row, from the side of the relay (or round) whose statement it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RowView {
    pub status: Status,
    /// `claim_token` and `claim_owner` are the statement's own claim.
    pub mine: bool,
    /// `claimed_at` is older than the lease.
    pub lease_expired: bool,
    /// `next_retry_time` has passed.
    pub due: bool,
}

/// A conjunction over one row. Every statement of the relay on an existing row matches the row's
/// id and its guard, nothing else: a guard that does not admit the row leaves it untouched.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Guard {
    pub status: Status,
    /// The row is under this statement's claim: its token and owner (lease claims).
    pub mine: bool,
    /// The row's lease has expired.
    pub expired: bool,
    /// The row is due.
    pub due: bool,
}

/// What a guard's SQL needs from the statement: its claim and the lease.
pub struct GuardContext<'a> {
    pub token: u64,
    /// `claim_owner` as an SQL literal (`crate::sql::lit`).
    pub owner_literal: &'a str,
    pub lease_us: u128,
}

impl GuardContext<'static> {
    /// For guards that read neither the claim nor the lease (the scan's, retention's, a held
    /// round's).
    pub const UNCLAIMED: GuardContext<'static> = GuardContext {
        token: 0,
        owner_literal: "NULL",
        lease_us: 0,
    };
}

impl Guard {
    const fn on(status: Status) -> Guard {
        Guard {
            status,
            mine: false,
            expired: false,
            due: false,
        }
    }

    /// Whether the guard matches a row in this state.
    pub fn admits(&self, row: &RowView) -> bool {
        row.status == self.status
            && (!self.mine || row.mine)
            && (!self.expired || row.lease_expired)
            && (!self.due || row.due)
    }

    /// The guard as a WHERE condition (without the id list).
    pub fn sql(&self, c: &GuardContext) -> String {
        let mut sql = format!("status = '{}'", self.status.sql());
        if self.mine {
            sql += &format!(" AND claim_token = {} AND claim_owner = {}", c.token, c.owner_literal);
        }
        if self.expired {
            sql += &format!(" AND claimed_at < NOW(3) - INTERVAL {} MICROSECOND", c.lease_us);
        }
        if self.due {
            sql += " AND next_retry_time <= NOW(3)";
        }
        sql
    }
}

/// Which rows of those a guard admits a transition takes, by the attempts they have used
/// (`retry_count` against `max.retry`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Attempts {
    Any,
    /// Rows with an attempt left after this one.
    Left,
    /// Rows on their last allowed attempt.
    Last,
}

impl Attempts {
    pub fn admits(self, retry_count: u32, max_retry: u32) -> bool {
        match self {
            Attempts::Any => true,
            Attempts::Left => retry_count < max_retry,
            Attempts::Last => retry_count >= max_retry,
        }
    }
}

/// One transition of a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Transition {
    pub name: &'static str,
    pub guard: Guard,
    pub attempts: Attempts,
    /// The status after; `None`: the row is deleted.
    pub to: Option<Status>,
    /// `retry_count = retry_count + 1`: the transition uses an attempt.
    pub counts_attempt: bool,
    /// The row's claim is taken (lease claims) or cleared by it.
    pub claim: Claim,
}

/// What a transition does to the row's claim columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Claim {
    /// Left as they are.
    Keep,
    /// Taken by this statement (token, owner, `claimed_at` now).
    Take,
    /// `claimed_at` moved to now: the lease renewed.
    Renew,
    /// Cleared (owner and `claimed_at` NULL; the reclaim clears the token too).
    Clear,
}

impl Transition {
    /// The assignments this table decides (status and the attempt), to lead the statement's SET.
    /// Empty for a transition that keeps the status and uses no attempt.
    pub fn set_sql(&self) -> String {
        let mut parts = Vec::new();
        if let Some(to) = self.to {
            if to != self.guard.status {
                parts.push(format!("status = '{}'", to.sql()));
            }
        }
        if self.counts_attempt {
            parts.push("retry_count = retry_count + 1".to_string());
        }
        parts.join(", ")
    }
}

const fn t(
    name: &'static str,
    guard: Guard,
    attempts: Attempts,
    to: Option<Status>,
    counts_attempt: bool,
    claim: Claim,
) -> Transition {
    Transition {
        name,
        guard,
        attempts,
        to,
        counts_attempt,
        claim,
    }
}

const DUE: Guard = Guard {
    due: true,
    ..Guard::on(Status::Wait)
};
const MINE: Guard = Guard {
    mine: true,
    ..Guard::on(Status::Sending)
};
/// A lease that has expired: by `claimed_at`, and past the lease's end (`next_retry_time` of a
/// SENDING row), which is the range the reclaim reads along `idx_status_next_retry`.
const EXPIRED: Guard = Guard {
    expired: true,
    due: true,
    ..Guard::on(Status::Sending)
};
/// A held round's rows: WAIT, and locked by the round's own transaction (the lock is the claim;
/// other claims skip the row).
const HELD: Guard = Guard::on(Status::Wait);

use Attempts::{Any, Last, Left};
use Status::{Fail, Sending, Success, Wait};

/// Both claims' scan: due WAIT rows, locked with `FOR UPDATE SKIP LOCKED`.
pub const SCAN: Guard = DUE;

// Under a lease (`claim.strategy = skip-locked`, `per-row`, ordered relays).
pub const LEASE_CLAIM: Transition = t("lease claim", DUE, Any, Some(Sending), false, Claim::Take);
pub const ACK: Transition = t("ack", MINE, Any, Some(Success), false, Claim::Keep);
pub const DELETE_SENT: Transition = t("delete sent", MINE, Any, None, false, Claim::Keep);
pub const RETRY: Transition = t("retry", MINE, Any, Some(Wait), true, Claim::Clear);
pub const RELEASE: Transition = t("release", MINE, Any, Some(Wait), false, Claim::Clear);
pub const FAIL: Transition = t("fail", MINE, Any, Some(Fail), true, Claim::Keep);
pub const RENEW: Transition = t("renew", MINE, Any, Some(Sending), false, Claim::Renew);
pub const RECLAIM: Transition = t("reclaim", EXPIRED, Left, Some(Wait), true, Claim::Clear);
pub const RECLAIM_LAST: Transition = t("reclaim (last attempt)", EXPIRED, Last, Some(Fail), true, Claim::Keep);

// Under a held round (`claim.strategy = held`): nothing is written to claim; the round's
// transaction records every outcome and commits once.
pub const HELD_DELETE_SENT: Transition = t("held: delete sent", HELD, Any, None, false, Claim::Keep);
pub const HELD_SENT: Transition = t("held: sent", HELD, Any, Some(Success), false, Claim::Keep);
pub const HELD_RETRY: Transition = t("held: retry", HELD, Any, Some(Wait), true, Claim::Keep);
pub const HELD_FAIL: Transition = t("held: fail", HELD, Any, Some(Fail), true, Claim::Keep);
pub const HELD_PARK: Transition = t("held: park", HELD, Any, Some(Wait), false, Claim::Keep);
/// A lost round's rows still pending and not claimed again (locked `SKIP LOCKED` by the
/// recovery's own transaction).
pub const LOST_ROUND: Transition = t("lost round", HELD, Left, Some(Wait), true, Claim::Keep);
pub const LOST_ROUND_LAST: Transition = t("lost round (last attempt)", HELD, Last, Some(Fail), true, Claim::Keep);

// Retention (`admin::purge`, `sent.retention`): sent rows kept (`sent.rows = keep`) are deleted
// once older than the retention; the age is the purge's own condition.
pub const RETENTION: Transition = t("retention", Guard::on(Success), Any, None, false, Claim::Keep);

// A caller's cancel (`crate::cancel`): a pending row no claim holds is deleted, before it leaves.
// Its locking read waits for a held round's transaction (whose row locks are its claim); a
// lease claim has made the row SENDING, which the guard does not admit (in flight).
pub const CANCEL: Transition = t("cancel", Guard::on(Wait), Any, None, false, Claim::Keep);

/// The condition of a WAIT row that waits for its scheduled time (not a backoff or a park, which
/// count an attempt or record why): what `outboxd status` and the console show as scheduled.
pub const SCHEDULED_SQL: &str =
    "status = 'WAIT' AND next_retry_time > NOW(3) AND retry_count = 0 AND last_error IS NULL";

/// Every transition, for the model and the conformance test.
pub const TRANSITIONS: &[Transition] = &[
    LEASE_CLAIM,
    ACK,
    DELETE_SENT,
    RETRY,
    RELEASE,
    FAIL,
    RENEW,
    RECLAIM,
    RECLAIM_LAST,
    HELD_DELETE_SENT,
    HELD_SENT,
    HELD_RETRY,
    HELD_FAIL,
    HELD_PARK,
    LOST_ROUND,
    LOST_ROUND_LAST,
    RETENTION,
    CANCEL,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_transition_after_a_lease_claim_is_fenced_by_the_claim() {
        for t in [ACK, DELETE_SENT, RETRY, RELEASE, FAIL, RENEW] {
            assert!(t.guard.mine && t.guard.status == Sending, "{}", t.name);
        }
        let c = GuardContext {
            token: 7,
            owner_literal: "'a'",
            lease_us: 1000,
        };
        assert_eq!(
            ACK.guard.sql(&c),
            "status = 'SENDING' AND claim_token = 7 AND claim_owner = 'a'"
        );
        assert_eq!(
            RECLAIM.guard.sql(&c),
            "status = 'SENDING' AND claimed_at < NOW(3) - INTERVAL 1000 MICROSECOND AND next_retry_time <= NOW(3)"
        );
        assert_eq!(SCAN.sql(&c), "status = 'WAIT' AND next_retry_time <= NOW(3)");
        assert_eq!(RENEW.set_sql(), "");
        assert_eq!(RECLAIM.set_sql(), "status = 'WAIT', retry_count = retry_count + 1");
    }

    #[test]
    fn the_reclaim_splits_rows_by_their_attempts_exactly_once() {
        for rc in 0..6 {
            assert!(RECLAIM.attempts.admits(rc, 3) != RECLAIM_LAST.attempts.admits(rc, 3));
            assert!(LOST_ROUND.attempts.admits(rc, 3) != LOST_ROUND_LAST.attempts.admits(rc, 3));
        }
    }
}
