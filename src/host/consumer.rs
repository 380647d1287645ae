//! [`HostConsumer`]: a consumer as both bindings hold it, and its operations: start (the
//! arguments and the database checked first, then the source of [`source_for`] started), the
//! counters as JSON, stop with the final counts (once; later and concurrent stops get the same
//! counts).

use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use super::error::HostResult;
use super::relay::require_db_url;
use super::start::source_for;
use super::tx::Transience;
use crate::config::Config;
use crate::consumer::{BatchHandler, Consumer, ConsumerStats, Handler, HandlerError, LockConflict, Transient};
use crate::error::Error;
use crate::event::MAX_TOPIC_CHARS;

/// The host's handler: one message per call, or a batch's new messages per call.
pub(crate) enum Handling {
    Each(Arc<dyn Handler>),
    Batch(Arc<dyn BatchHandler>),
}

/// A consumer: running, being stopped, or stopped with its final counts.
pub(crate) struct HostConsumer {
    run: Mutex<Run>,
    stopped: Condvar,
}

/// Where a consumer is in its life.
enum Run {
    Running(Consumer),
    /// A stop is under way on some thread; the counts when it began.
    Stopping(ConsumerStats),
    /// The final counts.
    Stopped(ConsumerStats),
}

/// Starts a consumer of `topic` for `group` with the `consumer.*` and `inbox.*` settings of
/// `config`, running `handling` in a transaction on `db.url` that also holds each message's inbox
/// mark. What can be checked is checked before the source joins the group: the topic, the group,
/// `db.url`, the database (reachable, the inbox and dead-letter tables present).
pub(crate) fn start(config: &Config, topic: &str, group: &str, handling: Handling) -> HostResult<HostConsumer> {
    check_topic(topic)?;
    crate::inbox::check_group(group)?;
    require_db_url(config)?;
    let mut consumer = config.consumer.clone();
    consumer.group = group.to_string();
    let pool = crate::db::connect(config)?;
    Consumer::check(&consumer, &pool)?;
    let source = source_for(config, topic, &consumer)?;
    let running = match handling {
        Handling::Each(h) => Consumer::start(consumer, pool, source, h)?,
        Handling::Batch(h) => Consumer::start_batch(consumer, pool, source, h)?,
    };
    Ok(HostConsumer {
        run: Mutex::new(Run::Running(running)),
        stopped: Condvar::new(),
    })
}

/// The topic as the relay's `topic` key takes it: 1 to 127 characters of `[A-Za-z0-9_%|-]`.
fn check_topic(topic: &str) -> HostResult<()> {
    let n = topic.chars().count();
    let reason = if topic.trim().is_empty() {
        "must not be empty".to_string()
    } else if n > MAX_TOPIC_CHARS {
        format!("is {n} characters, more than {MAX_TOPIC_CHARS}")
    } else if !topic
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '%' | '|'))
    {
        format!("{topic:?} has characters other than [A-Za-z0-9_%|-]")
    } else {
        return Ok(());
    };
    Err(Error::InvalidEvent { field: "topic", reason }.into())
}

impl HostConsumer {
    /// The counters as JSON (`"stopped": true` once stopped).
    pub(crate) fn stats_json(&self) -> String {
        match &*self.run.lock() {
            Run::Running(c) => c.stats().to_json(false),
            Run::Stopping(s) => s.to_json(false),
            Run::Stopped(s) => s.to_json(true),
        }
    }

    /// Stops the consumer (or waits for the stop under way on another thread); the final counts,
    /// and whether an earlier call had stopped it already.
    pub(crate) fn stop(&self) -> (ConsumerStats, bool) {
        let mut run = self.run.lock();
        loop {
            match &*run {
                Run::Stopped(last) => return (last.clone(), true),
                Run::Stopping(_) => self.stopped.wait(&mut run),
                Run::Running(c) => {
                    let at_start = c.stats();
                    let Run::Running(consumer) = std::mem::replace(&mut *run, Run::Stopping(at_start.clone())) else {
                        unreachable!("matched Running above")
                    };
                    // Not under the lock: `stats` goes on meanwhile (from handlers too).
                    drop(run);
                    let stopped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| consumer.stop()));
                    let last = stopped.as_ref().map_or(at_start, Clone::clone);
                    *self.run.lock() = Run::Stopped(last.clone());
                    self.stopped.notify_all();
                    if let Err(panic) = stopped {
                        std::panic::resume_unwind(panic);
                    }
                    return (last, false);
                }
            }
        }
    }
}

/// Applies the consuming half's pending migrations (the inbox and the consumer dead-letter
/// tables, nothing of the relay's) in the database of `db.url`, which is required.
pub(crate) fn migrate_consumer(config: &Config) -> HostResult<crate::migrate::MigrationReport> {
    require_db_url(config)?;
    let pool = crate::db::connect(config)?;
    Ok(crate::migrate::migrate_consumer(&pool)?)
}

/// The error a host binding's handler failure becomes: a [`LockConflict`] or a [`Transient`]
/// when a statement through the lent transaction failed that way (or the host says the failure
/// is transient), else the host's words as they are.
pub(crate) fn handler_failure(what: String, host_says_transient: bool, seen: Option<Transience>) -> HandlerError {
    match seen {
        Some(Transience::LockConflict) => Box::new(LockConflict(what)),
        Some(Transience::Other) => Box::new(Transient(what)),
        None if host_says_transient => Box::new(Transient(what)),
        None => what.into(),
    }
}
