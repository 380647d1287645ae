//! Whether a consumer can take messages: what its source says (the name server or the broker
//! unreachable, the topic without a route) and what the poller sees (taking messages failing,
//! messages waiting on the assigned queues that never arrive). A consumer that cannot make
//! progress says so: `unhealthy` in the stats, a WARN when it starts and every 30 s while it
//! lasts, an INFO when it ends.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// How long messages may wait on the assigned queues, with nothing arriving and nothing in hand,
/// before the consumer calls itself stuck.
pub(super) const STUCK_AFTER: Duration = Duration::from_secs(15);

/// How often a lasting problem is logged again.
const REPEAT: Duration = Duration::from_secs(30);

/// Polls that fail in a row before the consumer calls itself unhealthy.
const POLL_FAILURES: u32 = 3;

#[derive(Default)]
pub(super) struct Health {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Why the consumer cannot take messages, and since when.
    problem: Option<(String, Instant)>,
    last_warned: Option<Instant>,
    poll_failures: u32,
    last_poll_error: Option<String>,
}

/// What the poller saw since the last check.
pub(super) struct Seen<'a> {
    /// What the source says is wrong, if anything.
    pub source: Option<String>,
    /// Messages waiting on the assigned queues, if known.
    pub lag: Option<u64>,
    /// Messages handed to handler threads and not yet done.
    pub in_flight: u64,
    /// Since when nothing arrived from the source.
    pub quiet_for: Duration,
    pub group: &'a str,
}

impl Health {
    /// Why the consumer cannot take messages now, if it cannot.
    pub(super) fn problem(&self) -> Option<String> {
        self.state.lock().problem.as_ref().map(|(p, _)| p.clone())
    }

    /// A poll that failed: after a few in a row, a problem.
    pub(super) fn poll_failed(&self, error: &str) {
        let mut s = self.state.lock();
        s.poll_failures += 1;
        s.last_poll_error = Some(error.to_string());
    }

    pub(super) fn poll_succeeded(&self) {
        let mut s = self.state.lock();
        s.poll_failures = 0;
        s.last_poll_error = None;
    }

    /// Takes stock: sets or clears the problem, logging when it starts, again every 30 s, and
    /// when it ends.
    pub(super) fn check(&self, seen: Seen<'_>) {
        let now = Instant::now();
        let mut s = self.state.lock();
        let problem = if s.poll_failures >= POLL_FAILURES {
            Some(format!(
                "taking messages failed {} times in a row: {}",
                s.poll_failures,
                s.last_poll_error.as_deref().unwrap_or("")
            ))
        } else if let Some(reason) = seen.source {
            Some(reason)
        } else {
            match seen.lag {
                Some(waiting) if waiting > 0 && seen.in_flight == 0 && seen.quiet_for >= STUCK_AFTER => Some(format!(
                    "{waiting} messages wait on the assigned queues but none arrived for {} s (the broker may be \
                     unreachable or restarting)",
                    seen.quiet_for.as_secs()
                )),
                _ => None,
            }
        };
        match (problem, s.problem.take()) {
            (Some(p), None) => {
                log::warn!("consumer {}: cannot take messages: {p}", seen.group);
                s.last_warned = Some(now);
                s.problem = Some((p, now));
            }
            (Some(p), Some((_, since))) => {
                if s.last_warned.is_none_or(|t| now.duration_since(t) >= REPEAT) {
                    log::warn!(
                        "consumer {}: still cannot take messages ({} s): {p}",
                        seen.group,
                        now.duration_since(since).as_secs()
                    );
                    s.last_warned = Some(now);
                }
                s.problem = Some((p, since));
            }
            (None, Some((_, since))) => log::info!(
                "consumer {}: taking messages again after {} s",
                seen.group,
                now.duration_since(since).as_secs()
            ),
            (None, None) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(source: Option<&str>, lag: Option<u64>, in_flight: u64, quiet_s: u64) -> Seen<'static> {
        Seen {
            source: source.map(String::from),
            lag,
            in_flight,
            quiet_for: Duration::from_secs(quiet_s),
            group: "g",
        }
    }

    #[test]
    fn the_source_s_reason_a_failing_poll_and_waiting_messages_that_never_arrive_are_problems() {
        let h = Health::default();
        h.check(seen(None, None, 0, 0));
        assert_eq!(h.problem(), None);
        h.check(seen(Some("name server 127.0.0.1:1 unreachable"), None, 0, 0));
        assert_eq!(h.problem().as_deref(), Some("name server 127.0.0.1:1 unreachable"));
        h.check(seen(None, Some(0), 0, 60));
        assert_eq!(h.problem(), None, "nothing waits: idle, not stuck");
        h.check(seen(None, Some(40), 3, 60));
        assert_eq!(h.problem(), None, "messages in hand: working");
        h.check(seen(None, Some(40), 0, 5));
        assert_eq!(h.problem(), None, "a short pause is not a problem");
        h.check(seen(None, Some(40), 0, 20));
        assert!(h.problem().unwrap().contains("40 messages wait"), "{:?}", h.problem());
        h.check(seen(None, Some(40), 0, 0));
        assert_eq!(h.problem(), None);
        for _ in 0..POLL_FAILURES {
            h.poll_failed("connection refused");
        }
        h.check(seen(None, None, 0, 0));
        assert!(h.problem().unwrap().contains("connection refused"));
        h.poll_succeeded();
        h.check(seen(None, None, 0, 0));
        assert_eq!(h.problem(), None);
    }
}
