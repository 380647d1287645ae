//! The relay's circuit breaker: broker-wide failures pause claiming instead of burning each
//! event's retry budget.

use std::time::{Duration, Instant};

/// What the scanner may do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Permit {
    /// Claim as usual.
    Claim,
    /// Claim a single event to probe the broker.
    Probe,
    /// Claim nothing until this instant (or until woken).
    WaitUntil(Instant),
    /// A probe is in flight: wait for its outcome.
    WaitForProbe,
}

/// What a state change was, for logging once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Transition {
    Opened { failures: u32 },
    Reopened,
    Closed,
}

#[derive(Debug)]
pub(crate) struct Breaker {
    threshold: u32,
    open_for: Duration,
    state: State,
}

#[derive(Debug, Clone, Copy)]
enum State {
    Closed { consecutive: u32 },
    Open { until: Instant },
    HalfOpen { probing: bool },
}

impl Breaker {
    pub fn new(threshold: u32, open_for: Duration) -> Self {
        Breaker {
            threshold,
            open_for,
            state: State::Closed { consecutive: 0 },
        }
    }

    pub fn state(&self) -> BreakerState {
        match self.state {
            State::Closed { .. } => BreakerState::Closed,
            State::Open { .. } => BreakerState::Open,
            State::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }

    /// Whether sends should go ahead (workers release queued events while it is open).
    pub fn allows_send(&self) -> bool {
        !matches!(self.state, State::Open { .. })
    }

    pub fn permit(&mut self, now: Instant) -> Permit {
        match self.state {
            State::Closed { .. } => Permit::Claim,
            State::Open { until } if now < until => Permit::WaitUntil(until),
            State::Open { .. } => {
                self.state = State::HalfOpen { probing: true };
                Permit::Probe
            }
            State::HalfOpen { probing: true } => Permit::WaitForProbe,
            State::HalfOpen { probing: false } => {
                self.state = State::HalfOpen { probing: true };
                Permit::Probe
            }
        }
    }

    /// The scanner found nothing to probe with: the next due event will be the probe.
    pub fn probe_not_sent(&mut self) {
        if let State::HalfOpen { .. } = self.state {
            self.state = State::HalfOpen { probing: false };
        }
    }

    /// A publish call reached the broker (at least one event was stored).
    pub fn on_success(&mut self) -> Option<Transition> {
        let was = self.state;
        self.state = State::Closed { consecutive: 0 };
        match was {
            State::Closed { .. } => None,
            _ => Some(Transition::Closed),
        }
    }

    /// A publish call failed as a whole for a broker-wide reason (unreachable, or timed out).
    pub fn on_failure(&mut self, now: Instant) -> Option<Transition> {
        match self.state {
            State::Closed { consecutive } => {
                let n = consecutive + 1;
                if n >= self.threshold {
                    self.state = State::Open {
                        until: now + self.open_for,
                    };
                    Some(Transition::Opened { failures: n })
                } else {
                    self.state = State::Closed { consecutive: n };
                    None
                }
            }
            State::HalfOpen { .. } => {
                self.state = State::Open {
                    until: now + self.open_for,
                };
                Some(Transition::Reopened)
            }
            State::Open { .. } => None,
        }
    }

    /// A publish call failed for reasons of its own messages: the broker is up.
    pub fn on_message_failure(&mut self) -> Option<Transition> {
        self.on_success()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_threshold_probes_then_closes() {
        let t0 = Instant::now();
        let mut b = Breaker::new(3, Duration::from_secs(5));
        assert_eq!(b.on_failure(t0), None);
        assert_eq!(b.on_failure(t0), None);
        assert_eq!(b.on_failure(t0), Some(Transition::Opened { failures: 3 }));
        assert!(!b.allows_send());
        assert_eq!(b.permit(t0), Permit::WaitUntil(t0 + Duration::from_secs(5)));
        let later = t0 + Duration::from_secs(6);
        assert_eq!(b.permit(later), Permit::Probe);
        assert_eq!(b.permit(later), Permit::WaitForProbe);
        assert_eq!(b.on_failure(later), Some(Transition::Reopened));
        let later2 = later + Duration::from_secs(6);
        assert_eq!(b.permit(later2), Permit::Probe);
        assert_eq!(b.on_success(), Some(Transition::Closed));
        assert_eq!(b.permit(later2), Permit::Claim);
    }

    #[test]
    fn a_success_resets_the_streak() {
        let t0 = Instant::now();
        let mut b = Breaker::new(2, Duration::from_secs(1));
        b.on_failure(t0);
        b.on_success();
        assert_eq!(b.on_failure(t0), None);
        assert_eq!(b.state(), BreakerState::Closed);
    }
}
