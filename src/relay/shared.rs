//! What the relay's threads share: the configuration, the store, the publisher, the counters and
//! the breaker ([`Inner`]), the chunks of claimed events in flight with their leases, and the
//! bookkeeping every thread does with them (waiting, releasing, retrying a state change).

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver, Sender};
use parking_lot::Mutex;

use super::hooks::{DeadLetterHook, LatencyHook};
use super::round::HeldRound;
use crate::breaker::Breaker;
use crate::config::Config;
use crate::control::PauseCheck;
use crate::error::Result;
use crate::event::{EventId, OutboundEvent};
use crate::publisher::Publisher;
use crate::stats::Counters;
use crate::store::{DeadLetter, Store};

pub(super) struct Chunk {
    pub(super) seq: u64,
    pub(super) token: u64,
    pub(super) events: Vec<OutboundEvent>,
    /// Age of each event at the claim, for the latency hook.
    pub(super) ages: Vec<Duration>,
    pub(super) claimed: Instant,
    pub(super) probe: bool,
    /// The held round this chunk is part of (`claim.strategy = held`); `None` under a lease.
    pub(super) round: Option<Arc<HeldRound>>,
}

pub(super) struct Lease {
    pub(super) token: u64,
    pub(super) ids: Vec<EventId>,
    pub(super) expires: Instant,
    pub(super) renewed_at: Instant,
    /// A held round's chunk: bounded by its connection's `wait_timeout`, never renewed.
    pub(super) held: bool,
}

pub(super) struct Inner {
    pub(super) config: Config,
    pub(super) store: Store,
    pub(super) publisher: Arc<dyn Publisher>,
    pub(super) counters: Counters,
    pub(super) breaker: Mutex<Breaker>,
    pub(super) dead_letter: Option<DeadLetterHook>,
    pub(super) latency: Option<LatencyHook>,
    pub(super) leases: Mutex<HashMap<u64, Lease>>,
    /// Wakes the scanner for new commits (the fast path).
    pub(super) wake_tx: Sender<()>,
    /// Wakes the scanner when workers free capacity; heard only while it waits for capacity,
    /// so the fixed delay between scan rounds holds.
    pub(super) capacity_tx: Sender<()>,
    pub(super) stopping: AtomicBool,
    pub(super) chunk_seq: AtomicU64,
    /// Held rounds open now (each holds a connection and its rows' locks).
    pub(super) held_rounds: AtomicUsize,
    /// Whether the table is paused (`outbox_control`), read at most once a second.
    pub(super) pause: PauseCheck,
}

/// Waits for a wake-up, the shutdown signal or the timeout, whichever comes first.
pub(super) fn wait(wake: &Receiver<()>, shutdown: &Receiver<()>, timeout: Duration) {
    select! {
        recv(wake) -> _ => {},
        recv(shutdown) -> _ => {},
        default(timeout) => {},
    }
}

/// [`wait`], also woken when a worker finishes a chunk (capacity freed).
pub(super) fn wait_or_capacity(
    wake: &Receiver<()>,
    capacity: &Receiver<()>,
    shutdown: &Receiver<()>,
    timeout: Duration,
) {
    select! {
        recv(wake) -> _ => {},
        recv(capacity) -> _ => {},
        recv(shutdown) -> _ => {},
        default(timeout) => {},
    }
}

/// Forgets a handled chunk and wakes the scanner (capacity freed).
pub(super) fn finish(inner: &Inner, chunk: &Chunk) {
    inner.leases.lock().remove(&chunk.seq);
    inner.counters.in_flight.fetch_sub(chunk.events.len() as u64, SeqCst);
    if let Some(round) = &chunk.round {
        round.chunk_finished(inner);
    }
    let _ = inner.capacity_tx.try_send(());
}

pub(super) fn ids_of(events: &[OutboundEvent]) -> Vec<EventId> {
    events.iter().map(|e| e.id).collect()
}

/// When the chunk's lease ends (now, if it is no longer tracked).
pub(super) fn lease_end(inner: &Inner, chunk: &Chunk) -> Instant {
    inner
        .leases
        .lock()
        .get(&chunk.seq)
        .map(|l| l.expires)
        .unwrap_or_else(Instant::now)
}

pub(super) fn release_chunk_unsent(inner: &Inner, chunk: &Chunk, reason: &str) {
    if chunk.round.is_some() {
        // A held round writes nothing for unsent rows: its COMMIT leaves them as they were.
        log::debug!("{} held events not sent: {reason}", chunk.events.len());
        Counters::add(&inner.counters.released_unsent, chunk.events.len() as u64);
        if chunk.probe {
            inner.breaker.lock().probe_not_sent();
        }
        return;
    }
    let ids = ids_of(&chunk.events);
    let lease_end = lease_end(inner, chunk);
    if let Some(n) = with_db_retry(inner, lease_end, "release", || {
        inner.store.release_unsent(chunk.token, &ids, reason)
    }) {
        Counters::add(&inner.counters.released_unsent, n);
    }
    if chunk.probe {
        inner.breaker.lock().probe_not_sent();
    }
}

/// Runs a state transition, retrying database errors with backoff while the lease lasts. If it
/// never succeeds the rows stay SENDING and come back when their lease expires (at least once).
pub(super) fn with_db_retry(
    inner: &Inner,
    until: Instant,
    what: &str,
    mut f: impl FnMut() -> Result<u64>,
) -> Option<u64> {
    let mut delay = Duration::from_millis(20);
    loop {
        match f() {
            Ok(n) => {
                inner.counters.writes.succeeded();
                return Some(n);
            }
            Err(e) => {
                Counters::add(&inner.counters.db_errors, 1);
                inner.counters.writes.failed(&format_args!("{what}: {e}"));
                if Instant::now() + delay >= until {
                    log::error!("{what} failed and the lease is ending; the rows return when it expires: {e}");
                    return None;
                }
                log::debug!("{what} failed, retrying in {} ms: {e}", delay.as_millis());
                std::thread::sleep(delay);
                delay = (delay * 2).min(Duration::from_secs(1));
            }
        }
    }
}

pub(super) fn dead_lettered(inner: &Inner, letters: &[DeadLetter]) {
    Counters::add(&inner.counters.dead_lettered, letters.len() as u64);
    for d in letters {
        log::error!(
            "event {} (biz_no {}, type {}) dead-lettered after {} attempts: {}",
            d.id,
            d.biz_no,
            d.event_type,
            d.retry_count,
            d.last_error
        );
        if let Some(hook) = &inner.dead_letter {
            if catch_unwind(AssertUnwindSafe(|| hook(d))).is_err() {
                log::error!("dead-letter hook panicked for event {}", d.id);
            }
        }
    }
}
