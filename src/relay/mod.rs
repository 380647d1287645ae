//! The relay: the producing half. Each step of the protocol (README, "How it works") is one
//! thread kind, in a file of its own:
//!
//! - `scanner`: claims due rows in batches (skip-locked, per-row or ordered) and splits each
//!   round into chunks for the workers (the claim, step 2; the fast path, step 7);
//! - `worker`: sends a chunk through the [`Publisher`] and records every outcome in one
//!   statement per outcome (send, ack, retry, fail; steps 3, 4 and 6);
//! - `reclaimer`: returns expired leases to WAIT and renews the leases of long sends (step 5);
//! - `retention`: deletes old SUCCESS rows (step 8), when `retention.age.ms` is set.
//!
//! `shared` holds what they share (the configuration, the store, the counters, the breaker,
//! the leases of chunks in flight); this file holds the public [`Relay`], its builder, and its
//! start and stop.

mod hooks;
mod reclaimer;
mod retention;
mod round;
mod scanner;
mod shared;
mod worker;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};
use mysql::{Pool, Transaction};
use parking_lot::Mutex;

use crate::breaker::Breaker;
use crate::config::Config;
use crate::control::PauseCheck;
pub use crate::db::connect;
use crate::error::{Error, Result};
use crate::event::{EventId, NewEvent};
use crate::publisher::{OutboundEvent, Publisher, SendError, SendOutcome};
use crate::stats::{Counters, Stats};
use crate::store::{DeadLetter, Store};
pub use hooks::{DeadLetterHook, Delivery, LatencyHook};
use reclaimer::reclaimer_loop;
use retention::retention_loop;
use scanner::scanner_loop;
use shared::{Chunk, Inner};
use worker::worker_loop;

/// What [`Relay::stop`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StopReport {
    /// Claimed-but-unsent events returned to WAIT during the stop.
    pub released: u64,
    /// Events still held when the deadline passed (their leases will expire; the reclaimer of
    /// another instance, or the next start, returns them).
    pub in_flight_at_deadline: u64,
    /// Whether some thread was still running at the deadline.
    pub timed_out: bool,
    /// Whether the relay had already been stopped by an earlier call.
    pub already_stopped: bool,
}

/// Builds a [`Relay`].
pub struct RelayBuilder {
    config: Config,
    publisher: Option<Arc<dyn Publisher>>,
    dead_letter: Option<DeadLetterHook>,
    latency: Option<LatencyHook>,
    pool: Option<Pool>,
}

impl RelayBuilder {
    /// Called per acked event with its [`Delivery`] times.
    pub fn latency_hook(mut self, f: impl Fn(&Delivery) + Send + Sync + 'static) -> Self {
        self.latency = Some(Arc::new(f));
        self
    }

    pub fn publisher(mut self, p: Arc<dyn Publisher>) -> Self {
        self.publisher = Some(p);
        self
    }

    /// Called once per event that ends FAIL.
    pub fn dead_letter_hook(mut self, f: impl Fn(&DeadLetter) + Send + Sync + 'static) -> Self {
        self.dead_letter = Some(Arc::new(f));
        self
    }

    /// Uses this pool instead of opening one from `db.url`.
    pub fn pool(mut self, pool: Pool) -> Self {
        self.pool = Some(pool);
        self
    }

    /// Starts the relay. Without a publisher it runs enqueue-only: no threads, nothing relayed.
    pub fn start(self) -> Result<Relay> {
        Relay::start_with(self.config, self.publisher, self.dead_letter, self.latency, self.pool)
    }
}

struct Running {
    handles: Vec<JoinHandle<()>>,
    /// Dropped by the first stop: its disconnection wakes every loop.
    shutdown_tx: Option<Sender<()>>,
    done_rx: Receiver<()>,
}

/// A running relay instance. Stop it with [`Relay::stop`]; dropping it stops it too.
pub struct Relay {
    inner: Arc<Inner>,
    running: Mutex<Option<Running>>,
    stopped: AtomicBool,
}

/// The default instance id: `<service>-<port or pid>-<random6>`.
pub fn default_instance_id(config: &Config) -> String {
    let port = config.service_port.map(u32::from).unwrap_or_else(std::process::id);
    let rnd: u32 = rand::random::<u32>() & 0xff_ffff;
    format!("{}-{}-{:06x}", config.service_name, port, rnd)
}

/// Inserts `event` into the default table `t_event_record` inside the caller's transaction.
/// Nothing is sent now; the row becomes visible to relays when the transaction commits, and a
/// rollback leaves nothing. Validates with the default limits.
pub fn enqueue_in_tx(tx: &mut Transaction<'_>, event: &NewEvent) -> Result<EventId> {
    let c = Config::default();
    enqueue_in_tx_with(tx, &c, event)
}

/// Like [`enqueue_in_tx`], for the table and payload limit of `config`.
pub fn enqueue_in_tx_with(tx: &mut Transaction<'_>, config: &Config, event: &NewEvent) -> Result<EventId> {
    event.validate(config.payload_max_bytes)?;
    crate::store::insert(tx, &config.table, event)
}

impl Relay {
    pub fn builder(config: Config) -> RelayBuilder {
        RelayBuilder {
            config,
            publisher: None,
            dead_letter: None,
            latency: None,
            pool: None,
        }
    }

    /// Starts a relay with `publisher`, opening its own pool from `db.url`.
    pub fn start(config: Config, publisher: Arc<dyn Publisher>) -> Result<Relay> {
        Self::start_with(config, Some(publisher), None, None, None)
    }

    fn start_with(
        config: Config,
        publisher: Option<Arc<dyn Publisher>>,
        dead_letter: Option<DeadLetterHook>,
        latency: Option<LatencyHook>,
        pool: Option<Pool>,
    ) -> Result<Relay> {
        config.validate()?;
        if let Some(list) = &config.shards {
            return Err(crate::error::ConfigError::invalid(
                "shards",
                crate::config::redact_shards(list),
                "is served by a fleet (`outboxd run`, or outbox::Fleet in Rust): a relay serves one database, db.url",
            )
            .into());
        }
        if let Some(url) = &config.shard_catalog_url {
            return Err(crate::error::ConfigError::invalid(
                "shard.catalog.url",
                crate::config::redact_url(url),
                "lists the shards of a fleet (`outboxd run`, or outbox::Fleet in Rust): a relay serves one database, db.url",
            )
            .into());
        }
        let pool = match pool {
            Some(p) => p,
            None => connect(&config)?,
        };
        // Fail fast, with the database's own message, if it is unreachable or the table is missing.
        {
            use mysql::prelude::Queryable;
            let mut conn = pool.get_conn()?;
            conn.query_drop(format!("SELECT id FROM {} LIMIT 0", config.table))?;
        }
        let owner = config
            .instance_id
            .clone()
            .unwrap_or_else(|| default_instance_id(&config));
        // Refuse a table that cannot hold what this relay writes (a seed-era table not migrated),
        // rather than failing every claim or enqueue later.
        crate::migrate::check_table_shape(&pool, &config, &owner, publisher.is_some())?;
        let mut store = Store::new(pool, &config, owner);
        let held = config.claim_strategy == crate::config::ClaimStrategy::Held
            && config.ordering != crate::config::Ordering::PerBizNo;
        if held && publisher.is_some() && !config.db_url.is_empty() {
            store = store.with_held_pool(crate::db::connect_held(&config)?);
        }
        let pause = PauseCheck::new(&config.table);
        let (wake_tx, wake_rx) = bounded(1);
        let (capacity_tx, capacity_rx) = bounded(1);
        let Some(publisher) = publisher else {
            log::info!(
                "outbox {} opened enqueue-only on table {} (no publisher)",
                store.owner(),
                config.table
            );
            return Ok(Relay {
                inner: Arc::new(Inner {
                    breaker: Mutex::new(Breaker::new(config.breaker_failure_threshold, config.breaker_open)),
                    config,
                    store,
                    publisher: Arc::new(NoPublisher),
                    counters: Counters::new(),
                    dead_letter,
                    latency,
                    leases: Mutex::new(HashMap::new()),
                    wake_tx,
                    capacity_tx,
                    stopping: AtomicBool::new(true),
                    chunk_seq: AtomicU64::new(0),
                    held_rounds: Default::default(),
                    pause,
                }),
                running: Mutex::new(None),
                stopped: AtomicBool::new(false),
            });
        };
        let (shutdown_tx, shutdown_rx) = bounded::<()>(0);
        let (done_tx, done_rx) = bounded::<()>(0);
        let (chunk_tx, chunk_rx) = bounded::<Chunk>(config.max_in_flight);
        let inner = Arc::new(Inner {
            breaker: Mutex::new(Breaker::new(config.breaker_failure_threshold, config.breaker_open)),
            config,
            store,
            publisher,
            counters: Counters::new(),
            dead_letter,
            latency,
            leases: Mutex::new(HashMap::new()),
            wake_tx,
            capacity_tx,
            stopping: AtomicBool::new(false),
            chunk_seq: AtomicU64::new(0),
            held_rounds: Default::default(),
            pause,
        });
        let mut handles = Vec::new();
        let spawn = |name: String, f: Box<dyn FnOnce() + Send>| -> Result<JoinHandle<()>> {
            std::thread::Builder::new()
                .name(name.clone())
                .spawn(f)
                .map_err(|source| Error::Thread { name, source })
        };
        for i in 0..inner.config.workers {
            let (inner, rx, done) = (inner.clone(), chunk_rx.clone(), done_tx.clone());
            handles.push(spawn(
                format!("outbox-worker-{i}"),
                Box::new(move || {
                    worker_loop(&inner, rx);
                    drop(done);
                }),
            )?);
        }
        drop(chunk_rx);
        {
            let (inner, shutdown, done) = (inner.clone(), shutdown_rx.clone(), done_tx.clone());
            handles.push(spawn(
                "outbox-scanner".into(),
                Box::new(move || {
                    scanner_loop(&inner, chunk_tx, wake_rx, capacity_rx, shutdown);
                    drop(done);
                }),
            )?);
        }
        {
            let (inner, shutdown, done) = (inner.clone(), shutdown_rx.clone(), done_tx.clone());
            handles.push(spawn(
                "outbox-reclaimer".into(),
                Box::new(move || {
                    reclaimer_loop(&inner, shutdown);
                    drop(done);
                }),
            )?);
        }
        if let Some(age) = inner.config.retention_age {
            let (inner, shutdown, done) = (inner.clone(), shutdown_rx.clone(), done_tx.clone());
            handles.push(spawn(
                "outbox-retention".into(),
                Box::new(move || {
                    retention_loop(&inner, age, shutdown);
                    drop(done);
                }),
            )?);
        }
        drop(done_tx);
        drop(shutdown_rx);
        log::info!(
            "outbox relay {} started on table {} ({:?}, batch {}, {} workers)",
            inner.store.owner(),
            inner.config.table,
            inner.config.claim_strategy,
            inner.config.batch_size,
            inner.config.workers
        );
        Ok(Relay {
            inner,
            running: Mutex::new(Some(Running {
                handles,
                shutdown_tx: Some(shutdown_tx),
                done_rx,
            })),
            stopped: AtomicBool::new(false),
        })
    }

    /// Whether this relay relays (false when started without a publisher: enqueue-only).
    pub fn is_relaying(&self) -> bool {
        !self.inner.stopping.load(SeqCst)
    }

    /// This instance's id, as stored in `claim_owner`.
    pub fn instance_id(&self) -> &str {
        self.inner.store.owner()
    }

    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The relay's connection pool (also usable for the business statements).
    pub fn pool(&self) -> &Pool {
        self.inner.store.pool()
    }

    /// Wakes the scanner now: call it after committing events so they are relayed in
    /// milliseconds instead of at the next scan. Cheap, never blocks, safe from any thread.
    pub fn notify(&self) {
        let _ = self.inner.wake_tx.try_send(());
    }

    /// Inserts `event` in the caller's transaction, validated against this relay's config.
    /// Call [`Relay::commit`] (or commit yourself, then [`Relay::notify`]).
    pub fn enqueue_in_tx(&self, tx: &mut Transaction<'_>, event: &NewEvent) -> Result<EventId> {
        self.check_open()?;
        enqueue_in_tx_with(tx, &self.inner.config, event)
    }

    /// Commits the caller's transaction, then wakes the relay (the fast path).
    pub fn commit(&self, tx: Transaction<'_>) -> Result<()> {
        tx.commit()?;
        self.notify();
        Ok(())
    }

    /// Cancels these events if they have not left yet (`docs/scheduling.md`): one outcome per
    /// event, audited as done by this instance. Works after `stop` too (it only writes to the
    /// table).
    pub fn cancel(&self, ids: &[EventId]) -> Result<crate::cancel::CancelReport> {
        let c = &self.inner.config;
        crate::cancel::cancel_ids(self.inner.store.pool(), &c.table, ids, self.instance_id())
    }

    /// Cancels the pending events of `biz_no` (of `event_type` only, when given), like
    /// [`Relay::cancel`].
    pub fn cancel_by_biz_no(&self, biz_no: &str, event_type: Option<&str>) -> Result<crate::cancel::CancelReport> {
        let c = &self.inner.config;
        crate::cancel::cancel_by_biz_no(
            self.inner.store.pool(),
            &c.table,
            biz_no,
            event_type,
            self.instance_id(),
        )
    }

    /// Inserts `event` on its own (autocommit) and wakes the relay.
    pub fn enqueue(&self, event: &NewEvent) -> Result<EventId> {
        self.check_open()?;
        event.validate(self.inner.config.payload_max_bytes)?;
        let mut conn = self.inner.store.pool().get_conn()?;
        let id = crate::store::insert(&mut conn, &self.inner.config.table, event)?;
        self.notify();
        Ok(id)
    }

    /// Whether the database answers a ping and the relay is not stalled (claims or writes
    /// failing in a row, see [`Relay::stalled`]), and whether the publisher reports a reachable
    /// broker with the circuit breaker closed: `(db, broker)`.
    pub fn health(&self) -> (bool, bool) {
        let db = self.stalled().is_none()
            && self
                .inner
                .store
                .pool()
                .get_conn()
                .map(|mut c| c.as_mut().ping().is_ok())
                .unwrap_or(false);
        let broker = self.is_relaying()
            && self.inner.publisher.is_healthy()
            && self.inner.breaker.lock().state() == crate::stats::BreakerState::Closed;
        (db, broker)
    }

    /// Why the relay cannot make progress, while it cannot: claim rounds or the state changes
    /// after sends (ack, release, fail, renew) failing again and again (a column too small, a
    /// permission revoked, lock-wait timeouts). `None` once they succeed again.
    pub fn stalled(&self) -> Option<String> {
        self.inner.counters.stalled()
    }

    /// Whether [`Relay::stop`] has been called.
    pub fn is_stopped(&self) -> bool {
        self.stopped.load(SeqCst)
    }

    fn check_open(&self) -> Result<()> {
        if self.is_stopped() {
            Err(Error::Stopped)
        } else {
            Ok(())
        }
    }

    /// Counters, plus the database gauges when the database answers.
    pub fn stats(&self) -> Stats {
        let gauges = self.inner.store.gauges().ok();
        self.counters_only(gauges)
    }

    /// Counters without querying the database.
    pub fn counters(&self) -> Stats {
        self.counters_only(None)
    }

    fn counters_only(&self, gauges: Option<crate::store::Gauges>) -> Stats {
        let state = self.inner.breaker.lock().state();
        let paused = self.inner.pause.last().map(|p| p.to_string());
        self.inner.counters.snapshot(self.instance_id(), state, paused, gauges)
    }

    /// Stops claiming, lets sends in flight finish until `timeout`, returns claimed-but-unsent
    /// events to WAIT under their claim, joins every thread and reports what it did.
    ///
    /// If threads are still running at the deadline (`timed_out`), a later call waits for them
    /// again, up to its own deadline, and joins them once they have ended; after that, calls
    /// return at once with `already_stopped`. Concurrent calls wait one after the other.
    pub fn stop(&self, timeout: Duration) -> StopReport {
        let first = !self.stopped.swap(true, SeqCst);
        let mut running = self.running.lock();
        let Some(r) = running.as_mut() else {
            // Enqueue-only (no threads), or every thread already joined.
            return StopReport {
                already_stopped: !first,
                ..Default::default()
            };
        };
        // A huge timeout means "wait as long as it takes" (about a year), never an overflow.
        let deadline = Instant::now()
            .checked_add(timeout)
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(365 * 86_400));
        let released_before = self.inner.counters.released_unsent.load(Relaxed);
        self.inner.stopping.store(true, SeqCst);
        drop(r.shutdown_tx.take());
        // Every thread holds a clone of the done sender; disconnection means all have ended.
        let timed_out = loop {
            match r.done_rx.recv_deadline(deadline) {
                Ok(()) => continue,
                Err(RecvTimeoutError::Disconnected) => break false,
                Err(RecvTimeoutError::Timeout) => break true,
            }
        };
        if !timed_out {
            let r = running.take().expect("checked above");
            for h in r.handles {
                let _ = h.join();
            }
            self.inner.publisher.shutdown();
        }
        drop(running);
        let report = StopReport {
            released: self.inner.counters.released_unsent.load(Relaxed) - released_before,
            in_flight_at_deadline: self.inner.counters.in_flight.load(Relaxed),
            timed_out,
            already_stopped: !first,
        };
        log::info!("outbox relay {} stopped: {report:?}", self.instance_id());
        report
    }
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("instance_id", &self.instance_id())
            .field("table", &self.inner.config.table)
            .field("relaying", &self.is_relaying())
            .finish()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let grace = self.inner.config.send_timeout + Duration::from_secs(1);
        self.stop(grace);
    }
}

/// Stands in for the publisher of an enqueue-only relay; never called.
struct NoPublisher;

impl Publisher for NoPublisher {
    fn publish(&self, events: &[OutboundEvent], _timeout: Duration) -> Vec<SendOutcome> {
        vec![SendOutcome::Failed(SendError::unavailable("enqueue-only relay has no publisher")); events.len()]
    }
}
