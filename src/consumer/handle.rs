//! The messages of a handler thread: a batch in one transaction (marks, handler, one commit), and
//! one message at a time when a batch fails: mark, handler and commit in one transaction;
//! database failures retried without an attempt, handler failures with backoff until
//! `max_attempts`, then the message parked in the dead-letter table.

use std::sync::atomic::Ordering::Relaxed;

use mysql::{Transaction, TxOpts};

use super::dead_letter;
use super::failure::{AttemptError, BatchFallback, Failure};
use super::handler::{HandlerError, LockConflict, Transient};
use super::message::Message;
use super::shared::Inner;
use crate::error::Error;
use crate::inbox::MessageMeta;
use crate::telemetry::{Handled, ProcessSpans};

/// How many times a batch rolled back by a lock conflict runs again as a batch before it goes
/// one message at a time (each one message transaction retries its own conflicts).
const BATCH_CONFLICT_RETRIES: u32 = 3;
/// The wait before a batch runs again after its n-th lock conflict: n times this.
const CONFLICT_PAUSE: std::time::Duration = std::time::Duration::from_millis(5);

/// What became of a message in a handler thread.
pub(super) enum Done {
    Processed,
    Duplicate,
    DeadLettered,
    /// The consumer is stopping: not done, its offset is not committed.
    Abandoned,
}

/// Handles `msgs` (the messages waiting on a handler thread, in queue order): all in one
/// transaction when they can be, else one at a time. Returns how many are done, in order (fewer
/// than `msgs.len()` only when the consumer stops meanwhile: the rest are not done).
pub(super) fn handle_batch(inner: &Inner, msgs: &[Message]) -> usize {
    let mut conflicts = 0;
    while msgs.len() > 1 {
        match attempt_batch(inner, msgs) {
            Ok(new) => {
                inner.counters.processed.fetch_add(new, Relaxed);
                inner.counters.duplicates.fetch_add(msgs.len() as u64 - new, Relaxed);
                return msgs.len();
            }
            Err(why) if why.is_lock_conflict() && conflicts < BATCH_CONFLICT_RETRIES => {
                // Another transaction holds rows this batch needs (its consumer in another
                // process, or the service itself): run the batch again once it has moved on,
                // rather than one message per transaction.
                conflicts += 1;
                inner.counters.batch_retries.fetch_add(1, Relaxed);
                log::debug!(
                    "consumer {}: a batch of {} messages is run again (lock conflict {conflicts}): {why}",
                    inner.config.group,
                    msgs.len()
                );
                if !inner.pause(CONFLICT_PAUSE * conflicts) {
                    return 0;
                }
            }
            Err(why) => {
                inner.counters.batch_fallbacks.fetch_add(1, Relaxed);
                log::debug!(
                    "consumer {}: a batch of {} messages is handled again one at a time: {why}",
                    inner.config.group,
                    msgs.len()
                );
                break;
            }
        }
    }
    for (i, msg) in msgs.iter().enumerate() {
        if matches!(handle_message(inner, msg), Done::Abandoned) {
            return i;
        }
    }
    msgs.len()
}

/// One transaction for the whole batch: the marks of its keys in one statement, the handler on
/// every message whose key was new (a key twice in the batch runs once), one commit. Returns how
/// many messages the handler ran on; `Err` says why the batch must go one message at a time
/// (the transaction was rolled back, nothing of it committed).
fn attempt_batch(inner: &Inner, msgs: &[Message]) -> std::result::Result<u64, BatchFallback> {
    let spans = ProcessSpans::start(
        msgs.iter().map(|m| (&m.properties, m.queue.topic.as_str())),
        &inner.config.group,
    );
    match attempt_batch_in(inner, msgs, &spans) {
        Ok(new) => {
            spans.end(Handled::Committed);
            credited(inner, msgs.iter().zip(&new).filter(|(_, n)| **n).map(|(m, _)| m));
            Ok(new.iter().filter(|n| **n).count() as u64)
        }
        Err(why) => {
            spans.end(Handled::BatchRetried(&why));
            Err(why)
        }
    }
}

/// Records commit → credited for messages whose effects were just committed (not duplicates).
fn credited<'a>(inner: &Inner, msgs: impl Iterator<Item = &'a Message>) {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    for m in msgs {
        if let Some(created) = m.created_ms() {
            inner.counters.credited.record(created, now_ms);
        }
    }
}

/// The batch's transaction; `Ok` says which messages were new (their handler ran).
fn attempt_batch_in(
    inner: &Inner,
    msgs: &[Message],
    spans: &ProcessSpans,
) -> std::result::Result<Vec<bool>, BatchFallback> {
    let mut conn = inner.pool.get_conn().map_err(BatchFallback::Begin)?;
    let mut tx = conn
        .start_transaction(TxOpts::default())
        .map_err(BatchFallback::Begin)?;
    let new: Vec<bool> = if inner.config.inbox {
        let items: Vec<(&str, MessageMeta)> = msgs.iter().map(|m| (m.key.as_str(), m.meta())).collect();
        match inner
            .inbox
            .mark_many(&mut tx, &inner.config.group, &items, inner.returning)
        {
            Ok(Some(new)) => new,
            Ok(None) => return Err(BatchFallback::AlreadyMarked),
            Err(e) => return Err(BatchFallback::Marking(e)),
        }
    } else {
        vec![true; msgs.len()]
    };
    for (i, n) in new.iter().enumerate() {
        spans.inbox(i, *n);
    }
    let n = new.iter().filter(|n| **n).count();
    if n > 0 {
        // The new messages only, in order; the whole batch, without copying, when all are new.
        let fresh: Vec<Message>;
        let run: &[Message] = if n == msgs.len() {
            msgs
        } else {
            fresh = msgs
                .iter()
                .zip(&new)
                .filter(|(_, n)| **n)
                .map(|(m, _)| m.clone())
                .collect();
            &fresh
        };
        // Each new message's span is current while the handler runs on it.
        let positions: Vec<usize> = (0..msgs.len()).filter(|i| new[*i]).collect();
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            inner.handler.run(&mut tx, run, |i| spans.enter(positions[i]))
        }));
        match ran {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(BatchFallback::Handler(e)),
            Err(panic) => {
                return Err(BatchFallback::Panicked(
                    crate::error::panic_message(&*panic).to_string(),
                ))
            }
        }
    }
    // A failed commit may have committed: handled again one at a time, each message then finds
    // its mark (a duplicate) or runs.
    tx.commit().map_err(BatchFallback::Commit)?;
    inner.counters.transactions.fetch_add(1, Relaxed);
    Ok(new)
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
            Err(Failure::Transient(e)) => {
                inner.counters.db_errors.fetch_add(1, Relaxed);
                db_failures += 1;
                inner.warn("db", || {
                    format!(
                        "transient failure handling {} (retrying without using an attempt): {e}",
                        msg.queue
                    )
                });
                if !inner.pause(inner.config.backoff(db_failures)) {
                    return Done::Abandoned;
                }
            }
            Err(Failure::Handler { error, poison }) => {
                attempts += 1;
                inner.counters.failed_attempts.fetch_add(1, Relaxed);
                // A copy of a key that is parked already (a resend, a redelivery) joins its dead
                // letter after this one attempt, instead of using them all and parking again.
                if poison || attempts >= inner.config.max_attempts || (attempts == 1 && already_parked(inner, msg)) {
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

/// Whether the message's key has a dead letter already (a failed lookup says no: the message
/// then runs its attempts as any other).
fn already_parked(inner: &Inner, msg: &Message) -> bool {
    let found = inner.pool.get_conn().map_err(Error::from).and_then(|mut c| {
        dead_letter::parked_id(&mut c, &inner.config.dead_letter_table, &inner.config.group, &msg.key)
    });
    match found {
        Ok(id) => id.is_some(),
        Err(e) => {
            inner.counters.db_errors.fetch_add(1, Relaxed);
            inner.warn("park", || {
                format!("could not look for a dead letter of key {:?}: {e}", msg.key)
            });
            false
        }
    }
}

/// Parks the message in the dead-letter table, or adds it to its key's dead letter (retrying
/// database failures until it is stored or the consumer stops).
fn park(inner: &Inner, msg: &Message, attempts: u32, error: &AttemptError) -> Done {
    let error = error.to_string();
    let mut failures = 0;
    loop {
        let stored = inner.pool.get_conn().map_err(Error::from).and_then(|mut conn| {
            dead_letter::park(
                &mut conn,
                &inner.config.dead_letter_table,
                &inner.config.group,
                msg,
                attempts,
                &error,
            )
        });
        match stored {
            Ok(dead_letter::Parked::New(id)) => {
                inner.counters.dead_lettered.fetch_add(1, Relaxed);
                log::error!(
                    "consumer {}: key {:?} at {}:{} parked in {} (id {id}) after {attempts} attempt(s): {error}",
                    inner.config.group,
                    msg.key,
                    msg.queue,
                    msg.offset,
                    inner.config.dead_letter_table
                );
                return Done::DeadLettered;
            }
            Ok(dead_letter::Parked::Copy(id)) => {
                inner.counters.parked_copies.fetch_add(1, Relaxed);
                inner.warn("parked copy", || {
                    format!(
                        "a copy of parked key {:?} at {}:{} failed too: added to dead letter {id} in {} \
                         (replay it once the cause is fixed)",
                        msg.key, msg.queue, msg.offset, inner.config.dead_letter_table
                    )
                });
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
    let tx_failed = |e| Failure::Transient(AttemptError::Tx(e));
    let mut conn = inner.pool.get_conn().map_err(tx_failed)?;
    let tx = conn.start_transaction(TxOpts::default()).map_err(tx_failed)?;
    run_in(inner, tx, msg, None)
}

/// Mark, handler (if the key is new), the replayed dead letter's DELETE (with `replay`), commit.
/// Any failure drops `tx`, which rolls back everything, the mark included.
pub(super) fn run_in(
    inner: &Inner,
    tx: Transaction<'_>,
    msg: &Message,
    replay: Option<u64>,
) -> std::result::Result<bool, Failure> {
    let spans = ProcessSpans::start(
        std::iter::once((&msg.properties, msg.queue.topic.as_str())),
        &inner.config.group,
    );
    let result = run_marked(inner, tx, msg, replay, &spans);
    match &result {
        Ok(new) => {
            spans.end(Handled::Committed);
            if *new {
                credited(inner, std::iter::once(msg));
            }
        }
        Err(Failure::Transient(e)) => spans.end(Handled::Transient(e)),
        Err(Failure::Handler { error, .. }) => spans.end(Handled::Failed(error)),
    }
    result
}

fn run_marked(
    inner: &Inner,
    mut tx: Transaction<'_>,
    msg: &Message,
    replay: Option<u64>,
    spans: &ProcessSpans,
) -> std::result::Result<bool, Failure> {
    let db = |e: Error| {
        if e.is_retriable() {
            Failure::Transient(AttemptError::Db(e))
        } else {
            let poison = matches!(e, Error::InvalidEvent { .. });
            Failure::Handler {
                error: AttemptError::Db(e),
                poison,
            }
        }
    };
    let new = !inner.config.inbox
        || inner
            .inbox
            .mark(&mut tx, &inner.config.group, &msg.key, &msg.meta())
            .map_err(db)?;
    spans.inbox(0, new);
    if new {
        // A handler that panics fails this attempt like an error (its thread, and so its queues,
        // go on); the transaction is rolled back when dropped.
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            inner
                .handler
                .run(&mut tx, std::slice::from_ref(msg), |_| spans.enter(0))
        }));
        match ran {
            Ok(result) => result.map_err(classify_handler_error)?,
            Err(panic) => {
                return Err(Failure::Handler {
                    error: AttemptError::Panicked(crate::error::panic_message(&*panic).to_string()),
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
    tx.commit().map_err(|e| Failure::Transient(AttemptError::Tx(e)))?;
    inner.counters.transactions.fetch_add(1, Relaxed);
    Ok(new)
}

/// A handler error: a transient database error (ours or the driver's) or a [`Transient`] is
/// retried without an attempt; anything else uses one.
fn classify_handler_error(e: HandlerError) -> Failure {
    let retriable = if e.downcast_ref::<Transient>().is_some() || e.downcast_ref::<LockConflict>().is_some() {
        true
    } else if let Some(e) = e.downcast_ref::<Error>() {
        e.is_retriable()
    } else if let Some(e) = e.downcast_ref::<mysql::Error>() {
        crate::error::is_transient_db_error(e)
    } else {
        false
    };
    if retriable {
        Failure::Transient(AttemptError::HandlerTransient(e))
    } else {
        Failure::Handler {
            error: AttemptError::Handler(e),
            poison: false,
        }
    }
}
