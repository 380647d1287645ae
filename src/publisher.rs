//! The broker side of the relay, as seen by the core.
//!
//! A [`Publisher`] receives a chunk of claimed events that share a topic and returns one
//! [`SendOutcome`] per event, in the same order. Workers call it synchronously from their own
//! threads; implementations must be `Send + Sync` because every worker shares one publisher.

use std::fmt;
use std::time::Duration;

pub use crate::event::OutboundEvent;

/// What became of one event handed to [`Publisher::publish`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendOutcome {
    /// The broker stored the message. `msg_id` is the broker's message id, if it returned one.
    Sent { msg_id: Option<String> },
    /// The send failed; the kind decides what the relay does with the row.
    Failed(SendError),
}

/// How a failed send is treated. New kinds may be added: a `match` outside the crate needs a
/// `_` arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FailureKind {
    /// The broker as a whole is unreachable (connection refused, no route, client shut down).
    /// Not the event's fault: the row goes back to WAIT without using an attempt, and the
    /// circuit breaker counts the failure.
    Unavailable,
    /// The outcome is unknown (the broker may have stored it). Counts as an attempt and retries
    /// with backoff; a streak of timeouts also opens the circuit breaker.
    Timeout,
    /// Something about this message (too large, bad topic, broker refused it). Counts as an
    /// attempt; after `max.retry` attempts the row is dead-lettered.
    Rejected,
    /// Not sent, and not the broker as a whole: with `ordering = per-biz-no`, the broker holding
    /// the key's queue is down while other brokers are up. The row goes back to WAIT without an
    /// attempt, due again after `breaker.open.ms` (so the key is not claimed again at once); the
    /// circuit breaker does not count it.
    Parked,
    /// Not sent because an earlier event of the same key failed in this call (ordered mode: a
    /// key's events go out in order, so the rest of its run waits). Back to WAIT at once without
    /// an attempt; its key's failed event, now WAIT with its backoff, holds it back.
    HeldBack,
}

/// A failed send: its kind and a human-readable reason (stored in `last_error`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendError {
    pub kind: FailureKind,
    pub message: String,
}

impl SendError {
    pub fn new(kind: FailureKind, message: impl Into<String>) -> Self {
        SendError {
            kind,
            message: message.into(),
        }
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(FailureKind::Unavailable, message)
    }
    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(FailureKind::Timeout, message)
    }
    pub fn rejected(message: impl Into<String>) -> Self {
        Self::new(FailureKind::Rejected, message)
    }
    pub fn parked(message: impl Into<String>) -> Self {
        Self::new(FailureKind::Parked, message)
    }
    pub fn held_back(message: impl Into<String>) -> Self {
        Self::new(FailureKind::HeldBack, message)
    }
}

impl fmt::Display for SendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.message)
    }
}

impl std::error::Error for SendError {}

/// Sends claimed events to a broker.
///
/// With `ordering = per-biz-no`, a call holds whole runs of keys: a key's events in id order, and
/// no other call holds that key at the same time. The publisher sends each key's events in that
/// order to the key's queue and, once one of them fails, sends none of the key's later events
/// (their outcome is [`FailureKind::HeldBack`]).
pub trait Publisher: Send + Sync {
    /// Sends `events` (all with the same topic, at most `publish.batch.max` of them) and returns
    /// exactly one outcome per event, in order. `timeout` is the whole budget for the call; it
    /// never extends past the events' lease. A publisher may send them as one broker batch or one
    /// by one. A panic is caught by the worker and counted as a failure of every event.
    fn publish(&self, events: &[OutboundEvent], timeout: Duration) -> Vec<SendOutcome>;

    /// With `ordering = per-biz-no`: the broker queue `event` goes to, when the publisher knows it
    /// without any I/O, as a number that only needs to tell queues apart. The relay packs the
    /// runs bound for one queue into one call, so a call is one broker request and its events
    /// are acked as soon as that queue answers, not when the slowest of several does. Only a
    /// hint: a wrong or missing answer costs requests, never order (a key's run stays whole in
    /// one call either way). Defaults to `None`: runs are packed whatever their queue.
    fn queue_hint(&self, _event: &OutboundEvent) -> Option<u64> {
        None
    }

    /// Whether the broker looks reachable, for health checks. Defaults to `true`.
    fn is_healthy(&self) -> bool {
        true
    }

    /// Called once when the relay stops, after every worker has finished.
    fn shutdown(&self) {}
}

impl<P: Publisher + ?Sized> Publisher for std::sync::Arc<P> {
    fn publish(&self, events: &[OutboundEvent], timeout: Duration) -> Vec<SendOutcome> {
        (**self).publish(events, timeout)
    }
    fn queue_hint(&self, event: &OutboundEvent) -> Option<u64> {
        (**self).queue_hint(event)
    }
    fn is_healthy(&self) -> bool {
        (**self).is_healthy()
    }
    fn shutdown(&self) {
        (**self).shutdown()
    }
}
