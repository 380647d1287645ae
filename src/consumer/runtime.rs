//! The [`Consumer`]: its start (checks, threads) and stop, the poller thread that takes messages
//! from the source, routes each queue to one handler thread and commits offsets, and the handler
//! threads' loop.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicI64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, Sender};
use mysql::Pool;
use parking_lot::Mutex;

use super::handle::handle_batch;
use super::handler::{BatchHandler, Handler, Handling};
use super::health::{Health, Seen};
use super::message::Message;
use super::offsets::Offsets;
use super::replay::replay_loop;
use super::route::{sort_batch, thread_of};
use super::shared::Inner;
use super::source::Source;
use super::stats::ConsumerStats;
use super::stats::Counters;
use crate::config::ConsumerConfig;
use crate::error::{Error, Result};
use crate::inbox::Inbox;
use crate::wire::{KeySource, QueueRef};

/// A running consumer. [`Consumer::stop`] ends it; dropping it stops it too.
pub struct Consumer {
    inner: Arc<Inner>,
    stop_tx: Option<Sender<()>>,
    threads: Vec<JoinHandle<()>>,
}

impl fmt::Debug for Consumer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer")
            .field("group", &self.inner.config.group)
            .finish()
    }
}

impl Consumer {
    /// Starts the threads, with `handler` run on each message. `pool` is the service's database
    /// (where the inbox and dead-letter tables are, see [`crate::migrate()`]); the handler's
    /// transactions come from it.
    pub fn start(
        config: ConsumerConfig,
        pool: Pool,
        source: Arc<dyn Source>,
        handler: Arc<dyn Handler>,
    ) -> Result<Consumer> {
        Self::start_with(config, pool, source, Handling::Each(handler))
    }

    /// Like [`Consumer::start`], with a [`BatchHandler`] given each batch's new messages at once.
    pub fn start_batch(
        config: ConsumerConfig,
        pool: Pool,
        source: Arc<dyn Source>,
        handler: Arc<dyn BatchHandler>,
    ) -> Result<Consumer> {
        Self::start_with(config, pool, source, Handling::Batch(handler))
    }

    /// What [`Consumer::start`] checks before it starts anything, for callers that want to know
    /// before they connect a source: the configuration, and that the database answers and holds
    /// the inbox and dead-letter tables (failing with the database's own message).
    pub fn check(config: &ConsumerConfig, pool: &Pool) -> Result<()> {
        Self::check_database(config, pool).map(|_| ())
    }

    /// [`Consumer::check`]; also whether the server has `INSERT ... RETURNING`.
    fn check_database(config: &ConsumerConfig, pool: &Pool) -> Result<bool> {
        use mysql::prelude::Queryable;
        crate::inbox::check_group(&config.group)?;
        config.validate()?;
        let mut conn = pool.get_conn()?;
        conn.query_drop(format!("SELECT 1 FROM {} LIMIT 0", config.inbox_table))?;
        conn.query_drop(format!("SELECT 1 FROM {} LIMIT 0", config.dead_letter_table))?;
        crate::inbox::has_insert_returning(&mut conn)
    }

    fn start_with(config: ConsumerConfig, pool: Pool, source: Arc<dyn Source>, handler: Handling) -> Result<Consumer> {
        let returning = Self::check_database(&config, &pool)?;
        let (stop_tx, stop_rx) = bounded::<()>(0);
        let inner = Arc::new(Inner {
            inbox: Inbox::new(&config.inbox_table)?,
            config,
            pool,
            source,
            handler,
            returning,
            counters: Counters {
                lag: AtomicI64::new(-1),
                ..Counters::default()
            },
            offsets: Mutex::new(Offsets::default()),
            health: Health::default(),
            stop_rx,
            warned: Mutex::new(HashMap::new()),
        });
        let mut threads = Vec::new();
        let mut senders = Vec::new();
        for i in 0..inner.config.threads {
            let (tx, rx) = bounded::<Message>(inner.config.queue_capacity);
            senders.push(tx);
            let inner = inner.clone();
            threads.push(spawn(&format!("outbox-consume-{i}"), move || {
                handler_loop(&inner, &rx)
            })?);
        }
        {
            let inner = inner.clone();
            threads.push(spawn("outbox-consume-poll", move || poll_loop(&inner, senders))?);
        }
        {
            let inner = inner.clone();
            threads.push(spawn("outbox-consume-replay", move || replay_loop(&inner))?);
        }
        log::info!(
            "consumer {} started: {} handler threads, batches of up to {}, inbox {}, dead letters in {}",
            inner.config.group,
            inner.config.threads,
            inner.config.batch_max,
            inner.config.inbox_table,
            inner.config.dead_letter_table
        );
        Ok(Consumer {
            inner,
            stop_tx: Some(stop_tx),
            threads,
        })
    }

    pub fn group(&self) -> &str {
        &self.inner.config.group
    }

    pub fn stats(&self) -> ConsumerStats {
        self.inner.counters.snapshot(self.inner.health.problem())
    }

    /// Stops taking messages, lets each handler thread finish the message in hand (the others
    /// are not acknowledged: the broker delivers them again), commits and stores the offsets,
    /// and leaves the group. Returns the final counters.
    pub fn stop(mut self) -> ConsumerStats {
        self.shutdown();
        self.inner.counters.snapshot(self.inner.health.problem())
    }

    fn shutdown(&mut self) {
        if self.stop_tx.take().is_none() {
            return;
        }
        for t in self.threads.drain(..) {
            if t.join().is_err() {
                log::error!("consumer {}: a thread panicked", self.inner.config.group);
            }
        }
        flush_offsets(&self.inner, true);
        // The final stats say how far behind the group is now, not at the last 5 s check.
        store_lag(&self.inner);
        self.inner.source.shutdown();
        let s = self.inner.counters.snapshot(self.inner.health.problem());
        log::info!(
            "consumer {} stopped: {} received, {} processed, {} duplicates, {} dead-lettered",
            self.inner.config.group,
            s.received,
            s.processed,
            s.duplicates,
            s.dead_lettered
        );
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(f)
        .map_err(|source| Error::Thread {
            name: name.to_string(),
            source,
        })
}

/// How often the poller reads the lag and takes stock of the consumer's health.
const CHECK_EVERY: Duration = Duration::from_secs(5);

fn poll_loop(inner: &Inner, senders: Vec<Sender<Message>>) {
    let mut last_persist = Instant::now();
    let mut last_check: Option<Instant> = None;
    let mut last_arrival = Instant::now();
    'outer: while !inner.stopping() {
        match inner.source.poll(Duration::from_millis(100)) {
            Ok(batch) => {
                inner.health.poll_succeeded();
                if !batch.is_empty() {
                    last_arrival = Instant::now();
                }
                for msg in batch {
                    inner.counters.received.fetch_add(1, Relaxed);
                    if msg.key_source != KeySource::EventKey {
                        inner.counters.fallback_keys.fetch_add(1, Relaxed);
                        inner.warn("fallback key", || {
                            format!(
                                "a message on {} has no {} property; deduplicating on {:?} instead \
                                 (see docs/inbox.md)",
                                msg.queue,
                                crate::wire::EVENT_KEY,
                                msg.key
                            )
                        });
                    }
                    let mut m = msg;
                    let thread = thread_of(&inner.config.route, &m, senders.len());
                    inner.offsets.lock().taken(&m.queue, m.offset);
                    // Waits while that thread's queue is full, but not past a stop.
                    loop {
                        match senders[thread].send_timeout(m, Duration::from_millis(100)) {
                            Ok(()) => break,
                            Err(crossbeam_channel::SendTimeoutError::Timeout(back)) => {
                                if inner.stopping() {
                                    break 'outer;
                                }
                                flush_offsets(inner, false);
                                m = back;
                            }
                            Err(crossbeam_channel::SendTimeoutError::Disconnected(_)) => break 'outer,
                        }
                    }
                }
            }
            Err(e) => {
                inner.health.poll_failed(&e.to_string());
                inner.warn("poll", || format!("taking messages failed: {e}"));
                if !inner.pause(Duration::from_millis(500)) {
                    break;
                }
            }
        }
        let persist = last_persist.elapsed() >= inner.config.persist_interval;
        flush_offsets(inner, persist);
        if persist {
            last_persist = Instant::now();
        }
        if last_check.is_none_or(|t| t.elapsed() >= CHECK_EVERY) {
            last_check = Some(Instant::now());
            let lag = store_lag(inner);
            let c = &inner.counters;
            inner.health.check(Seen {
                source: inner.source.health(),
                lag,
                in_flight: c.received.load(Relaxed).saturating_sub(c.done.load(Relaxed)),
                quiet_for: last_arrival.elapsed(),
                group: &inner.config.group,
            });
        }
    }
    // Dropping the senders ends the handler threads once they finish the message in hand.
}

/// Reads the group's lag from the source into the counters (-1: unknown).
fn store_lag(inner: &Inner) -> Option<u64> {
    let lag = inner.source.lag();
    inner
        .counters
        .lag
        .store(lag.map_or(-1, |l| l.min(i64::MAX as u64) as i64), Relaxed);
    lag
}

/// Commits the offsets that moved since the last call.
fn flush_offsets(inner: &Inner, persist: bool) {
    let offsets: Vec<(QueueRef, u64)> = inner.offsets.lock().moved();
    if !offsets.is_empty() || persist {
        inner.source.commit(&offsets, persist);
    }
}

/// A handler thread: takes the messages waiting for it (up to `batch_max`, never waiting for
/// more), handles them in the order of their route values, then records which are done.
fn handler_loop(inner: &Inner, rx: &Receiver<Message>) {
    let mut batch: Vec<Message> = Vec::with_capacity(inner.config.batch_max);
    loop {
        let first = crossbeam_channel::select! {
            recv(rx) -> m => match m { Ok(m) => m, Err(_) => return },
            recv(inner.stop_rx) -> _ => return,
        };
        batch.push(first);
        while batch.len() < inner.config.batch_max {
            match rx.try_recv() {
                Ok(m) => batch.push(m),
                Err(_) => break,
            }
        }
        sort_batch(&inner.config.route, &mut batch);
        let done = handle_batch(inner, &batch);
        {
            let mut offsets = inner.offsets.lock();
            for m in &batch[..done] {
                offsets.done(&m.queue, m.offset);
            }
        }
        inner.counters.done.fetch_add(done as u64, Relaxed);
        if done < batch.len() {
            return;
        }
        batch.clear();
    }
}
