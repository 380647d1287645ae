//! One message in a handler thread: mark, handler and commit in one transaction; database
//! failures retried without an attempt, handler failures with backoff until `max_attempts`, then
//! the message parked in the dead-letter table.

use std::sync::atomic::Ordering::Relaxed;

use mysql::{Transaction, TxOpts};

use super::dead_letter;
use super::handler::HandlerError;
use super::message::Message;
use super::shared::Inner;
use crate::error::{Error, Result};

/// What became of a message in a handler thread.
pub(super) enum Done {
    Processed,
    Duplicate,
    DeadLettered,
    /// The consumer is stopping: not done, its offset is not committed.
    Abandoned,
}

pub(super) enum Failure {
    /// Database trouble (retried without an attempt).
    Db(Error),
    /// The handler failed (an attempt), or the message cannot be marked at all (`poison`).
    Handler { error: String, poison: bool },
}

pub(super) fn handle_message(inner: &Inner, msg: &Message) -> Done {
    let mut attempts = 0u32;
    let mut db_failures = 0u32;
    loop {
        match attempt(inner, msg) {
            Ok(true) => {
                inner.counters.processed.fetch_add(1, Relaxed);
                return Done::Processed;
            }
            Ok(false) => {
                inner.counters.duplicates.fetch_add(1, Relaxed);
                return Done::Duplicate;
            }
            Err(Failure::Db(e)) => {
                inner.counters.db_errors.fetch_add(1, Relaxed);
                db_failures += 1;
                inner.warn("db", || {
                    format!("database failure handling {} (retrying): {e}", msg.queue)
                });
                if !inner.pause(inner.config.backoff(db_failures)) {
                    return Done::Abandoned;
                }
            }
            Err(Failure::Handler { error, poison }) => {
                attempts += 1;
                inner.counters.failed_attempts.fetch_add(1, Relaxed);
                if poison || attempts >= inner.config.max_attempts {
                    return park(inner, msg, attempts, &error);
                }
                inner.warn("handler", || {
                    format!(
                        "handler failed on key {:?} at {}:{} (attempt {attempts} of {}): {error}",
                        msg.key, msg.queue, msg.offset, inner.config.max_attempts
                    )
                });
                if !inner.pause(inner.config.backoff(attempts)) {
                    return Done::Abandoned;
                }
            }
        }
    }
}

/// Parks the message in the dead-letter table (retrying database failures until it is stored or
/// the consumer stops).
fn park(inner: &Inner, msg: &Message, attempts: u32, error: &str) -> Done {
    let mut failures = 0;
    loop {
        let stored = (|| -> Result<()> {
            let mut conn = inner.pool.get_conn()?;
            dead_letter::insert(
                &mut conn,
                &inner.config.dead_letter_table,
                &inner.config.group,
                msg,
                attempts,
                error,
            )
        })();
        match stored {
            Ok(()) => {
                inner.counters.dead_lettered.fetch_add(1, Relaxed);
                log::error!(
                    "consumer {}: key {:?} at {}:{} parked in {} after {attempts} attempt(s): {error}",
                    inner.config.group,
                    msg.key,
                    msg.queue,
                    msg.offset,
                    inner.config.dead_letter_table
                );
                return Done::DeadLettered;
            }
            Err(e) => {
                inner.counters.db_errors.fetch_add(1, Relaxed);
                failures += 1;
                inner.warn("park", || format!("could not park key {:?} (retrying): {e}", msg.key));
                if !inner.pause(inner.config.backoff(failures)) {
                    return Done::Abandoned;
                }
            }
        }
    }
}

/// One attempt: mark, handler, commit, in one transaction. `Ok(true)`: processed; `Ok(false)`:
/// a duplicate.
fn attempt(inner: &Inner, msg: &Message) -> std::result::Result<bool, Failure> {
    let mut conn = inner.pool.get_conn().map_err(|e| Failure::Db(e.into()))?;
    let tx = conn
        .start_transaction(TxOpts::default())
        .map_err(|e| Failure::Db(e.into()))?;
    run_in(inner, tx, msg, None)
}

/// Mark, handler (if the key is new), the replayed dead letter's DELETE (with `replay`), commit.
/// Any failure drops `tx`, which rolls back everything, the mark included.
pub(super) fn run_in(
    inner: &Inner,
    mut tx: Transaction<'_>,
    msg: &Message,
    replay: Option<u64>,
) -> std::result::Result<bool, Failure> {
    let db = |e: Error| {
        if e.is_retriable() {
            Failure::Db(e)
        } else {
            Failure::Handler {
                error: e.to_string(),
                poison: matches!(e, Error::InvalidEvent { .. }),
            }
        }
    };
    let new = !inner.config.inbox
        || inner
            .inbox
            .mark(&mut tx, &inner.config.group, &msg.key, &msg.meta())
            .map_err(db)?;
    if new {
        // A handler that panics fails this attempt like an error (its thread, and so its queues,
        // go on); the transaction is rolled back when dropped.
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| inner.handler.handle(&mut tx, msg)));
        match ran {
            Ok(result) => result.map_err(classify_handler_error)?,
            Err(panic) => {
                return Err(Failure::Handler {
                    error: format!("the handler panicked: {}", crate::error::panic_message(&*panic)),
                    poison: false,
                });
            }
        }
    }
    if let Some(id) = replay {
        dead_letter::delete(&mut tx, &inner.config.dead_letter_table, id).map_err(db)?;
    }
    // A failed commit is a database failure whatever it says: if it did commit, the next attempt
    // finds the mark and counts a duplicate.
    tx.commit().map_err(|e| Failure::Db(e.into()))?;
    Ok(new)
}

/// A handler error: a transient database error (ours or the driver's) is retried without an
/// attempt; anything else uses one.
fn classify_handler_error(e: HandlerError) -> Failure {
    let retriable = if let Some(e) = e.downcast_ref::<Error>() {
        e.is_retriable()
    } else if let Some(e) = e.downcast_ref::<mysql::Error>() {
        crate::error::is_transient_db_error(e)
    } else {
        false
    };
    if retriable {
        Failure::Db(Error::Publisher(format!("handler: {e}")))
    } else {
        Failure::Handler {
            error: e.to_string(),
            poison: false,
        }
    }
}
