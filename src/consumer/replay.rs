//! The replayer thread: handles the group's dead letters an operator asked to replay (one per
//! transaction, like a message), and deletes inbox marks past their retention.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use mysql::TxOpts;

use super::dead_letter;
use super::failure::{AttemptError, Failure};
use super::handle::run_in;
use super::shared::Inner;
use crate::error::Error;

/// Handles the group's dead letters an operator asked to replay, one per transaction; and
/// deletes marks past their retention.
pub(super) fn replay_loop(inner: &Inner) {
    let mut last_purge: Option<Instant> = None;
    while inner.pause(inner.config.replay_interval) {
        if let Some(keep) = inner.config.retention {
            if last_purge.is_none_or(|t| t.elapsed() >= inner.config.retention_interval) {
                last_purge = Some(Instant::now());
                if let Err(e) = inner.inbox.purge(
                    &inner.pool,
                    keep,
                    crate::inbox::DEFAULT_PURGE_BATCH,
                    crate::inbox::DEFAULT_PURGE_TIME_LIMIT,
                ) {
                    inner.counters.db_errors.fetch_add(1, Relaxed);
                    inner.warn("retention", || format!("deleting marks past retention failed: {e}"));
                }
            }
        }
        loop {
            if inner.stopping() {
                return;
            }
            match replay_one(inner) {
                Ok(true) => continue,
                Ok(false) => break,
                Err(e) => {
                    inner.counters.db_errors.fetch_add(1, Relaxed);
                    inner.warn("replay", || format!("replaying dead letters failed: {e}"));
                    break;
                }
            }
        }
    }
}

/// Takes one REPLAY row and handles it; false when there was none. `Err` says why it could not
/// (the row stays REPLAY and is taken again later).
fn replay_one(inner: &Inner) -> std::result::Result<bool, AttemptError> {
    let table = &inner.config.dead_letter_table;
    let db = |e: mysql::Error| AttemptError::Db(Error::from(e));
    let mut conn = inner.pool.get_conn().map_err(db)?;
    let mut tx = conn.start_transaction(TxOpts::default()).map_err(db)?;
    let Some((id, msg, attempts)) =
        dead_letter::take_replay(&mut tx, table, &inner.config.group).map_err(AttemptError::Db)?
    else {
        tx.commit().map_err(db)?;
        return Ok(false);
    };
    match run_in(inner, tx, &msg, Some(id)) {
        Ok(new) => {
            inner.counters.replayed.fetch_add(1, Relaxed);
            if !new {
                inner.counters.duplicates.fetch_add(1, Relaxed);
            }
            log::info!(
                "consumer {}: dead letter {id} (key {:?}) replayed{}",
                inner.config.group,
                msg.key,
                if new { "" } else { ": already processed, removed" }
            );
            Ok(true)
        }
        Err(Failure::Transient(e)) => Err(e),
        Err(Failure::Handler { error, .. }) => {
            inner.counters.failed_attempts.fetch_add(1, Relaxed);
            log::error!(
                "consumer {}: replay of dead letter {id} (key {:?}, attempt {}) failed again: {error}",
                inner.config.group,
                msg.key,
                attempts + 1
            );
            dead_letter::failed_again(&inner.pool, table, id, &error.to_string()).map_err(AttemptError::Db)?;
            Ok(true)
        }
    }
}
