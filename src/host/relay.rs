//! [`HostRelay`]: a relay as both bindings hold it (the relay, the slot of its dead-letter hook,
//! its latency stats), and the operations on it and around it: start, notify, stats, stop,
//! migrate, the insert statement, an event checked for the host's own INSERT, cancel.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;

use super::error::HostResult;
use super::start::open_with;
use crate::cancel::CancelOutcome;
use crate::config::Config;
use crate::error::{ConfigError, Error};
use crate::event::NewEvent;
use crate::latency::{with_latency, LatencyStats};
use crate::migrate::{migrate_table, MigrationReport};
use crate::relay::{DeadLetterHook, Relay, StopReport};
use crate::store::DeadLetter;

/// A started relay, shared by its handle and the transactions begun on it (which keep it, and
/// so its pool, alive after the handle is closed).
pub(crate) struct HostRelay {
    pub(crate) relay: Relay,
    dead_letter: Option<DeadLetterSlot>,
    latency: Arc<LatencyStats>,
}

/// Where the relay finds the host's dead-letter hook; [`DeadLetterSlot::release`] empties it, so
/// the hook is never called again.
#[derive(Clone)]
pub(crate) struct DeadLetterSlot(Arc<RwLock<Option<DeadLetterHook>>>);

impl DeadLetterSlot {
    pub(crate) fn new(hook: DeadLetterHook) -> DeadLetterSlot {
        DeadLetterSlot(Arc::new(RwLock::new(Some(hook))))
    }

    /// The hook the relay calls: the host's while the slot holds it, nothing afterwards.
    pub(crate) fn hook(&self) -> DeadLetterHook {
        let slot = self.0.clone();
        Arc::new(move |d: &DeadLetter| {
            if let Some(hook) = &*slot.read() {
                hook(d);
            }
        })
    }

    /// Empties the slot; waits for a call in progress, and none starts afterwards.
    pub(crate) fn release(&self) {
        *self.0.write() = None;
    }
}

impl HostRelay {
    /// Starts a relay from `config` (checked whole first; the publisher its `publisher` key
    /// names), calling `dead_letter` with each event that ends dead-lettered.
    pub(crate) fn start(config: Config, dead_letter: Option<DeadLetterHook>) -> HostResult<HostRelay> {
        let dead_letter = dead_letter.map(DeadLetterSlot::new);
        let latency = LatencyStats::new();
        let relay = open_with(
            config,
            dead_letter.as_ref().map(DeadLetterSlot::hook),
            Some(LatencyStats::hook(&latency)),
        )?;
        Ok(HostRelay {
            relay,
            dead_letter,
            latency,
        })
    }

    /// `Error::Stopped` once the relay has been stopped.
    pub(crate) fn check_running(&self) -> HostResult<()> {
        if self.relay.is_stopped() {
            return Err(Error::Stopped.into());
        }
        Ok(())
    }

    /// Wakes the relay so committed events go out now; `Error::Stopped` after a stop.
    /// Cancels the event `id` if it has not left yet (`crate::cancel`): what became of it. Works
    /// after the relay's stop too (it only writes to the table).
    pub(crate) fn cancel(&self, id: u64) -> HostResult<CancelOutcome> {
        let report = self.relay.cancel(&[id])?;
        Ok(report.outcomes.get(&id).copied().unwrap_or(CancelOutcome::Gone))
    }

    /// Cancels the pending events of `biz_no` (of `event_type` only, when given): how many.
    pub(crate) fn cancel_by_biz_no(&self, biz_no: &str, event_type: Option<&str>) -> HostResult<usize> {
        Ok(self.relay.cancel_by_biz_no(biz_no, event_type)?.cancelled())
    }

    pub(crate) fn notify(&self) -> HostResult<()> {
        self.check_running()?;
        self.relay.notify();
        Ok(())
    }

    /// The counters (with the database gauges when `with_gauges`) and the commit → ack latency
    /// of the events this relay delivered, as JSON.
    pub(crate) fn stats_json(&self, with_gauges: bool) -> String {
        let stats = if with_gauges {
            self.relay.stats()
        } else {
            self.relay.counters()
        };
        with_latency(&stats.to_json(), &self.latency.snapshot())
    }

    /// Stops the relay, letting sends in flight finish until `timeout`.
    pub(crate) fn stop(&self, timeout: Duration) -> StopReport {
        self.relay.stop(timeout)
    }

    /// Stops the relay within its send timeout plus one second (or finishes a stop that timed
    /// out), then forgets the dead-letter hook: it is never called again once this returns.
    pub(crate) fn stop_and_release(&self) -> StopReport {
        let report = self
            .relay
            .stop(self.relay.config().send_timeout + Duration::from_secs(1));
        if let Some(slot) = &self.dead_letter {
            slot.release();
        }
        report
    }

    /// The hook the relay calls with dead letters, if it was started with one (for the Java
    /// binding's self-test).
    #[cfg_attr(not(feature = "jni"), allow(dead_code))]
    pub(crate) fn dead_letter_hook(&self) -> Option<DeadLetterHook> {
        self.dead_letter.as_ref().map(DeadLetterSlot::hook)
    }
}

/// Applies the pending migrations to the table of `config` in the database of `db.url`, which is
/// required.
pub(crate) fn migrate(config: &Config) -> HostResult<MigrationReport> {
    require_db_url(config)?;
    let pool = crate::db::connect(config)?;
    Ok(migrate_table(&pool, &config.table)?)
}

/// `db.url` is required for what opens the database.
pub(crate) fn require_db_url(config: &Config) -> HostResult<()> {
    if config.db_url.trim().is_empty() {
        return Err(ConfigError::invalid("db.url", "", "is required").into());
    }
    Ok(())
}

/// The parameterised INSERT that enqueues one event into `table` (checked like the `table`
/// key: the name goes into SQL text), for hosts that insert with their own driver: the one for
/// an event due now ([`crate::INSERT_PARAMS`]), or for a scheduled one
/// ([`crate::INSERT_SCHEDULED_PARAMS`]).
pub(crate) fn insert_statement(table: &str, scheduled: bool) -> HostResult<String> {
    Ok(if scheduled {
        crate::store::insert_scheduled_statement(table)?
    } else {
        crate::store::insert_statement(table)?
    })
}

/// Checks `event` as an enqueue would (with `payload_max_bytes`), for hosts that insert it
/// themselves; its `headers` column value (a JSON object of strings), or `None` without headers.
pub(crate) fn check_event(event: &NewEvent, payload_max_bytes: usize) -> HostResult<Option<String>> {
    event.validate(payload_max_bytes)?;
    Ok(event.headers_json())
}
