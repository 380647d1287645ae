//! Counters kept by a relay, and their snapshot.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

pub use crate::breaker::BreakerState;
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
    /// Claim rounds failing one after the other.
    pub claims: FailureStreak,
    /// State changes after a send (ack, release, fail, renew) failing one after the other.
    pub writes: FailureStreak,
    /// Ordered relays: how long due events have waited with nothing claimable.
    pub blocked: BlockedSpell,
}

/// Failures of one kind of database work in a row, so that a relay that cannot make progress
/// says so: a WARN at the first failure, then an ERROR at most every [`FailureStreak::LOUD_EVERY`]
/// with the count since the last one, a stall reason for `/healthz` and the stats once
/// `stall_after` failures have happened in a row, and an INFO when it recovers.
#[derive(Debug)]
pub(crate) struct FailureStreak {
    what: &'static str,
    stall_after: u64,
    in_a_row: AtomicU64,
    state: Mutex<StreakState>,
}

#[derive(Debug, Default)]
struct StreakState {
    first_failure: Option<Instant>,
    last_loud: Option<Instant>,
    since_loud: u64,
    last_error: String,
    last_success: Option<Instant>,
}

/// What a failure should log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Loud {
    /// Nothing (an ERROR was logged less than `LOUD_EVERY` ago).
    Quiet,
    /// The first failure of a streak: a WARN.
    Warn(String),
    /// A repeated failure: an ERROR with the count since the last log line.
    Error(String),
    /// The end of a spell that was reported.
    Info(String),
}

impl Loud {
    /// Logs the line at its level.
    pub fn log(self) {
        match self {
            Loud::Quiet => {}
            Loud::Warn(m) => log::warn!("{m}"),
            Loud::Error(m) => log::error!("{m}"),
            Loud::Info(m) => log::info!("{m}"),
        }
    }
}

impl FailureStreak {
    /// Least time between two ERROR lines of one streak.
    pub const LOUD_EVERY: Duration = Duration::from_secs(10);

    pub fn new(what: &'static str, stall_after: u64) -> FailureStreak {
        FailureStreak {
            what,
            stall_after,
            in_a_row: AtomicU64::new(0),
            state: Mutex::new(StreakState::default()),
        }
    }

    /// Records a failure and logs it (WARN first, then rate-limited ERRORs).
    pub fn failed(&self, error: &dyn std::fmt::Display) {
        self.failed_at(Instant::now(), error).log();
    }

    pub fn failed_at(&self, now: Instant, error: &dyn std::fmt::Display) -> Loud {
        let n = self.in_a_row.fetch_add(1, Relaxed) + 1;
        let mut st = self.state.lock();
        st.last_error = error.to_string();
        st.since_loud += 1;
        let first = *st.first_failure.get_or_insert(now);
        if n == 1 {
            st.last_loud = Some(now);
            st.since_loud = 0;
            return Loud::Warn(format!("{} failed, retrying: {error}", self.what));
        }
        if st.last_loud.is_some_and(|t| now.duration_since(t) < Self::LOUD_EVERY) {
            return Loud::Quiet;
        }
        let since = std::mem::take(&mut st.since_loud);
        st.last_loud = Some(now);
        Loud::Error(format!(
            "{} keeps failing: {n} failures in a row over {:.0} s ({since} since the last report); \
             the relay makes no progress until this is fixed: {error}",
            self.what,
            now.duration_since(first).as_secs_f64()
        ))
    }

    /// Records a success; logs the recovery if there was a streak.
    pub fn succeeded(&self) {
        let now = Instant::now();
        let n = self.in_a_row.swap(0, Relaxed);
        let mut st = self.state.lock();
        st.last_success = Some(now);
        if n > 0 {
            let over = st.first_failure.map(|t| now.duration_since(t)).unwrap_or_default();
            log::info!(
                "{} succeeds again after {n} failures in a row over {:.1} s",
                self.what,
                over.as_secs_f64()
            );
            st.first_failure = None;
            st.last_loud = None;
            st.since_loud = 0;
        }
    }

    pub fn in_a_row(&self) -> u64 {
        self.in_a_row.load(Relaxed)
    }

    /// Why the work is stalled, once `stall_after` failures happened in a row.
    pub fn stalled(&self) -> Option<String> {
        let n = self.in_a_row();
        if n < self.stall_after {
            return None;
        }
        let st = self.state.lock();
        let over = st.first_failure.map(|t| t.elapsed()).unwrap_or_default();
        Some(format!(
            "{} failed {n} times in a row over {:.1} s: {}",
            self.what,
            over.as_secs_f64(),
            st.last_error
        ))
    }

    /// Time since the last success (`None` before the first).
    pub fn since_success(&self) -> Option<Duration> {
        self.state.lock().last_success.map(|t| t.elapsed())
    }
}

impl Default for FailureStreak {
    fn default() -> FailureStreak {
        FailureStreak::new("database work", 3)
    }
}

/// An ordered claim round as [`BlockedSpell`] sees it.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct OrderedRound {
    pub claimed: u64,
    /// Due candidates left WAIT behind an earlier event of their key.
    pub blocked: u64,
    /// Of those, the ones whose key has no event in flight anywhere.
    pub stuck: u64,
    pub stuck_keys: u64,
    /// Keys held by a dead-lettered oldest event (`ordering.dead.head = block`).
    pub dead_heads: u64,
    /// This relay's events in flight when the round ran.
    pub in_flight: u64,
    /// The round scanned from the head of the due rows (not on from a position of a walk).
    pub from_head: bool,
}

/// Ordered relays: a spell of claim rounds that find due events and claim none, while none of
/// their keys has an event in flight on any instance and this relay has nothing in flight. The
/// relay is then idle with work waiting (keys whose oldest event waits out a backoff or a park,
/// or is dead-lettered under `ordering.dead.head = block`; or a fault of the claim itself): a
/// WARN once the spell has lasted [`BlockedSpell::WARN_AFTER`], again at most every
/// [`BlockedSpell::WARN_EVERY`], an INFO when a round claims again, and the spell's length in
/// the stats (`ordered_blocked_ms`) meanwhile.
#[derive(Debug, Default)]
pub(crate) struct BlockedSpell {
    state: Mutex<SpellState>,
}

#[derive(Debug, Default)]
struct SpellState {
    since: Option<Instant>,
    last_warn: Option<Instant>,
}

impl BlockedSpell {
    pub const WARN_AFTER: Duration = Duration::from_secs(60);
    pub const WARN_EVERY: Duration = Duration::from_secs(60);

    /// Records a round and logs what it should.
    pub fn round(&self, r: &OrderedRound) {
        self.round_at(Instant::now(), r).log();
    }

    pub fn round_at(&self, now: Instant, r: &OrderedRound) -> Loud {
        let mut st = self.state.lock();
        let progress = r.claimed > 0 || r.in_flight > 0 || r.blocked > r.stuck;
        let nothing_due = r.blocked == 0;
        if nothing_due && !r.from_head && !progress {
            // The end of a walk past stuck keys says nothing about the rows before it.
            return Loud::Quiet;
        }
        if progress || nothing_due {
            let was = st.since.take();
            return match (was, st.last_warn.take()) {
                (Some(since), Some(_)) => Loud::Info(format!(
                    "ordered claims go on after {:.0} s with nothing claimable",
                    now.duration_since(since).as_secs_f64()
                )),
                _ => Loud::Quiet,
            };
        }
        let since = *st.since.get_or_insert(now);
        let over = now.duration_since(since);
        if over < Self::WARN_AFTER || st.last_warn.is_some_and(|t| now.duration_since(t) < Self::WARN_EVERY) {
            return Loud::Quiet;
        }
        st.last_warn = Some(now);
        let dead = match r.dead_heads {
            0 => String::new(),
            d => format!(
                "; {d} of these keys are held by a dead-lettered event (ordering.dead.head = block): \
                 `outboxd dead-letters replay` sends it, or resolve it by hand"
            ),
        };
        Loud::Warn(format!(
            "ordered relay idle for {:.0} s with due events waiting: the last round found {} due events of {} keys \
             whose oldest pending event is not in flight (waiting out a retry backoff or a park){dead}",
            over.as_secs_f64(),
            r.blocked,
            r.stuck_keys
        ))
    }

    /// How long the current spell has lasted (`None` outside one).
    pub fn length(&self) -> Option<Duration> {
        self.state.lock().since.map(|t| t.elapsed())
    }
}

impl Counters {
    pub fn new() -> Counters {
        Counters {
            claims: FailureStreak::new("claiming events", 3),
            writes: FailureStreak::new("recording send outcomes (ack, release, fail, renew)", 5),
            ..Counters::default()
        }
    }

    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Relaxed);
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
    /// Claim rounds that failed one after the other (0 after a success).
    pub claim_failures_in_a_row: u64,
    /// Acks, releases, dead-letterings and renewals that failed one after the other.
    pub write_failures_in_a_row: u64,
    /// Time since the last claim round that succeeded (whether or not it found rows); `None`
    /// before the first.
    pub since_last_claim: Option<Duration>,
    /// Why the relay cannot make progress, while it cannot (claims or writes failing in a row).
    pub stalled: Option<String>,
    /// Ordered relays: how long claim rounds have found due events and nothing claimable, with
    /// no key of theirs in flight (docs/ordering.md, "The window, and keys that stay blocked"); `None` otherwise.
    pub ordered_blocked: Option<Duration>,
    /// Why the relay does not claim: its table is paused (by whom, since when, why), or `None`.
    pub paused: Option<String>,
    /// Database gauges, `None` if the database did not answer.
    pub gauges: Option<Gauges>,
}

impl Counters {
    pub fn snapshot(
        &self,
        instance_id: &str,
        breaker_state: BreakerState,
        paused: Option<String>,
        gauges: Option<Gauges>,
    ) -> Stats {
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
            claim_failures_in_a_row: self.claims.in_a_row(),
            write_failures_in_a_row: self.writes.in_a_row(),
            since_last_claim: self.claims.since_success(),
            stalled: self.stalled(),
            ordered_blocked: self.blocked.length(),
            paused,
            gauges,
        }
    }
}

impl Counters {
    /// Why the relay cannot make progress, if it cannot: every stalled kind of work.
    pub fn stalled(&self) -> Option<String> {
        let reasons: Vec<String> = [self.claims.stalled(), self.writes.stalled()]
            .into_iter()
            .flatten()
            .collect();
        (!reasons.is_empty()).then(|| reasons.join("; "))
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
            "claim_failures_in_a_row": self.claim_failures_in_a_row,
            "write_failures_in_a_row": self.write_failures_in_a_row,
            "since_last_claim_ms": self.since_last_claim.map(ms),
            "stalled": self.stalled,
            "ordered_blocked_ms": self.ordered_blocked.map(ms),
            "paused": self.paused,
            "gauges": gauges,
        })
        .to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_streak_warns_once_then_errors_at_a_bounded_rate_and_stalls() {
        let s = FailureStreak::new("claim", 3);
        let t0 = Instant::now();
        let e = "Data too long for column 'claim_owner'";
        assert!(matches!(s.failed_at(t0, &e), Loud::Warn(_)));
        assert_eq!(s.stalled(), None, "one failure is not a stall");
        // Every scan interval for under LOUD_EVERY: quiet.
        for i in 1..10 {
            assert_eq!(s.failed_at(t0 + Duration::from_secs(i), &e), Loud::Quiet);
        }
        let loud = s.failed_at(t0 + FailureStreak::LOUD_EVERY + Duration::from_secs(1), &e);
        match loud {
            Loud::Error(m) => assert!(m.contains("11 failures in a row") && m.contains("10 since"), "{m}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(s.failed_at(t0 + Duration::from_secs(12), &e), Loud::Quiet);
        assert!(s.stalled().unwrap().contains("claim_owner"));
        s.succeeded();
        assert_eq!(s.in_a_row(), 0);
        assert_eq!(s.stalled(), None);
        assert!(matches!(s.failed_at(t0 + Duration::from_secs(13), &e), Loud::Warn(_)));
    }

    fn stuck(blocked: u64, dead_heads: u64, from_head: bool) -> OrderedRound {
        OrderedRound {
            blocked,
            stuck: blocked,
            stuck_keys: 2,
            dead_heads,
            from_head,
            ..OrderedRound::default()
        }
    }

    #[test]
    fn an_ordered_relay_idle_with_due_events_warns_after_a_minute_at_a_bounded_rate_and_says_when_it_claims_again() {
        let b = BlockedSpell::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(b.round_at(t0, &stuck(5, 1, true)), Loud::Quiet);
        assert!(b.length().is_some(), "the spell has begun");
        // The end of a walk past the stuck keys (nothing after the position) changes nothing.
        assert_eq!(b.round_at(at(1), &stuck(0, 0, false)), Loud::Quiet);
        assert_eq!(b.round_at(at(59), &stuck(5, 1, true)), Loud::Quiet);
        match b.round_at(at(61), &stuck(5, 1, true)) {
            Loud::Warn(m) => assert!(
                m.contains("idle for 61 s") && m.contains("5 due events of 2 keys") && m.contains("1 of these keys"),
                "{m}"
            ),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            b.round_at(at(100), &stuck(5, 1, true)),
            Loud::Quiet,
            "at most one WARN a minute"
        );
        assert!(matches!(b.round_at(at(122), &stuck(5, 0, true)), Loud::Warn(m) if !m.contains("dead-lettered")));
        // A round claims: the spell ends, with an INFO since it was reported.
        let claimed = OrderedRound {
            claimed: 3,
            ..stuck(5, 0, true)
        };
        assert!(matches!(b.round_at(at(123), &claimed), Loud::Info(m) if m.contains("123 s")));
        assert_eq!(b.length(), None);
    }

    #[test]
    fn keys_in_flight_anywhere_or_nothing_due_is_not_an_idle_spell() {
        let b = BlockedSpell::default();
        let t0 = Instant::now();
        let busy_elsewhere = OrderedRound {
            stuck: 2,
            ..stuck(5, 0, true)
        };
        let ours_in_flight = OrderedRound {
            in_flight: 1,
            ..stuck(5, 0, true)
        };
        for (i, r) in [busy_elsewhere, ours_in_flight, stuck(0, 0, true)].iter().enumerate() {
            assert_eq!(b.round_at(t0 + Duration::from_secs(120 * i as u64), r), Loud::Quiet);
            assert_eq!(b.length(), None, "{r:?}");
        }
        // A spell that was never reported ends quietly.
        b.round_at(t0, &stuck(5, 0, true));
        assert_eq!(
            b.round_at(t0 + Duration::from_secs(30), &stuck(0, 0, true)),
            Loud::Quiet
        );
        assert_eq!(b.length(), None);
    }
}
