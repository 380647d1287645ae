//! The consumer runtime: the consuming half of the pattern (docs/inbox.md).
//!
//! A [`Consumer`] takes messages from a [`Source`] (RocketMQ: `outbox::rocketmq::RocketMqSource`,
//! cargo feature `rocketmq`) and runs the service's [`Handler`] on each, inside a database transaction
//! that also holds the message's [inbox](crate::inbox) mark: the handler's writes commit once per
//! consumer group and event key, however many copies arrive.
//!
//! Threads (blocking, like the relay):
//! - the **poller** takes messages from the source and hands each to the handler thread of its
//!   queue (a queue always goes to the same thread, so a queue's messages, and so an ordered
//!   key's events, are handled one at a time in offset order), and commits offsets;
//! - **handler threads** (`threads`) run mark + handler + commit. A handler error is retried
//!   with exponential backoff (the queue waits); after `max_attempts` the message is parked in
//!   the dead-letter table and the queue moves on. Database failures (connection lost, lock wait
//!   timeout, deadlock, also inside the handler) are retried without using an attempt;
//! - the **replayer** handles the group's dead letters an operator asked to replay, and deletes
//!   inbox marks past their retention (7 days by default).
//!
//! **Offsets move only after the database commit**: a message's offset is committed to the
//! source once its transaction committed (processed), its mark was found (duplicate) or it was
//! parked. A consumer killed before that gets the message again from the broker; the inbox turns
//! the copy into a duplicate.

pub mod dead_letter;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, Sender};
use mysql::{Pool, Transaction, TxOpts};
use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::inbox::{Inbox, MessageMeta};

/// A queue of a topic on one broker.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueueRef {
    pub topic: String,
    pub broker: String,
    pub queue_id: u32,
}

impl fmt::Display for QueueRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}#{}", self.topic, self.broker, self.queue_id)
    }
}

/// Where a message's dedup key came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeySource {
    /// The `eventKey` property the relay sets: unique across outbox tables and databases.
    EventKey,
    /// No `eventKey` (a message from an older publisher): `<topic>#<eventId>`, unique only
    /// within one outbox table per topic.
    EventId,
    /// Neither property: the broker's message id, which differs between two sends of one event
    /// (duplicates from a resend are not caught).
    MessageId,
}

/// One message, as the handler sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub queue: QueueRef,
    pub offset: u64,
    /// The broker's message id.
    pub msg_id: Option<String>,
    /// The dedup key the inbox marks ([`KeySource`] says where it came from).
    pub key: String,
    pub key_source: KeySource,
    pub tag: Option<String>,
    /// User properties (`eventId`, `eventKey`, `eventType`, `bizNo` and the row's headers).
    pub properties: BTreeMap<String, String>,
    pub body: Vec<u8>,
}

/// The message property with the dedup key (what the relay sets).
pub const EVENT_KEY_PROPERTY: &str = "eventKey";

impl Message {
    /// Builds a message and picks its dedup key: the `eventKey` property, else `<topic>#<eventId>`,
    /// else the broker's message id.
    pub fn new(
        queue: QueueRef,
        offset: u64,
        msg_id: Option<String>,
        tag: Option<String>,
        properties: BTreeMap<String, String>,
        body: Vec<u8>,
    ) -> Message {
        let (key, key_source) = match (properties.get(EVENT_KEY_PROPERTY), properties.get("eventId")) {
            (Some(k), _) if !k.is_empty() => (k.clone(), KeySource::EventKey),
            (_, Some(id)) if !id.is_empty() => (format!("{}#{id}", queue.topic), KeySource::EventId),
            _ => (
                format!("msg:{}", msg_id.as_deref().unwrap_or_default()),
                KeySource::MessageId,
            ),
        };
        Message {
            queue,
            offset,
            msg_id,
            key,
            key_source,
            tag,
            properties,
            body,
        }
    }

    pub fn property(&self, name: &str) -> Option<&str> {
        self.properties.get(name).map(String::as_str)
    }

    /// The outbox row id (`eventId`), unique within one outbox table.
    pub fn event_id(&self) -> Option<u64> {
        self.property("eventId").and_then(|v| v.parse().ok())
    }

    pub fn event_type(&self) -> Option<&str> {
        self.property("eventType")
    }

    pub fn biz_no(&self) -> Option<&str> {
        self.property("bizNo")
    }

    fn meta(&self) -> MessageMeta {
        MessageMeta {
            topic: Some(self.queue.topic.clone()).filter(|t| t.chars().count() <= crate::event::MAX_TOPIC_CHARS),
            queue_id: Some(self.queue.queue_id),
            queue_offset: Some(self.offset),
            msg_id: self
                .msg_id
                .clone()
                .filter(|m| m.chars().count() <= crate::inbox::MAX_MSG_ID_CHARS),
        }
    }
}

/// Where messages come from. Implementations must be `Send + Sync`: the poller calls `poll` and
/// `commit`, the stats reader `lag`.
pub trait Source: Send + Sync + 'static {
    /// The next messages (any number, possibly none), waiting at most about `timeout`.
    fn poll(&self, timeout: Duration) -> Result<Vec<Message>>;
    /// Records, per queue, the offset of the next message to consume: every message before it
    /// is done. `persist` also stores the offsets with the broker now (otherwise the source may
    /// keep them in memory for a while).
    fn commit(&self, next_offsets: &[(QueueRef, u64)], persist: bool);
    /// Messages on the assigned queues not yet committed, if known.
    fn lag(&self) -> Option<u64> {
        None
    }
    /// Leaves the group and releases the source's resources.
    fn shutdown(&self);
}

/// What a handler returns on failure: any error. Database errors that are transient (see
/// [`Error::is_retriable`]) are retried without using an attempt.
pub type HandlerError = Box<dyn std::error::Error + Send + Sync>;

/// The service's code for one message, run inside the transaction that holds its inbox mark.
/// Write through `tx` only: what the handler does elsewhere (HTTP calls, files) is not undone by
/// a rollback and may happen more than once.
pub trait Handler: Send + Sync + 'static {
    fn handle(&self, tx: &mut Transaction<'_>, msg: &Message) -> std::result::Result<(), HandlerError>;
}

impl<F> Handler for F
where
    F: Fn(&mut Transaction<'_>, &Message) -> std::result::Result<(), HandlerError> + Send + Sync + 'static,
{
    fn handle(&self, tx: &mut Transaction<'_>, msg: &Message) -> std::result::Result<(), HandlerError> {
        self(tx, msg)
    }
}

/// How a consumer runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerConfig {
    /// The consumer group: the inbox marks keys per group.
    pub group: String,
    pub inbox_table: String,
    pub dead_letter_table: String,
    /// Handler threads (each with its own database connection).
    pub threads: usize,
    /// Handler attempts per message before it is parked in the dead-letter table.
    pub max_attempts: u32,
    /// Wait after a first failure; doubles per attempt up to `backoff_max`.
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// How often offsets are also stored with the broker (they are committed in memory at once).
    pub persist_interval: Duration,
    /// How often the replayer looks for dead letters to replay.
    pub replay_interval: Duration,
    /// Messages waiting per handler thread before the poller waits.
    pub queue_capacity: usize,
    /// How long marks are kept: the replayer deletes older ones (in small batches, every
    /// `retention_interval`). `None` keeps them (purge them yourself). Default: 7 days
    /// ([`crate::inbox::DEFAULT_RETENTION`]); never shorter than the broker's redelivery span.
    pub retention: Option<Duration>,
    pub retention_interval: Duration,
    /// Mark each key in the inbox before the handler runs (the default). Off, every copy runs
    /// the handler: only for handlers that are idempotent by themselves (and to measure what the
    /// inbox costs).
    pub inbox: bool,
}

impl ConsumerConfig {
    pub fn new(group: &str) -> ConsumerConfig {
        ConsumerConfig {
            group: group.to_string(),
            inbox_table: crate::inbox::DEFAULT_TABLE.into(),
            dead_letter_table: dead_letter::DEFAULT_TABLE.into(),
            threads: 4,
            max_attempts: 5,
            backoff_initial: Duration::from_millis(200),
            backoff_max: Duration::from_secs(10),
            persist_interval: Duration::from_secs(1),
            replay_interval: Duration::from_secs(2),
            queue_capacity: 256,
            retention: Some(crate::inbox::DEFAULT_RETENTION),
            retention_interval: Duration::from_secs(60),
            inbox: true,
        }
    }

    /// Every problem at once is not needed here: the first bad field, named with its value.
    pub fn validate(&self) -> Result<()> {
        crate::inbox::check_group(&self.group)?;
        crate::config::table_name("inbox.table", &self.inbox_table)?;
        crate::config::table_name("inbox.dead_letter.table", &self.dead_letter_table)?;
        let bad = |key: &str, value: String, reason: &str| -> Result<()> {
            Err(crate::ConfigError::invalid(key, value, reason).into())
        };
        if self.threads == 0 || self.threads > 256 {
            return bad("consumer.threads", self.threads.to_string(), "must be 1 to 256");
        }
        if self.max_attempts == 0 {
            return bad("consumer.max.attempts", "0".into(), "must be at least 1");
        }
        if self.backoff_initial.is_zero() || self.backoff_max < self.backoff_initial {
            return bad(
                "consumer.backoff",
                format!("{:?}..{:?}", self.backoff_initial, self.backoff_max),
                "initial must be > 0 and not above max",
            );
        }
        if self.queue_capacity == 0 {
            return bad("consumer.queue.capacity", "0".into(), "must be at least 1");
        }
        if self.retention.is_some_and(|r| r < Duration::from_secs(3600)) {
            return bad(
                "inbox.retention",
                format!("{:?}", self.retention.unwrap_or_default()),
                "must be at least 1 h: RocketMQ redelivers an unacknowledged message for hours, and a copy \
                 arriving after its mark is deleted is handled again",
            );
        }
        if self.persist_interval.is_zero() || self.replay_interval.is_zero() || self.retention_interval.is_zero() {
            return bad(
                "consumer.interval",
                "0".into(),
                "persist and replay intervals must be > 0",
            );
        }
        Ok(())
    }

    fn backoff(&self, attempt: u32) -> Duration {
        let factor = 1u32 << attempt.saturating_sub(1).min(16);
        self.backoff_initial.saturating_mul(factor).min(self.backoff_max)
    }
}

/// Counters of a running consumer (totals since start), and its lag.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConsumerStats {
    /// Messages taken from the source.
    pub received: u64,
    /// Handled: the handler ran and its transaction committed.
    pub processed: u64,
    /// Copies whose key the group had already processed: acknowledged without running the handler.
    pub duplicates: u64,
    /// Handler attempts that failed (each retried or, the last, parked).
    pub failed_attempts: u64,
    /// Messages parked in the dead-letter table.
    pub dead_lettered: u64,
    /// Dead letters handled again after a replay request.
    pub replayed: u64,
    /// Database failures retried without using an attempt.
    pub db_errors: u64,
    /// Messages whose dedup key is not the `eventKey` property ([`KeySource`]).
    pub fallback_keys: u64,
    /// Messages handed to handler threads and not yet done.
    pub in_flight: u64,
    /// Messages on the assigned queues not yet committed (`None` until known).
    pub lag: Option<u64>,
}

impl ConsumerStats {
    /// The Prometheus text exposition of these counters, labelled with the group.
    pub fn prometheus(&self, group: &str) -> String {
        let g = group.replace('\\', "\\\\").replace('"', "\\\"");
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, v: u64| {
            out.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{group=\"{g}\"}} {v}\n"
            ));
        };
        metric(
            "outbox_consumer_received_total",
            "counter",
            "Messages taken from the broker.",
            self.received,
        );
        metric(
            "outbox_consumer_processed_total",
            "counter",
            "Messages handled and committed.",
            self.processed,
        );
        metric(
            "outbox_consumer_duplicates_total",
            "counter",
            "Copies already processed by the group (handler not run).",
            self.duplicates,
        );
        metric(
            "outbox_consumer_failed_attempts_total",
            "counter",
            "Handler attempts that failed.",
            self.failed_attempts,
        );
        metric(
            "outbox_consumer_dead_lettered_total",
            "counter",
            "Messages parked in the dead-letter table.",
            self.dead_lettered,
        );
        metric(
            "outbox_consumer_replayed_total",
            "counter",
            "Dead letters handled again.",
            self.replayed,
        );
        metric(
            "outbox_consumer_db_errors_total",
            "counter",
            "Database failures retried without an attempt.",
            self.db_errors,
        );
        metric(
            "outbox_consumer_fallback_keys_total",
            "counter",
            "Messages without an eventKey property.",
            self.fallback_keys,
        );
        metric(
            "outbox_consumer_in_flight",
            "gauge",
            "Messages taken and not yet done.",
            self.in_flight,
        );
        if let Some(lag) = self.lag {
            metric(
                "outbox_consumer_lag_messages",
                "gauge",
                "Messages on the assigned queues not yet committed.",
                lag,
            );
        }
        out
    }
}

#[derive(Default)]
struct Counters {
    received: AtomicU64,
    processed: AtomicU64,
    duplicates: AtomicU64,
    failed_attempts: AtomicU64,
    dead_lettered: AtomicU64,
    replayed: AtomicU64,
    db_errors: AtomicU64,
    fallback_keys: AtomicU64,
    done: AtomicU64,
    /// -1: unknown.
    lag: AtomicI64,
}

struct Inner {
    config: ConsumerConfig,
    pool: Pool,
    inbox: Inbox,
    source: Arc<dyn Source>,
    handler: Arc<dyn Handler>,
    counters: Counters,
    /// Per queue, the next offset to commit (every message before it is done).
    done: Mutex<HashMap<QueueRef, u64>>,
    /// Disconnected when the consumer stops: every wait selects on it.
    stop_rx: Receiver<()>,
    /// Rate limit of repeated warnings.
    warned: Mutex<HashMap<&'static str, Instant>>,
}

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

/// What became of a message in a handler thread.
enum Done {
    Processed,
    Duplicate,
    DeadLettered,
    /// The consumer is stopping: not done, its offset is not committed.
    Abandoned,
}

enum Failure {
    /// Database trouble (retried without an attempt).
    Db(Error),
    /// The handler failed (an attempt), or the message cannot be marked at all (`poison`).
    Handler { error: String, poison: bool },
}

impl Consumer {
    /// Starts the threads. `pool` is the service's database (where the inbox and dead-letter
    /// tables are, see [`crate::migrate`]); the handler's transactions come from it.
    pub fn start(
        config: ConsumerConfig,
        pool: Pool,
        source: Arc<dyn Source>,
        handler: Arc<dyn Handler>,
    ) -> Result<Consumer> {
        config.validate()?;
        // Fail fast, with the database's own message, if it is unreachable or a table is missing.
        {
            use mysql::prelude::Queryable;
            let mut conn = pool.get_conn()?;
            conn.query_drop(format!("SELECT 1 FROM {} LIMIT 0", config.inbox_table))?;
            conn.query_drop(format!("SELECT 1 FROM {} LIMIT 0", config.dead_letter_table))?;
        }
        let (stop_tx, stop_rx) = bounded::<()>(0);
        let inner = Arc::new(Inner {
            inbox: Inbox::new(&config.inbox_table)?,
            config,
            pool,
            source,
            handler,
            counters: Counters {
                lag: AtomicI64::new(-1),
                ..Counters::default()
            },
            done: Mutex::new(HashMap::new()),
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
            "consumer {} started: {} handler threads, inbox {}, dead letters in {}",
            inner.config.group,
            inner.config.threads,
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
        stats_of(&self.inner)
    }

    /// Stops taking messages, lets each handler thread finish the message in hand (the others
    /// are not acknowledged: the broker delivers them again), commits and stores the offsets,
    /// and leaves the group. Returns the final counters.
    pub fn stop(mut self) -> ConsumerStats {
        self.shutdown();
        stats_of(&self.inner)
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
        self.inner.source.shutdown();
        let s = stats_of(&self.inner);
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
        .map_err(|e| Error::Publisher(format!("could not start thread {name}: {e}")))
}

fn stats_of(inner: &Inner) -> ConsumerStats {
    let c = &inner.counters;
    let received = c.received.load(Relaxed);
    let lag = c.lag.load(Relaxed);
    ConsumerStats {
        received,
        processed: c.processed.load(Relaxed),
        duplicates: c.duplicates.load(Relaxed),
        failed_attempts: c.failed_attempts.load(Relaxed),
        dead_lettered: c.dead_lettered.load(Relaxed),
        replayed: c.replayed.load(Relaxed),
        db_errors: c.db_errors.load(Relaxed),
        fallback_keys: c.fallback_keys.load(Relaxed),
        in_flight: received.saturating_sub(c.done.load(Relaxed)),
        lag: u64::try_from(lag).ok(),
    }
}

impl Inner {
    fn stopping(&self) -> bool {
        matches!(
            self.stop_rx.try_recv(),
            Err(crossbeam_channel::TryRecvError::Disconnected)
        )
    }

    /// Waits `d` unless the consumer stops first; false if it is stopping.
    fn pause(&self, d: Duration) -> bool {
        !matches!(
            self.stop_rx.recv_timeout(d),
            Err(crossbeam_channel::RecvTimeoutError::Disconnected)
        )
    }

    /// A warning at most every 10 s per kind (the counters have the totals).
    fn warn(&self, kind: &'static str, text: impl FnOnce() -> String) {
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

/// The handler thread of a queue: messages are routed by queue, so each queue is handled here
/// in offset order, one message at a time.
fn queue_thread(queue: &QueueRef, threads: usize) -> usize {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    queue.hash(&mut h);
    (h.finish() % threads as u64) as usize
}

fn poll_loop(inner: &Inner, senders: Vec<Sender<Message>>) {
    let mut last_persist = Instant::now();
    let mut last_lag = Instant::now() - Duration::from_secs(60);
    'outer: while !inner.stopping() {
        match inner.source.poll(Duration::from_millis(100)) {
            Ok(batch) => {
                for msg in batch {
                    inner.counters.received.fetch_add(1, Relaxed);
                    if msg.key_source != KeySource::EventKey {
                        inner.counters.fallback_keys.fetch_add(1, Relaxed);
                        inner.warn("fallback key", || {
                            format!(
                                "a message on {} has no eventKey property; deduplicating on {:?} instead \
                                 (see docs/inbox.md)",
                                msg.queue, msg.key
                            )
                        });
                    }
                    let mut m = msg;
                    let thread = queue_thread(&m.queue, senders.len());
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
        if last_lag.elapsed() >= Duration::from_secs(5) {
            last_lag = Instant::now();
            if let Some(lag) = inner.source.lag() {
                inner.counters.lag.store(lag.min(i64::MAX as u64) as i64, Relaxed);
            }
        }
    }
    // Dropping the senders ends the handler threads once they finish the message in hand.
}

/// Commits the offsets the handler threads reached since the last call.
fn flush_offsets(inner: &Inner, persist: bool) {
    let offsets: Vec<(QueueRef, u64)> = inner.done.lock().drain().collect();
    if !offsets.is_empty() || persist {
        inner.source.commit(&offsets, persist);
    }
}

fn handler_loop(inner: &Inner, rx: &Receiver<Message>) {
    loop {
        let msg = crossbeam_channel::select! {
            recv(rx) -> m => match m { Ok(m) => m, Err(_) => return },
            recv(inner.stop_rx) -> _ => return,
        };
        let done = handle_message(inner, &msg);
        if matches!(done, Done::Abandoned) {
            return;
        }
        inner.counters.done.fetch_add(1, Relaxed);
        inner.done.lock().insert(msg.queue.clone(), msg.offset + 1);
    }
}

fn handle_message(inner: &Inner, msg: &Message) -> Done {
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
fn run_in(
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

/// Handles the group's dead letters an operator asked to replay, one per transaction; and
/// deletes marks past their retention.
fn replay_loop(inner: &Inner) {
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

/// Takes one REPLAY row and handles it; false when there was none.
fn replay_one(inner: &Inner) -> Result<bool> {
    let table = &inner.config.dead_letter_table;
    let mut conn = inner.pool.get_conn()?;
    let mut tx = conn.start_transaction(TxOpts::default())?;
    let Some((id, msg, attempts)) = dead_letter::take_replay(&mut tx, table, &inner.config.group)? else {
        tx.commit()?;
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
        Err(Failure::Db(e)) => Err(e),
        Err(Failure::Handler { error, .. }) => {
            inner.counters.failed_attempts.fetch_add(1, Relaxed);
            log::error!(
                "consumer {}: replay of dead letter {id} (key {:?}, attempt {}) failed again: {error}",
                inner.config.group,
                msg.key,
                attempts + 1
            );
            dead_letter::failed_again(&inner.pool, table, id, &error)?;
            Ok(true)
        }
    }
}
