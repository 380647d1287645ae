//! The service's code, run inside the transaction that holds the messages' inbox marks: a
//! [`Handler`] for one message at a time (the default), or a [`BatchHandler`] for a batch, for
//! services that do their own multi-row writes.

use mysql::Transaction;

use super::message::Message;

/// What a handler returns on failure: any error. Database errors that are transient (see
/// [`crate::Error::is_retriable`]) are retried without using an attempt.
pub type HandlerError = Box<dyn std::error::Error + Send + Sync>;

/// A handler's failure that is not the message's fault and should not use an attempt: the
/// message is rolled back and tried again after a backoff, as a transient database error is (a
/// lock wait timeout or a deadlock inside the handler, a connection lost). Return it (boxed, as
/// a [`HandlerError`]) for a dependency that is down for a while; a handler that always returns
/// it keeps its queue waiting (loudly: a WARN every 10 s, and `db_errors` in the stats).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transient(pub String);

impl std::fmt::Display for Transient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (transient)", self.0)
    }
}

impl std::error::Error for Transient {}

/// A host handler's failure after a statement of its transaction met a lock conflict (a
/// deadlock or a lock wait timeout): transient, like [`Transient`], and a batch that meets it
/// runs again as a batch. The C, Java and Go bindings report it; a Rust handler returns the
/// database error itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LockConflict(pub String);

impl std::fmt::Display for LockConflict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (lock conflict, transient)", self.0)
    }
}

impl std::error::Error for LockConflict {}

/// The service's code for one message, run inside the transaction that holds its inbox mark.
/// Write through `tx` only: what the handler does elsewhere (HTTP calls, files) is not undone by
/// a rollback and may happen more than once.
///
/// With batching on (`consumer.batch.max` above 1), the messages waiting on a handler thread
/// share one transaction: the handler runs once per new message, in the order of their route
/// values (`consumer.route`; one value's messages in the order they came), and one commit
/// follows. If it fails on any of them, the batch is rolled back and handled again one message
/// per transaction, so only the failing message is retried (and charged attempts).
pub trait Handler: Send + Sync + 'static {
    fn handle(&self, tx: &mut Transaction<'_>, msg: &Message) -> std::result::Result<(), HandlerError>;
}

impl<F> Handler for F
where
    F: Fn(&mut Transaction<'_>, &Message) -> std::result::Result<(), HandlerError> + Send + Sync + 'static,
{
    fn handle(&self, tx: &mut Transaction<'_>, msg: &Message) -> std::result::Result<(), HandlerError> {
        self(tx, msg)
    }
}

/// The service's code for a batch: every new message of the batch (duplicates left out), in
/// queue order, in the transaction that holds their marks. A failure rolls the batch back and
/// the runtime calls the handler again with one message at a time, retrying and parking only the
/// failing one; so a batch handler must also handle a batch of one.
pub trait BatchHandler: Send + Sync + 'static {
    fn handle_batch(&self, tx: &mut Transaction<'_>, msgs: &[Message]) -> std::result::Result<(), HandlerError>;
}

/// How a consumer runs the service's code.
#[derive(Clone)]
pub(super) enum Handling {
    Each(std::sync::Arc<dyn Handler>),
    Batch(std::sync::Arc<dyn BatchHandler>),
}

impl Handling {
    /// Runs the service's code on `msgs` (all new) in `tx`; `enter(i)` is held while the
    /// per-message handler runs on `msgs[i]` (its trace span made current).
    pub(super) fn run<G>(
        &self,
        tx: &mut Transaction<'_>,
        msgs: &[Message],
        enter: impl Fn(usize) -> G,
    ) -> std::result::Result<(), HandlerError> {
        match self {
            Handling::Each(h) => msgs.iter().enumerate().try_for_each(|(i, m)| {
                let _current = enter(i);
                h.handle(tx, m)
            }),
            Handling::Batch(h) => h.handle_batch(tx, msgs),
        }
    }
}
