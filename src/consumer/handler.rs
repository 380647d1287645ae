//! The service's code: the [`Handler`] trait, run inside the transaction that holds the
//! message's inbox mark.

use mysql::Transaction;

use super::message::Message;

/// What a handler returns on failure: any error. Database errors that are transient (see
/// [`Error::is_retriable`]) are retried without using an attempt.
pub type HandlerError = Box<dyn std::error::Error + Send + Sync>;

/// The service's code for one message, run inside the transaction that holds its inbox mark.
/// Write through `tx` only: what the handler does elsewhere (HTTP calls, files) is not undone by
/// a rollback and may happen more than once.
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
