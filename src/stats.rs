//! Counters kept by a relay, and their snapshot.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use crate::store::Gauges;

/// Live counters (monotonic unless said otherwise).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub claimed: AtomicU64,
    pub claim_conflicts: AtomicU64,
    pub claim_blocked: AtomicU64,
    pub claim_rounds: AtomicU64,
    pub sent: AtomicU64,
    pub retried: AtomicU64,
    pub dead_lettered: AtomicU64,
    pub reclaimed: AtomicU64,
    pub renewed: AtomicU64,
    pub released_unsent: AtomicU64,
    pub parked: AtomicU64,
    pub possible_duplicates: AtomicU64,
    pub stale_acks: AtomicU64,
    pub publish_calls: AtomicU64,
    pub publish_panics: AtomicU64,
    pub breaker_opened: AtomicU64,
    pub breaker_closed: AtomicU64,
    pub db_errors: AtomicU64,
    /// Gauge: claimed events not yet acked, released or failed.
    pub in_flight: AtomicU64,
}

impl Counters {
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Relaxed);
    }
}

/// Circuit-breaker state, as reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    Closed,
    Open,
    HalfOpen,
}

impl BreakerState {
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half-open",
        }
    }
}

/// A snapshot of a relay's counters and, when the database answered, its gauges.
#[derive(Debug, Clone, PartialEq)]
pub struct Stats {
    pub instance_id: String,
    /// Rows this instance claimed.
    pub claimed: u64,
    /// Candidates another instance claimed first (per-row strategy).
    pub claim_conflicts: u64,
    /// Ordered mode: candidates left WAIT because an earlier event of their key was pending.
    pub claim_blocked: u64,
    pub claim_rounds: u64,
    /// Events acknowledged by the broker and marked SUCCESS.
    pub sent: u64,
    /// Failed attempts returned to WAIT with backoff.
    pub retried: u64,
    /// Events marked FAIL (by a worker or by the reclaimer).
    pub dead_lettered: u64,
    /// Expired leases this instance returned to WAIT or FAIL.
    pub reclaimed: u64,
    /// Lease renewals of events held by this instance.
    pub renewed: u64,
    /// Events released without using an attempt (broker outage, shutdown, lease too short).
    pub released_unsent: u64,
    /// Ordered mode: events returned to WAIT without an attempt because the broker holding their
    /// key's queue was down (or an earlier event of the key in the same call failed).
    pub parked: u64,
    /// Failed sends whose request may have reached the broker (timeouts, a connection lost after
    /// the request was written): each may have been stored, so it may arrive twice. Each one
    /// also counted an attempt on its row.
    pub possible_duplicates: u64,
    /// Acks that matched no row because the lease had been lost (the event was, or will be,
    /// sent again by another claim).
    pub stale_acks: u64,
    pub publish_calls: u64,
    pub publish_panics: u64,
    pub breaker_state: BreakerState,
    pub breaker_opened: u64,
    pub breaker_closed: u64,
    pub db_errors: u64,
    pub in_flight: u64,
    /// Database gauges, `None` if the database did not answer.
    pub gauges: Option<Gauges>,
}

impl Counters {
    pub fn snapshot(&self, instance_id: &str, breaker_state: BreakerState, gauges: Option<Gauges>) -> Stats {
        let g = |c: &AtomicU64| c.load(Relaxed);
        Stats {
            instance_id: instance_id.to_string(),
            claimed: g(&self.claimed),
            claim_conflicts: g(&self.claim_conflicts),
            claim_blocked: g(&self.claim_blocked),
            claim_rounds: g(&self.claim_rounds),
            sent: g(&self.sent),
            retried: g(&self.retried),
            dead_lettered: g(&self.dead_lettered),
            reclaimed: g(&self.reclaimed),
            renewed: g(&self.renewed),
            released_unsent: g(&self.released_unsent),
            parked: g(&self.parked),
            possible_duplicates: g(&self.possible_duplicates),
            stale_acks: g(&self.stale_acks),
            publish_calls: g(&self.publish_calls),
            publish_panics: g(&self.publish_panics),
            breaker_state,
            breaker_opened: g(&self.breaker_opened),
            breaker_closed: g(&self.breaker_closed),
            db_errors: g(&self.db_errors),
            in_flight: g(&self.in_flight),
            gauges,
        }
    }
}

impl Stats {
    /// The snapshot as a JSON object (what the C ABI and the bindings return).
    pub fn to_json(&self) -> String {
        let ms = |d: Duration| d.as_millis() as u64;
        let gauges = match &self.gauges {
            Some(g) => serde_json::json!({
                "wait": g.wait,
                "sending": g.sending,
                "fail": g.fail,
                "oldest_wait_age_ms": ms(g.oldest_wait_age),
            }),
            None => serde_json::Value::Null,
        };
        serde_json::json!({
            "instance_id": self.instance_id,
            "claimed": self.claimed,
            "claim_conflicts": self.claim_conflicts,
            "claim_blocked": self.claim_blocked,
            "claim_rounds": self.claim_rounds,
            "sent": self.sent,
            "retried": self.retried,
            "dead_lettered": self.dead_lettered,
            "reclaimed": self.reclaimed,
            "renewed": self.renewed,
            "released_unsent": self.released_unsent,
            "parked": self.parked,
            "possible_duplicates": self.possible_duplicates,
            "stale_acks": self.stale_acks,
            "publish_calls": self.publish_calls,
            "publish_panics": self.publish_panics,
            "breaker_state": self.breaker_state.as_str(),
            "breaker_opened": self.breaker_opened,
            "breaker_closed": self.breaker_closed,
            "db_errors": self.db_errors,
            "in_flight": self.in_flight,
            "gauges": gauges,
        })
        .to_string()
    }
}
