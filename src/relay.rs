//! The relay: a scanner thread that claims batches, a reclaimer thread that returns expired
//! leases and renews live ones, and worker threads that send and record the outcome.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, select, Receiver, RecvTimeoutError, Sender};
use mysql::{Pool, Transaction};
use parking_lot::Mutex;

use crate::breaker::{Breaker, Permit, Transition};
use crate::config::{ClaimStrategy, Config};
pub use crate::db::connect;
use crate::error::{panic_message, Error, Result};
use crate::event::{EventId, NewEvent};
use crate::publisher::{FailureKind, OutboundEvent, Publisher, SendError, SendOutcome};
use crate::stats::{Counters, OrderedRound, Stats};
use crate::store::{ClaimRound, Claimed, DeadLetter, ScanPosition, Store};

/// Called once per dead-lettered event, for alerting. Runs on a relay thread; keep it short.
pub type DeadLetterHook = Arc<dyn Fn(&DeadLetter) + Send + Sync>;

/// Called once per acked event with its [`Delivery`] times. Runs on a worker thread; keep it short.
pub type LatencyHook = Arc<dyn Fn(&Delivery) + Send + Sync>;

/// How long an acked event took, from its commit: measured from the row's `create_time` (DB
/// clock; the INSERT, a little before the commit, so the figures err on the long side) to the
/// claim, plus this instance's own clock from the claim on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    /// Commit to the broker's acknowledgement of the send.
    pub to_broker: Duration,
    /// Commit to the row marked SUCCESS.
    pub to_success: Duration,
    /// How long this instance held the row SENDING (claim to SUCCESS).
    pub held: Duration,
}

/// Rows reclaimed per statement by the reclaimer.
const RECLAIM_LIMIT: usize = 500;
/// A send is not started with less lease than this left; the events are released instead.
const MIN_SEND_BUDGET: Duration = Duration::from_millis(20);
/// Margin kept between the end of a send and the end of its lease.
const LEASE_MARGIN_FRACTION: u32 = 10;

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

struct Chunk {
    seq: u64,
    token: u64,
    events: Vec<OutboundEvent>,
    /// Age of each event at the claim, for the latency hook.
    ages: Vec<Duration>,
    claimed: Instant,
    probe: bool,
}

struct Lease {
    token: u64,
    ids: Vec<EventId>,
    expires: Instant,
    renewed_at: Instant,
}

struct Inner {
    config: Config,
    store: Store,
    publisher: Arc<dyn Publisher>,
    counters: Counters,
    breaker: Mutex<Breaker>,
    dead_letter: Option<DeadLetterHook>,
    latency: Option<LatencyHook>,
    leases: Mutex<HashMap<u64, Lease>>,
    /// Wakes the scanner for new commits (the fast path).
    wake_tx: Sender<()>,
    /// Wakes the scanner when workers free capacity; heard only while it waits for capacity,
    /// so the fixed delay between scan rounds holds.
    capacity_tx: Sender<()>,
    stopping: AtomicBool,
    chunk_seq: AtomicU64,
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
        let store = Store::new(pool, &config, owner);
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
        });
        let mut handles = Vec::new();
        let spawn = |name: String, f: Box<dyn FnOnce() + Send>| -> Result<JoinHandle<()>> {
            std::thread::Builder::new()
                .name(name.clone())
                .spawn(f)
                .map_err(|e| Error::Publisher(format!("could not start thread {name}: {e}")))
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
        self.inner.counters.snapshot(self.instance_id(), state, gauges)
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

/// Waits for a wake-up, the shutdown signal or the timeout, whichever comes first.
fn wait(wake: &Receiver<()>, shutdown: &Receiver<()>, timeout: Duration) {
    select! {
        recv(wake) -> _ => {},
        recv(shutdown) -> _ => {},
        default(timeout) => {},
    }
}

/// [`wait`], also woken when a worker finishes a chunk (capacity freed).
fn wait_or_capacity(wake: &Receiver<()>, capacity: &Receiver<()>, shutdown: &Receiver<()>, timeout: Duration) {
    select! {
        recv(wake) -> _ => {},
        recv(capacity) -> _ => {},
        recv(shutdown) -> _ => {},
        default(timeout) => {},
    }
}

fn scanner_loop(
    inner: &Inner,
    chunk_tx: Sender<Chunk>,
    wake: Receiver<()>,
    capacity: Receiver<()>,
    shutdown: Receiver<()>,
) {
    let cfg = &inner.config;
    let ordered = cfg.ordering == crate::config::Ordering::PerBizNo;
    // A key's run travels in one publish call.
    let run_max = call_max(cfg);
    // While a backlog drains, each round starts where the last full one ended (see
    // `ScanPosition`). A round from the head of the index runs after any short round and at
    // least every scan interval, and finds rows that became due behind the position (commits
    // that took long, rows a failed claim left behind).
    let mut position: Option<ScanPosition> = None;
    let mut last_head_scan = Instant::now();
    while !inner.stopping.load(SeqCst) {
        let in_flight = inner.counters.in_flight.load(SeqCst) as usize;
        let free = cfg.max_in_flight.saturating_sub(in_flight);
        // Backpressure: claim only when a whole batch fits, so a draining backlog is claimed in
        // full batches rather than in the slivers that finishing chunks free (each round costs
        // the same statements whatever its size). Workers wake the scanner as they finish.
        if free < cfg.batch_size.min(cfg.max_in_flight) {
            wait(&capacity, &shutdown, cfg.scan_interval);
            continue;
        }
        let permit = inner.breaker.lock().permit(Instant::now());
        let limit = match permit {
            Permit::Claim => cfg.batch_size.min(free),
            Permit::Probe => 1,
            Permit::WaitUntil(until) => {
                wait(&wake, &shutdown, until.saturating_duration_since(Instant::now()));
                continue;
            }
            Permit::WaitForProbe => {
                wait(&wake, &shutdown, cfg.scan_interval);
                continue;
            }
        };
        let lease_start = Instant::now();
        if lease_start.duration_since(last_head_scan) >= cfg.scan_interval {
            position = None;
        }
        let from_head = position.is_none();
        if from_head {
            last_head_scan = lease_start;
        }
        let result = catch_unwind(AssertUnwindSafe(|| match cfg.claim_strategy {
            // Per-key order: runs of keys whose oldest pending event is due.
            _ if ordered => inner.store.claim_ordered_after(limit, run_max, position.as_ref()),
            ClaimStrategy::SkipLocked => inner.store.claim_skip_locked_after(limit, position.as_ref()),
            // The seed's algorithm, as the seed runs it: always from the head.
            ClaimStrategy::PerRow => inner.store.claim_per_row(limit),
        }));
        let round = match result {
            Ok(Ok(round)) => {
                inner.counters.claims.succeeded();
                round
            }
            Ok(Err(e)) => {
                position = None;
                Counters::add(&inner.counters.db_errors, 1);
                // WARN at first, then ERROR at a bounded rate; a stall for /healthz and the stats.
                inner.counters.claims.failed(&e);
                if permit == Permit::Probe {
                    inner.breaker.lock().probe_not_sent();
                }
                wait(&wake, &shutdown, cfg.scan_interval);
                continue;
            }
            Err(_) => {
                position = None;
                log::error!("claim round panicked; the scanner goes on");
                wait(&wake, &shutdown, cfg.scan_interval);
                continue;
            }
        };
        let n = round.claimed.len();
        let conflicts = round.conflicts as usize;
        let blocked = round.blocked;
        let ordered_next = ordered.then(|| OrderedNext::after(&round, limit));
        if ordered {
            inner.counters.blocked.round(&OrderedRound {
                claimed: n as u64,
                blocked,
                stuck: round.stuck,
                stuck_keys: round.stuck_keys,
                dead_heads: round.dead_heads,
                in_flight: in_flight as u64,
                from_head,
            });
        }
        position = match ordered_next {
            // Walk past a window of keys that stay blocked for a while.
            Some(OrderedNext::SkipAhead) if cfg.scan_drain => round.last.clone(),
            // Same start: claimed rows left the window, or it waits on runs in flight.
            Some(OrderedNext::Again | OrderedNext::WaitForRuns) if cfg.scan_drain => position,
            Some(_) => None,
            None if n + conflicts >= limit && cfg.claim_strategy == ClaimStrategy::SkipLocked && cfg.scan_drain => {
                round.last.clone()
            }
            None => None,
        };
        Counters::add(&inner.counters.claim_rounds, 1);
        Counters::add(&inner.counters.claimed, n as u64);
        Counters::add(&inner.counters.claim_conflicts, round.conflicts);
        Counters::add(&inner.counters.claim_blocked, blocked);
        if permit == Permit::Probe && n == 0 {
            inner.breaker.lock().probe_not_sent();
        }
        if n > 0 {
            inner.counters.in_flight.fetch_add(n as u64, SeqCst);
            dispatch(inner, &chunk_tx, round, lease_start, permit == Permit::Probe);
        }
        if let Some(next) = ordered_next.filter(|_| cfg.scan_drain && permit == Permit::Claim) {
            match next {
                OrderedNext::Again | OrderedNext::SkipAhead => continue,
                // A short round after a position ends the walk: the head round follows at once.
                OrderedNext::Idle if !from_head => continue,
                // Ours wake the scanner as they end; another instance's are seen at the interval.
                OrderedNext::WaitForRuns => wait_or_capacity(&wake, &capacity, &shutdown, cfg.scan_interval),
                OrderedNext::Idle => wait(&wake, &shutdown, cfg.scan_interval),
            }
            continue;
        }
        // A full round of candidates means a backlog is waiting: scan again at once. Candidates
        // another instance took count too (per-row), or racing instances would idle a whole
        // interval after every lost race. A short round that started at a position only ends
        // the range after it: the head round follows at once.
        if (n + conflicts >= limit || !from_head) && cfg.scan_drain && permit == Permit::Claim {
            continue;
        }
        wait(&wake, &shutdown, cfg.scan_interval);
    }
}

/// What the scanner does after an ordered round (see docs/ordering.md, "The window").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OrderedNext {
    /// Runs were claimed, so they left the window: scan again from the same start.
    Again,
    /// A full window, nothing claimable, mostly keys that stay blocked a while (backoff, park,
    /// dead head): scan on after it, or they would hide every key behind them.
    SkipAhead,
    /// Nothing claimable, mostly keys with a run in flight: wait until a run ends.
    WaitForRuns,
    /// The due rows ended: wait for a commit or the interval.
    Idle,
}

impl OrderedNext {
    fn after(round: &ClaimRound, limit: usize) -> OrderedNext {
        let n = round.claimed.len() as u64;
        let busy = round.blocked - round.stuck;
        if n > 0 {
            OrderedNext::Again
        } else if n + round.blocked >= limit as u64 && round.stuck >= busy {
            OrderedNext::SkipAhead
        } else if busy > 0 {
            OrderedNext::WaitForRuns
        } else {
            OrderedNext::Idle
        }
    }
}

/// The most events one publish call takes: `publish.batch.max`, within `max.in.flight`.
fn call_max(cfg: &Config) -> usize {
    cfg.publish_batch_max.min(cfg.max_in_flight).max(1)
}

/// The size of each of as few chunks of at most `most` as hold `n` events, about even.
fn even_chunk(n: usize, most: usize) -> usize {
    n.div_ceil(n.div_ceil(most).max(1)).max(1)
}

/// Splits a claim round into chunks of one topic, spread over the workers, and queues them.
fn dispatch(inner: &Inner, chunk_tx: &Sender<Chunk>, round: ClaimRound, lease_start: Instant, probe: bool) {
    if !round.runs.is_empty() {
        return dispatch_runs(inner, chunk_tx, round, lease_start, probe);
    }
    // As few publish calls as `publish.batch.max` allows, of even sizes: every call costs a
    // broker round trip and an ack statement whatever its size. Workers run in parallel on the
    // chunks of consecutive rounds while the scanner claims the next.
    let per_chunk = even_chunk(round.claimed.len(), call_max(&inner.config));
    // (claim token, topic, events with their age at the claim)
    type Group = (u64, String, Vec<(OutboundEvent, Duration)>);
    let mut by_topic: Vec<Group> = Vec::new();
    for Claimed { event, token, age } in round.claimed {
        match by_topic
            .iter_mut()
            .find(|(t, topic, _)| *t == token && *topic == event.topic)
        {
            Some((_, _, v)) => v.push((event, age)),
            None => by_topic.push((token, event.topic.clone(), vec![(event, age)])),
        }
    }
    for (token, _, events) in by_topic {
        let mut events = events.into_iter().peekable();
        while events.peek().is_some() {
            let (part, ages): (Vec<OutboundEvent>, Vec<Duration>) = events.by_ref().take(per_chunk).unzip();
            queue_chunk(inner, chunk_tx, token, part, ages, lease_start, probe);
        }
    }
}

/// Ordered dispatch: every key's run (per topic) stays whole in one chunk, in id order, so it is
/// sent in order by one worker. Runs bound for one broker queue (as the publisher's
/// [`Publisher::queue_hint`] tells) share chunks, as few as `publish.batch.max` allows, of about
/// even sizes: a chunk is then one broker request, acked as soon as its queue answers, and a
/// queue in two chunks would only be sent to twice. Without hints, runs are packed per topic and
/// the publisher sends a chunk's queues at once.
fn dispatch_runs(inner: &Inner, chunk_tx: &Sender<Chunk>, round: ClaimRound, lease_start: Instant, probe: bool) {
    let most = call_max(&inner.config);
    // Where a part goes: (claim token, topic, queue hint).
    type Lane = (u64, String, Option<u64>);
    // A key's run, split by topic (each part keeps its id order): events with their ages.
    type Part = (Vec<OutboundEvent>, Vec<Duration>);
    let mut lanes: Vec<(Lane, Vec<Part>)> = Vec::new();
    let mut claimed = round.claimed.into_iter();
    for len in round.runs {
        let mut parts: Vec<(u64, String, Part)> = Vec::new();
        for Claimed { event, token, age } in claimed.by_ref().take(len) {
            match parts.iter_mut().find(|p| p.0 == token && p.1 == event.topic) {
                Some((_, _, (events, ages))) => {
                    events.push(event);
                    ages.push(age);
                }
                None => parts.push((token, event.topic.clone(), (vec![event], vec![age]))),
            }
        }
        for (token, topic, part) in parts {
            // One key, one topic: one queue. Only a hint: a publisher panicking on it costs the
            // packing, never the claimed rows.
            let hint = catch_unwind(AssertUnwindSafe(|| inner.publisher.queue_hint(&part.0[0]))).unwrap_or(None);
            let lane = (token, topic, hint);
            match lanes.iter_mut().find(|(l, _)| *l == lane) {
                Some((_, v)) => v.push(part),
                None => lanes.push((lane, vec![part])),
            }
        }
    }
    for ((token, _, _), parts) in lanes {
        let n: usize = parts.iter().map(|p| p.0.len()).sum();
        let max = even_chunk(n, most);
        let (mut events, mut ages) = (Vec::new(), Vec::new());
        for (part, part_ages) in parts {
            if !events.is_empty() && events.len() + part.len() > max {
                queue_chunk(
                    inner,
                    chunk_tx,
                    token,
                    std::mem::take(&mut events),
                    std::mem::take(&mut ages),
                    lease_start,
                    probe,
                );
            }
            events.extend(part);
            ages.extend(part_ages);
        }
        if !events.is_empty() {
            queue_chunk(inner, chunk_tx, token, events, ages, lease_start, probe);
        }
    }
}

/// Registers the lease of one chunk and hands it to the workers.
fn queue_chunk(
    inner: &Inner,
    chunk_tx: &Sender<Chunk>,
    token: u64,
    events: Vec<OutboundEvent>,
    ages: Vec<Duration>,
    lease_start: Instant,
    probe: bool,
) {
    let seq = inner.chunk_seq.fetch_add(1, Relaxed);
    inner.leases.lock().insert(
        seq,
        Lease {
            token,
            ids: events.iter().map(|e| e.id).collect(),
            expires: lease_start + inner.config.lease,
            renewed_at: lease_start,
        },
    );
    let chunk = Chunk {
        seq,
        token,
        events,
        ages,
        claimed: lease_start,
        probe,
    };
    // Never blocks: the channel holds max.in.flight chunks and at most that many events are in
    // flight. Fails only if every worker has died; then release the rows.
    if let Err(e) = chunk_tx.try_send(chunk) {
        let chunk = e.into_inner();
        log::error!(
            "no worker to take {} claimed events; releasing them",
            chunk.events.len()
        );
        release_chunk_unsent(inner, &chunk, "no worker available");
        finish(inner, &chunk);
    }
}

fn worker_loop(inner: &Inner, chunks: Receiver<Chunk>) {
    for chunk in chunks.iter() {
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            if inner.stopping.load(SeqCst) {
                release_chunk_unsent(inner, &chunk, "relay stopping before the send");
            } else {
                process(inner, &chunk);
            }
        }));
        if outcome.is_err() {
            log::error!(
                "worker panicked while handling events {:?}; they stay claimed until their lease expires",
                ids_of(&chunk.events)
            );
        }
        finish(inner, &chunk);
    }
}

/// Forgets a handled chunk and wakes the scanner (capacity freed).
fn finish(inner: &Inner, chunk: &Chunk) {
    inner.leases.lock().remove(&chunk.seq);
    inner.counters.in_flight.fetch_sub(chunk.events.len() as u64, SeqCst);
    let _ = inner.capacity_tx.try_send(());
}

fn ids_of(events: &[OutboundEvent]) -> Vec<EventId> {
    events.iter().map(|e| e.id).collect()
}

fn process(inner: &Inner, chunk: &Chunk) {
    let cfg = &inner.config;
    if !chunk.probe && !inner.breaker.lock().allows_send() {
        release_chunk_unsent(inner, chunk, "broker unavailable (circuit breaker open)");
        return;
    }
    let Some(expires) = inner.leases.lock().get(&chunk.seq).map(|l| l.expires) else {
        return;
    };
    // The send must end before the lease does, with a margin.
    let margin = cfg.lease / LEASE_MARGIN_FRACTION;
    let budget = expires.saturating_duration_since(Instant::now()).saturating_sub(margin);
    let timeout = cfg.send_timeout.min(budget);
    if timeout < MIN_SEND_BUDGET {
        release_chunk_unsent(inner, chunk, "lease nearly expired before the send");
        return;
    }
    Counters::add(&inner.counters.publish_calls, 1);
    let outcomes = match catch_unwind(AssertUnwindSafe(|| inner.publisher.publish(&chunk.events, timeout))) {
        Ok(v) if v.len() == chunk.events.len() => v,
        Ok(v) => {
            let msg = format!(
                "publisher returned {} outcomes for {} events",
                v.len(),
                chunk.events.len()
            );
            log::error!("{msg}");
            vec![SendOutcome::Failed(SendError::rejected(msg)); chunk.events.len()]
        }
        Err(panic) => {
            Counters::add(&inner.counters.publish_panics, 1);
            let msg = format!("publisher panicked: {}", panic_message(&*panic));
            log::error!("{msg} (events {:?})", ids_of(&chunk.events));
            vec![SendOutcome::Failed(SendError::rejected(msg)); chunk.events.len()]
        }
    };
    let broker_acked = chunk.claimed.elapsed();
    record_outcomes(inner, chunk, outcomes, broker_acked);
}

/// `broker_acked`: time from the claim to the publisher's answer.
fn record_outcomes(inner: &Inner, chunk: &Chunk, outcomes: Vec<SendOutcome>, broker_acked: Duration) {
    let cfg = &inner.config;
    let mut acks = Vec::new();
    let mut acked_ages = Vec::new();
    let mut unavailable = Vec::new();
    let mut parked: Vec<(EventId, SendError)> = Vec::new();
    let mut held_back: Vec<EventId> = Vec::new();
    let mut retry: Vec<(&OutboundEvent, SendError)> = Vec::new();
    let mut dead: Vec<(&OutboundEvent, SendError)> = Vec::new();
    let mut timeouts = 0usize;
    for ((event, outcome), age) in chunk.events.iter().zip(outcomes).zip(&chunk.ages) {
        match outcome {
            SendOutcome::Sent { msg_id } => {
                acks.push((event.id, msg_id));
                acked_ages.push(*age);
            }
            SendOutcome::Failed(e) if e.kind == FailureKind::Unavailable => unavailable.push((event.id, e)),
            SendOutcome::Failed(e) if e.kind == FailureKind::Parked => parked.push((event.id, e)),
            SendOutcome::Failed(e) if e.kind == FailureKind::HeldBack => held_back.push(event.id),
            SendOutcome::Failed(e) => {
                if e.kind == FailureKind::Timeout {
                    timeouts += 1;
                }
                // `attempt` is the row's retry_count at the claim; the claim token guarantees no
                // one changed it since. This attempt is number attempt + 1.
                if event.attempt >= cfg.max_retry {
                    dead.push((event, e));
                } else {
                    retry.push((event, e));
                }
            }
        }
    }
    // The breaker hears about the call as a whole, parked events left out (their broker is
    // down, not the broker as a whole).
    let transition = {
        let mut b = inner.breaker.lock();
        let n = chunk.events.len() - parked.len() - held_back.len();
        if n == 0 {
            if chunk.probe {
                b.probe_not_sent();
            }
            None
        } else if !acks.is_empty() {
            b.on_success()
        } else if unavailable.len() == n || timeouts == n {
            b.on_failure(Instant::now())
        } else {
            b.on_message_failure()
        }
    };
    if let Some(t) = transition {
        log_breaker(inner, t, unavailable.first().map(|(_, e)| e.message.as_str()));
    }
    // An unknown outcome may have been stored by the broker: each such row may arrive twice,
    // and each also used an attempt (retry or dead letter below).
    if timeouts > 0 {
        Counters::add(&inner.counters.possible_duplicates, timeouts as u64);
    }
    let lease_end = lease_end(inner, chunk);
    let token = chunk.token;
    if !acks.is_empty() {
        let want = acks.len() as u64;
        if let Some(got) = with_db_retry(inner, lease_end, "ack", || inner.store.ack(token, &acks)) {
            Counters::add(&inner.counters.sent, got);
            if let Some(hook) = &inner.latency {
                let held = chunk.claimed.elapsed();
                for age in &acked_ages {
                    hook(&Delivery {
                        to_broker: *age + broker_acked,
                        to_success: *age + held,
                        held,
                    });
                }
            }
            if got < want {
                Counters::add(&inner.counters.stale_acks, want - got);
                log::warn!(
                    "{} of {want} acks matched no row: their lease was lost before the ack (events are resent under the newer claim)",
                    want - got
                );
            }
        }
    }
    if !unavailable.is_empty() {
        let ids: Vec<EventId> = unavailable.iter().map(|(id, _)| *id).collect();
        let reason = format!("broker unavailable: {}", unavailable[0].1.message);
        if let Some(n) = with_db_retry(inner, lease_end, "release", || {
            inner.store.release_unsent(token, &ids, &reason)
        }) {
            Counters::add(&inner.counters.released_unsent, n);
        }
    }
    if !parked.is_empty() {
        let ids: Vec<EventId> = parked.iter().map(|(id, _)| *id).collect();
        let reason = format!("parked: {}", parked[0].1.message);
        if let Some(n) = with_db_retry(inner, lease_end, "release", || {
            inner.store.release_parked(token, &ids, &reason, cfg.breaker_open)
        }) {
            Counters::add(&inner.counters.parked, n);
        }
    }
    if !held_back.is_empty() {
        if let Some(n) = with_db_retry(inner, lease_end, "release", || {
            inner
                .store
                .release_unsent(token, &held_back, "held back: an earlier event of the key failed")
        }) {
            Counters::add(&inner.counters.released_unsent, n);
        }
    }
    for (event, e) in &retry {
        log::debug!(
            "event {} attempt {} failed, will retry: {e}",
            event.id,
            event.attempt + 1
        );
    }
    // Rows sharing an outcome share one statement; the error text of the first stands for all.
    if !retry.is_empty() {
        let ids: Vec<EventId> = retry.iter().map(|(e, _)| e.id).collect();
        let reason = retry[0].1.to_string();
        if let Some(n) = with_db_retry(inner, lease_end, "release", || {
            inner.store.release_for_retry(token, &ids, &reason)
        }) {
            Counters::add(&inner.counters.retried, n);
        }
    }
    if !dead.is_empty() {
        let ids: Vec<EventId> = dead.iter().map(|(e, _)| e.id).collect();
        let reason = dead[0].1.to_string();
        if let Some(n) = with_db_retry(inner, lease_end, "fail", || inner.store.fail(token, &ids, &reason)) {
            // Only when every row was still ours do we know exactly which ones ended FAIL.
            if n == ids.len() as u64 {
                let letters: Vec<DeadLetter> = dead
                    .iter()
                    .map(|(ev, e)| DeadLetter {
                        id: ev.id,
                        biz_no: ev.biz_no.clone(),
                        event_type: ev.event_type.clone(),
                        retry_count: ev.attempt + 1,
                        last_error: e.to_string(),
                    })
                    .collect();
                dead_lettered(inner, &letters);
            } else {
                log::warn!(
                    "{} of {} dead letters had lost their lease; another claim owns them",
                    ids.len() as u64 - n,
                    ids.len()
                );
                Counters::add(&inner.counters.dead_lettered, n);
            }
        }
    }
}

fn log_breaker(inner: &Inner, t: Transition, reason: Option<&str>) {
    match t {
        Transition::Opened { failures } => {
            Counters::add(&inner.counters.breaker_opened, 1);
            log::warn!(
                "circuit breaker opened after {failures} consecutive broker-wide failures ({}); claiming paused, probing every {} ms",
                reason.unwrap_or("timeouts"),
                inner.config.breaker_open.as_millis()
            );
        }
        Transition::Reopened => log::debug!("circuit breaker probe failed; staying open"),
        Transition::Closed => {
            Counters::add(&inner.counters.breaker_closed, 1);
            log::info!("circuit breaker closed: the broker accepts messages again");
        }
    }
}

fn dead_lettered(inner: &Inner, letters: &[DeadLetter]) {
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

/// When the chunk's lease ends (now, if it is no longer tracked).
fn lease_end(inner: &Inner, chunk: &Chunk) -> Instant {
    inner
        .leases
        .lock()
        .get(&chunk.seq)
        .map(|l| l.expires)
        .unwrap_or_else(Instant::now)
}

fn release_chunk_unsent(inner: &Inner, chunk: &Chunk, reason: &str) {
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
fn with_db_retry(inner: &Inner, until: Instant, what: &str, mut f: impl FnMut() -> Result<u64>) -> Option<u64> {
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

fn retention_loop(inner: &Inner, age: Duration, shutdown: Receiver<()>) {
    let cfg = &inner.config;
    let never = crossbeam_channel::never::<()>();
    while !inner.stopping.load(SeqCst) {
        let round = catch_unwind(AssertUnwindSafe(|| {
            crate::admin::purge(
                inner.store.pool(),
                &cfg.table,
                age,
                cfg.retention_batch,
                cfg.retention_round_max,
                |_| {},
            )
        }));
        match round {
            Ok(Ok(0)) => {}
            Ok(Ok(n)) => log::info!("retention deleted {n} rows older than {} s", age.as_secs()),
            Ok(Err(e)) => {
                Counters::add(&inner.counters.db_errors, 1);
                log::warn!("retention round failed: {e}");
            }
            Err(p) => log::error!("retention round panicked: {}", panic_message(&*p)),
        }
        wait(&never, &shutdown, cfg.retention_interval);
    }
}

fn reclaimer_loop(inner: &Inner, shutdown: Receiver<()>) {
    let cfg = &inner.config;
    let renew_after = cfg.lease.mul_f64(cfg.lease_renew_fraction);
    let tick = if cfg.lease_renew_fraction > 0.0 {
        cfg.reclaim_interval
            .min((renew_after / 4).max(Duration::from_millis(10)))
    } else {
        cfg.reclaim_interval
    };
    let mut next_reclaim = Instant::now();
    let never = crossbeam_channel::never::<()>();
    while !inner.stopping.load(SeqCst) {
        let now = Instant::now();
        if cfg.lease_renew_fraction > 0.0 {
            if let Err(p) = catch_unwind(AssertUnwindSafe(|| renew_due(inner, renew_after))) {
                log::error!("lease renewal panicked: {}", panic_message(&*p));
            }
        }
        if now >= next_reclaim {
            if let Err(p) = catch_unwind(AssertUnwindSafe(|| reclaim_round(inner))) {
                log::error!("reclaim panicked: {}", panic_message(&*p));
            }
            next_reclaim = Instant::now() + cfg.reclaim_interval;
        }
        wait(
            &never,
            &shutdown,
            tick.min(next_reclaim.saturating_duration_since(Instant::now())),
        );
    }
}

/// Renews the lease of every chunk held longer than `renew_after` since its claim or last renewal.
fn renew_due(inner: &Inner, renew_after: Duration) {
    let now = Instant::now();
    let due: Vec<(u64, u64, Vec<EventId>)> = inner
        .leases
        .lock()
        .iter()
        .filter(|(_, l)| now.duration_since(l.renewed_at) >= renew_after)
        .map(|(seq, l)| (*seq, l.token, l.ids.clone()))
        .collect();
    for (seq, token, ids) in due {
        let started = Instant::now();
        match inner.store.renew(token, &ids) {
            Ok(n) => {
                inner.counters.writes.succeeded();
                Counters::add(&inner.counters.renewed, n);
                if let Some(l) = inner.leases.lock().get_mut(&seq) {
                    l.renewed_at = started;
                    if n > 0 {
                        l.expires = started + inner.config.lease;
                    }
                }
                if n < ids.len() as u64 {
                    log::warn!(
                        "lease renewal: {} of {} events were no longer ours",
                        ids.len() as u64 - n,
                        ids.len()
                    );
                }
            }
            Err(e) => {
                Counters::add(&inner.counters.db_errors, 1);
                inner.counters.writes.failed(&format_args!("lease renewal: {e}"));
            }
        }
    }
}

fn reclaim_round(inner: &Inner) {
    loop {
        match inner.store.reclaim_expired(inner.config.lease, RECLAIM_LIMIT) {
            Ok(r) => {
                let total = r.returned + r.dead.len() as u64;
                if total > 0 {
                    Counters::add(&inner.counters.reclaimed, total);
                    log::warn!(
                        "reclaimed {total} events whose lease expired ({} back to WAIT, {} dead-lettered): an instance died or stalled",
                        r.returned,
                        r.dead.len()
                    );
                    dead_lettered(inner, &r.dead);
                }
                if (total as usize) < RECLAIM_LIMIT || inner.stopping.load(SeqCst) {
                    return;
                }
            }
            Err(e) => {
                Counters::add(&inner.counters.db_errors, 1);
                log::warn!("reclaim failed: {e}");
                return;
            }
        }
    }
}
