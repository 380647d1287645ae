//! What a consumer's threads share ([`Inner`]): the configuration, the pool, the inbox, the
//! source and the handler, the counters, the offsets in hand, the stop signal, and rate-limited
//! warnings.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use mysql::Pool;
use parking_lot::Mutex;

use super::handler::Handling;
use super::health::Health;
use super::offsets::Offsets;
use super::source::Source;
use super::stats::Counters;
use crate::config::ConsumerConfig;
use crate::inbox::Inbox;

pub(super) struct Inner {
    pub(super) config: ConsumerConfig,
    pub(super) pool: Pool,
    pub(super) inbox: Inbox,
    pub(super) source: Arc<dyn Source>,
    pub(super) handler: Handling,
    /// The server names the marks it inserted (`INSERT ... RETURNING`): see
    /// `Inbox::mark_many`.
    pub(super) returning: bool,
    pub(super) counters: Counters,
    /// Per queue, the offsets in hand and the next offset to commit.
    pub(super) offsets: Mutex<Offsets>,
    /// Disconnected when the consumer stops: every wait selects on it.
    pub(super) stop_rx: Receiver<()>,
    /// Whether it can take messages now.
    pub(super) health: Health,
    /// Rate limit of repeated warnings.
    pub(super) warned: Mutex<HashMap<&'static str, Instant>>,
}

impl Inner {
    pub(super) fn stopping(&self) -> bool {
        matches!(
            self.stop_rx.try_recv(),
            Err(crossbeam_channel::TryRecvError::Disconnected)
        )
    }

    /// Waits `d` unless the consumer stops first; false if it is stopping.
    pub(super) fn pause(&self, d: Duration) -> bool {
        !matches!(
            self.stop_rx.recv_timeout(d),
            Err(crossbeam_channel::RecvTimeoutError::Disconnected)
        )
    }

    /// A warning at most every 10 s per kind (the counters have the totals).
    pub(super) fn warn(&self, kind: &'static str, text: impl FnOnce() -> String) {
        let now = Instant::now();
        let mut w = self.warned.lock();
        if w.get(kind)
            .is_some_and(|t| now.duration_since(*t) < Duration::from_secs(10))
        {
            return;
        }
        w.insert(kind, now);
        drop(w);
        log::warn!("consumer {}: {}", self.config.group, text());
    }
}
