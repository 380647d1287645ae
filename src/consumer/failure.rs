//! Why handling failed, as typed errors: why a batch is handled again one message at a time
//! ([`BatchFallback`]), why one attempt at a message failed ([`AttemptError`]) and what that
//! costs it ([`Failure`]). Their texts are what the logs, the `outbox.process` spans and the dead
//! letters' `last_error` show.

use std::fmt;

use super::handler::HandlerError;
use crate::error::Error;

/// Why a batch's transaction was rolled back and its messages go one at a time (nothing of it
/// committed).
#[derive(Debug)]
pub(super) enum BatchFallback {
    /// No connection, or the transaction could not start (the driver's words).
    Begin(mysql::Error),
    /// Some keys of the batch were marked already (copies): one at a time, each copy finds its
    /// mark.
    AlreadyMarked,
    /// The statement marking the batch's keys failed.
    Marking(Error),
    /// The handler failed on one of the messages.
    Handler(HandlerError),
    /// The handler panicked (its message).
    Panicked(String),
    /// The commit failed (and may have committed: each message then finds its mark).
    Commit(mysql::Error),
}

impl BatchFallback {
    /// A deadlock or a lock wait timeout: the batch may well go through as a batch once the
    /// other transaction has moved on (a host's handler reports it as a `LockConflict`).
    pub(super) fn is_lock_conflict(&self) -> bool {
        match self {
            BatchFallback::Marking(Error::Db(e)) => crate::error::is_lock_conflict(e),
            BatchFallback::Handler(e) => {
                if let Some(Error::Db(e)) = e.downcast_ref::<Error>() {
                    crate::error::is_lock_conflict(e)
                } else if let Some(e) = e.downcast_ref::<mysql::Error>() {
                    crate::error::is_lock_conflict(e)
                } else {
                    e.downcast_ref::<super::handler::LockConflict>().is_some()
                }
            }
            _ => false,
        }
    }
}

impl fmt::Display for BatchFallback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BatchFallback::Begin(e) => write!(f, "{e}"),
            BatchFallback::AlreadyMarked => f.write_str("some keys of the batch were already marked"),
            BatchFallback::Marking(e) => write!(f, "marking the batch failed: {e}"),
            BatchFallback::Handler(e) => write!(f, "the handler failed: {e}"),
            BatchFallback::Panicked(p) => write!(f, "the handler panicked: {p}"),
            BatchFallback::Commit(e) => write!(f, "the commit failed: {e}"),
        }
    }
}

impl std::error::Error for BatchFallback {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BatchFallback::Begin(e) | BatchFallback::Commit(e) => Some(e),
            BatchFallback::Marking(e) => Some(e),
            BatchFallback::Handler(e) => Some(e.as_ref()),
            BatchFallback::AlreadyMarked | BatchFallback::Panicked(_) => None,
        }
    }
}

/// Why one attempt at a message (mark, handler, commit in one transaction) failed, or why a
/// dead letter could not be replayed.
#[derive(Debug)]
pub(super) enum AttemptError {
    /// No connection, or the transaction could not start or commit (the driver's words).
    Tx(mysql::Error),
    /// A statement of the library's failed: the inbox mark, the replayed dead letter's DELETE,
    /// taking or returning a dead letter to replay.
    Db(Error),
    /// The handler failed and the failure uses an attempt (shown as the handler said it).
    Handler(HandlerError),
    /// The handler failed with a [`super::Transient`] or a transient database error: retried
    /// without an attempt.
    HandlerTransient(HandlerError),
    /// The handler panicked (its message).
    Panicked(String),
}

impl fmt::Display for AttemptError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttemptError::Tx(e) => write!(f, "{e}"),
            AttemptError::Db(e) => write!(f, "{e}"),
            AttemptError::Handler(e) => write!(f, "{e}"),
            AttemptError::HandlerTransient(e) => write!(f, "the handler failed: {e}"),
            AttemptError::Panicked(p) => write!(f, "the handler panicked: {p}"),
        }
    }
}

impl std::error::Error for AttemptError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            AttemptError::Tx(e) => Some(e),
            AttemptError::Db(e) => Some(e),
            AttemptError::Handler(e) | AttemptError::HandlerTransient(e) => Some(e.as_ref()),
            AttemptError::Panicked(_) => None,
        }
    }
}

/// What a failed attempt costs the message.
#[derive(Debug)]
pub(super) enum Failure {
    /// Not the message's fault: database trouble (a lost connection, a lock wait timeout, a
    /// deadlock, also inside the handler), or a handler's [`super::Transient`]. Retried after a
    /// backoff without using an attempt.
    Transient(AttemptError),
    /// The handler failed (an attempt), or the message cannot be marked at all (`poison`).
    Handler { error: AttemptError, poison: bool },
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consumer::Transient;

    #[test]
    fn the_texts_are_the_ones_users_see() {
        let handler: HandlerError = "the loyalty service is down".into();
        assert_eq!(
            BatchFallback::Handler(handler).to_string(),
            "the handler failed: the loyalty service is down"
        );
        assert_eq!(
            BatchFallback::AlreadyMarked.to_string(),
            "some keys of the batch were already marked"
        );
        assert_eq!(
            BatchFallback::Panicked("boom".into()).to_string(),
            "the handler panicked: boom"
        );
        let handler: HandlerError = "points table full".into();
        assert_eq!(AttemptError::Handler(handler).to_string(), "points table full");
        let transient: HandlerError = Box::new(Transient("down".into()));
        assert_eq!(
            AttemptError::HandlerTransient(transient).to_string(),
            "the handler failed: down (transient)"
        );
        let db = AttemptError::Db(Error::InvalidEvent {
            field: "event_key",
            reason: "must not be empty".into(),
        });
        assert_eq!(db.to_string(), "invalid event: event_key must not be empty");
        assert!(std::error::Error::source(&db).is_some(), "the cause is kept");
    }
}
