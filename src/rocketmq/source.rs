//! A [`Source`] on RocketMQ: `rocketmq-client-rust`'s lite pull
//! consumer in subscribe mode (the broker balances the topic's queues over the group's
//! instances), with automatic offset commits off: offsets move only when the [`Consumer`]
//! commits them, after the database commit.
//!
//! What the client does by default, and what this source changes (docs/rocketmq.md, "The
//! consumer source"):
//!
//! - **Pulls are held by the broker for at most `BROKER_SUSPEND`** (the client's default is
//!   20 s, with a 30 s reply timeout). A stop waits for every pull in flight, queue after queue,
//!   up to 5 s each before aborting it, so idle queues made a stop take 5 s per queue. And a pull
//!   in flight when its broker dies is only given up at its reply timeout: with the defaults,
//!   messages sent after a broker restart waited up to 30 s.
//! - **Stops are bounded**: the consumer leaves its group and stores its offsets within
//!   `STOP_STEP`; if the broker does not answer, the client runtime's own shutdown (which also
//!   unregisters the group) gets another bounded step.
//! - **Health and lag** ([`Source::health`], [`Source::lag`]): the lag is read from the broker
//!   within `PROBE_BUDGET` (`None` while no queue is assigned or an offset cannot be read); the
//!   health asks the name server (and looks at the last lag read) only when something looks wrong.
//! - **A client that holds a live broker off is replaced**: after 5 failed connections the
//!   client refuses to connect to that broker for 30 s (its endpoint circuit breaker, which has
//!   no setting). When the broker accepts connections again while the client's requests still
//!   fail without trying one, the source starts a new client (a new instance of the group, whose
//!   breaker is closed) and stops the old one, at most every `REBUILD_EVERY`.
//! - **The group is balanced again `BALANCE_AGAIN_AFTER` a change of this instance's queues**:
//!   the client drops a "members changed" notice that reaches it while it is balancing, and
//!   would then keep a share overlapping another instance's until its next periodic balance.
//!
//! [`Consumer`]: crate::consumer::Consumer

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use rocketmq_client_rust::{ClientRuntime, DefaultLitePullConsumer, MessageQueueListener};
use rocketmq_model::common::consumer::consume_from_where::ConsumeFromWhere;
use rocketmq_model::common::message::message_queue::MessageQueue;
use rocketmq_observability::TelemetryRuntimeGuard;
use rocketmq_runtime::RuntimeOwner;

use super::classify::describe;
use super::runtime::client_runtime;
use crate::config::ConsumerConfig;
use crate::consumer::{Message, Source};
use crate::error::{Error, Result};
use crate::wire::QueueRef;

pub use crate::config::StartFrom;

/// How long the broker may hold a pull that finds nothing new before answering "no new
/// message" (the client's default: 20 s). A new message ends the wait at once, so this costs
/// one request per assigned queue and period while idle, and bounds how long a stop waits for
/// the pulls in flight.
const BROKER_SUSPEND: Duration = Duration::from_millis(1000);

/// How long the client waits for the answer to a held pull (the client's default: 30 s). A pull
/// in flight when its broker dies is given up only after this, so it bounds how long a consumer
/// stays idle after a broker restart.
const PULL_REPLY_TIMEOUT: Duration = Duration::from_millis(3000);

/// Bound on each step of a stop: the consumer's own shutdown (the pulls in flight, the offsets
/// stored, the group left), then the client runtime's.
const STOP_STEP: Duration = Duration::from_secs(3);

/// Bound on the broker and name server requests of one [`Source::lag`] or [`Source::health`].
const PROBE_BUDGET: Duration = Duration::from_secs(2);

/// How long a verdict of [`Source::health`] that asked the name server is reused (and how long,
/// doubled, a successful lag read vouches for the source).
const VERDICT_TTL: Duration = Duration::from_secs(4);

/// How long after this instance's queues changed the group is balanced again (once). The client
/// drops a "members changed" notice from the broker that arrives while it is balancing (its
/// rebalance service wakes with `notify_waiters`), and the instance then keeps a stale share until
/// its next periodic balance, 20 s later, overlapping another instance's.
const BALANCE_AGAIN_AFTER: Duration = Duration::from_millis(200);

/// The least time between two replacements of a client that cannot reach a live broker.
const REBUILD_EVERY: Duration = Duration::from_secs(10);

/// What a [`RocketMqSource`] connects to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceConfig {
    /// Name server address(es), `host:port[;host:port]`.
    pub namesrv: String,
    pub topic: String,
    /// The consumer group (the same as the consumer's [`ConsumerConfig`]).
    pub group: String,
    pub start_from: StartFrom,
    /// Messages per pull request.
    pub pull_batch: u32,
}

impl SourceConfig {
    /// What a consumer of `config` (its group, start and pull batch) reads from `topic`.
    pub fn for_consumer(namesrv: &str, topic: &str, config: &ConsumerConfig) -> SourceConfig {
        SourceConfig {
            start_from: config.start_from,
            pull_batch: config.pull_batch,
            ..SourceConfig::new(namesrv, topic, &config.group)
        }
    }

    pub fn new(namesrv: &str, topic: &str, group: &str) -> SourceConfig {
        SourceConfig {
            namesrv: namesrv.into(),
            topic: topic.into(),
            group: group.into(),
            start_from: StartFrom::First,
            pull_batch: 32,
        }
    }
}

/// One started client: its runtime, the client runtime on it, and the lite pull consumer.
struct Live {
    owner: RuntimeOwner,
    client_runtime: Arc<ClientRuntime>,
    consumer: DefaultLitePullConsumer,
    telemetry: TelemetryRuntimeGuard,
    /// This client's instance name (its identity in the group).
    instance: String,
    /// When this instance's queues last changed and the group was not balanced again since.
    changed: Arc<Mutex<Option<Instant>>>,
}

/// Notes when the client's balance changes this instance's queues.
struct AssignmentWatch {
    changed: Arc<Mutex<Option<Instant>>>,
    last: Mutex<HashSet<MessageQueue>>,
}

impl MessageQueueListener for AssignmentWatch {
    fn message_queue_changed(&self, _topic: &str, _all: &HashSet<MessageQueue>, assigned: &HashSet<MessageQueue>) {
        let mut last = self.last.lock();
        if *last != *assigned {
            *last = assigned.clone();
            *self.changed.lock() = Some(Instant::now());
        }
    }
}

/// What the last lag read and health check found.
#[derive(Default)]
struct Probe {
    /// When the last lag read ended, and what it found.
    lag: Option<(Instant, LagRead)>,
    /// Lag reads in a row that failed on the broker side.
    lag_failures: u32,
    /// The last verdict of [`Source::health`] that asked the broker side, and when.
    verdict: Option<(Instant, Option<String>)>,
    /// Broker addresses as the messages' store hosts showed them, by broker name.
    brokers: HashMap<String, String>,
    /// When the client was last replaced.
    rebuilt: Option<Instant>,
    /// Why the last replacement could not start a new client (none runs until one does).
    restart_error: Option<String>,
}

#[derive(Clone, Debug)]
enum LagRead {
    /// No queue assigned.
    Unassigned,
    /// The offsets of every assigned queue were read.
    Read,
    /// An offset of a queue of `broker` could not be read; the read took `took`. `connected`:
    /// whether the client tried a connection for it (an operating-system error is among the
    /// causes), rather than refusing to (its endpoint circuit breaker open).
    Failed {
        broker: String,
        error: String,
        took: Duration,
        connected: bool,
    },
}

/// The lite pull consumer and the runtime it runs on.
pub struct RocketMqSource {
    config: SourceConfig,
    /// The client: `None` once shut down (or while a replacement could not be started);
    /// replaced under the write lock.
    live: RwLock<Option<Live>>,
    /// Set by [`Source::shutdown`]: no client is started again.
    stopped: AtomicBool,
    /// Message queues by our queue reference (commits need the client's own value).
    queues: Mutex<HashMap<QueueRef, MessageQueue>>,
    /// The next offset to consume per queue, as committed by the consumer.
    committed: Mutex<HashMap<MessageQueue, i64>>,
    probe: Mutex<Probe>,
}

fn source_error(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Publisher(format!("RocketMQ consumer {what}: {e}"))
}

/// Starts a client for `config` under a fresh instance name.
fn start_live(config: &SourceConfig) -> Result<Live> {
    let (owner, telemetry, client_runtime) =
        client_runtime("outbox-consumer", "outbox-consumer-client").map_err(|(what, e)| source_error(what, e))?;
    // A client id of its own per instance: two instances of a group on one host must count as
    // two in the broker's queue balancing.
    let instance = format!("outbox-consumer-{}-{:08x}", std::process::id(), rand::random::<u32>());
    let consumer = DefaultLitePullConsumer::builder(client_runtime.clone())
        .consumer_group(config.group.as_str())
        .name_server_addr(config.namesrv.as_str())
        .instance_name(instance.as_str())
        .consume_from_where(match config.start_from {
            StartFrom::First => ConsumeFromWhere::ConsumeFromFirstOffset,
            StartFrom::Last => ConsumeFromWhere::ConsumeFromLastOffset,
        })
        .auto_commit(false)
        .pull_batch_size(config.pull_batch.clamp(1, 1024) as i32)
        .broker_suspend_max_time_millis(BROKER_SUSPEND.as_millis() as u64)
        .consumer_timeout_millis_when_suspend(PULL_REPLY_TIMEOUT.as_millis() as u64)
        .build()
        .map_err(|e| source_error("configuration", describe(&e)))?;
    let changed = Arc::new(Mutex::new(None));
    let watch = AssignmentWatch {
        changed: changed.clone(),
        last: Mutex::new(HashSet::new()),
    };
    owner.block_on(async {
        consumer
            .subscribe_with_listener(config.topic.as_str(), "*", watch)
            .await
            .map_err(|e| source_error(&format!("subscribe to {}", config.topic), describe(&e)))?;
        consumer.start().await.map_err(|e| source_error("start", describe(&e)))
    })?;
    Ok(Live {
        owner,
        client_runtime,
        consumer,
        telemetry,
        instance,
        changed,
    })
}

/// Leaves the group (storing the offsets the client holds) and stops the client's runtimes,
/// each step bounded. Returns how long it took.
fn stop_live(live: Live, group: &str) -> Duration {
    let started = Instant::now();
    let Live {
        owner,
        client_runtime,
        consumer,
        telemetry,
        instance,
        ..
    } = live;
    if tokio::runtime::Handle::try_current().is_ok() {
        // Inside some Tokio runtime (block_on would panic): let Tokio finish in the background.
        log::warn!("RocketMQ consumer {group} dropped inside an async context; stopping it in the background");
        drop(consumer);
        drop(client_runtime);
        owner.shutdown_background();
        drop(telemetry);
        return started.elapsed();
    }
    owner.block_on(async {
        // The client's shutdown waits for the pulls in flight (at most about BROKER_SUSPEND),
        // stores the offsets it holds and unregisters the group from the brokers.
        if tokio::time::timeout(STOP_STEP, consumer.shutdown()).await.is_err() {
            log::warn!(
                "RocketMQ consumer {group} ({instance}) did not stop within {} s (broker slow or down?); \
                 its client runtime's shutdown stores the offsets and leaves the group instead",
                STOP_STEP.as_secs()
            );
        }
        // Also unregisters the group if the step above did not get that far.
        match tokio::time::timeout(STOP_STEP, client_runtime.shutdown()).await {
            Ok(report) if !report.is_healthy() => {
                log::debug!(
                    "RocketMQ consumer {group}: client runtime shutdown report: {}",
                    report.to_json()
                )
            }
            Ok(_) => {}
            Err(_) => log::warn!(
                "RocketMQ consumer {group} ({instance}): the client runtime did not stop within {} s; going on",
                STOP_STEP.as_secs()
            ),
        }
    });
    drop(consumer);
    drop(client_runtime);
    if let Err(e) = owner.shutdown_runtime_blocking_with_timeout(Duration::from_secs(1)) {
        log::warn!("RocketMQ consumer {group}: runtime shutdown: {e}");
    }
    drop(telemetry);
    started.elapsed()
}

/// Why none of the name server addresses `namesrv` (`host:port[;host:port]`) accepts a
/// connection within `budget`, or `None` if one does.
fn namesrv_unreachable(namesrv: &str, budget: Duration) -> Option<String> {
    let addrs: Vec<&str> = namesrv.split(';').map(str::trim).filter(|a| !a.is_empty()).collect();
    if addrs.is_empty() {
        return Some("no name server address is configured".into());
    }
    let each = budget / addrs.len() as u32;
    let mut why = Vec::new();
    for a in &addrs {
        match connect(a, each) {
            Ok(()) => return None,
            Err(e) => why.push(format!("{a}: {e}")),
        }
    }
    Some(why.join("; "))
}

/// Opens (and closes) a TCP connection to `addr` within `timeout`.
fn connect(addr: &str, timeout: Duration) -> std::io::Result<()> {
    let resolved: Vec<SocketAddr> = match addr.parse::<SocketAddr>() {
        Ok(a) => vec![a],
        Err(_) => addr.to_socket_addrs()?.collect(),
    };
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "the address resolves to nothing");
    for a in resolved {
        match TcpStream::connect_timeout(&a, timeout.max(Duration::from_millis(50))) {
            Ok(_) => return Ok(()),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Whether an operating-system error (a refused or failed connection, a reset) is among the
/// causes of `e`: the client tried the network. The client's refusals to try (its endpoint
/// circuit breaker open) carry none.
fn has_os_cause(e: &rocketmq_client_rust::ClientError) -> bool {
    let shared = e.clone().into_shared_error();
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(shared.as_ref());
    while let Some(err) = current {
        if err.downcast_ref::<std::io::Error>().is_some() {
            return true;
        }
        current = err.source();
    }
    false
}

impl RocketMqSource {
    /// Subscribes `config.topic` with `config.group` and starts pulling. A name server that does
    /// not answer is logged (WARN), not refused: it may come up later, and the consumer then
    /// takes messages without a restart ([`Source::health`] says why it cannot meanwhile).
    pub fn start(config: &SourceConfig) -> Result<RocketMqSource> {
        crate::inbox::check_group(&config.group)?;
        if config.topic.is_empty() {
            return Err(crate::error::ConfigError::invalid("consumer.topic", "", "must not be empty").into());
        }
        let live = start_live(config)?;
        log::info!(
            "RocketMQ consumer {} subscribed to {} at {} ({})",
            config.group,
            config.topic,
            config.namesrv,
            live.instance
        );
        let source = RocketMqSource {
            config: config.clone(),
            live: RwLock::new(Some(live)),
            stopped: AtomicBool::new(false),
            queues: Mutex::new(HashMap::new()),
            committed: Mutex::new(HashMap::new()),
            probe: Mutex::new(Probe::default()),
        };
        if let Err(problem) = source.route() {
            log::warn!(
                "RocketMQ consumer {}: {problem}; starting anyway, messages are taken once that is resolved",
                config.group
            );
        }
        Ok(source)
    }

    /// The brokers that serve the topic, as the name server answers within `PROBE_BUDGET`, or
    /// why the consumer cannot find them (the name server probed with a plain connection).
    fn route(&self) -> std::result::Result<Vec<String>, String> {
        let found = {
            let guard = self.live.read();
            let Some(live) = guard.as_ref() else {
                return Err("the consumer is shut down".into());
            };
            live.owner.block_on(async {
                tokio::time::timeout(PROBE_BUDGET, live.consumer.fetch_message_queues(&self.config.topic)).await
            })
        };
        match found {
            Ok(Ok(queues)) if !queues.is_empty() => {
                let mut brokers: Vec<String> = queues.iter().map(|q| q.broker_name().to_string()).collect();
                brokers.sort();
                brokers.dedup();
                Ok(brokers)
            }
            failed => {
                if let Some(why) = namesrv_unreachable(&self.config.namesrv, PROBE_BUDGET / 2) {
                    return Err(format!(
                        "the RocketMQ name server {} cannot be reached ({why}), so the brokers of topic {} cannot be \
                         found",
                        self.config.namesrv, self.config.topic
                    ));
                }
                Err(match failed {
                    Err(_) => format!(
                        "the RocketMQ name server {} accepts connections but did not answer a route lookup for topic \
                         {} within {} ms",
                        self.config.namesrv,
                        self.config.topic,
                        PROBE_BUDGET.as_millis()
                    ),
                    _ => format!(
                        "topic {} has no route at the name server {}: no broker serves it (a topic exists once a \
                         broker creates it, on its first message or by an operator; or its brokers are down)",
                        self.config.topic, self.config.namesrv
                    ),
                })
            }
        }
    }

    /// The address a broker stored our messages from, if a message of it was seen.
    fn broker_address(&self, broker: &str) -> Option<String> {
        self.probe.lock().brokers.get(broker).cloned()
    }

    /// The queues assigned to this consumer now (empty while none is, or once shut down).
    pub fn assignment(&self) -> Vec<QueueRef> {
        let guard = self.live.read();
        let Some(live) = guard.as_ref() else { return Vec::new() };
        let assigned = live
            .owner
            .block_on(async { tokio::time::timeout(PROBE_BUDGET, live.consumer.assignment()).await });
        let mut queues: Vec<QueueRef> = match assigned {
            Ok(Ok(qs)) => qs
                .iter()
                .map(|mq| QueueRef {
                    topic: mq.topic().to_string(),
                    broker: mq.broker_name().to_string(),
                    queue_id: mq.queue_id().max(0) as u32,
                })
                .collect(),
            _ => Vec::new(),
        };
        queues.sort();
        queues
    }

    /// Reads the lag of the assigned queues within `PROBE_BUDGET`: what the read found and
    /// the messages waiting (`None` once shut down).
    fn read_lag(&self) -> Option<(LagRead, u64)> {
        let guard = self.live.read();
        let live = guard.as_ref()?;
        let ours: HashMap<MessageQueue, i64> = self.committed.lock().clone();
        let start_from = self.config.start_from;
        let started = Instant::now();
        let read = live.owner.block_on(async {
            tokio::time::timeout(PROBE_BUDGET, async {
                let assigned = live
                    .consumer
                    .assignment()
                    .await
                    .map_err(|e| (String::new(), describe(&e), has_os_cause(&e)))?;
                let reads = assigned.iter().map(|mq| {
                    let ours = ours.get(mq).copied();
                    async move {
                        let fail = |e: rocketmq_client_rust::ClientError| {
                            (mq.broker_name().to_string(), describe(&e), has_os_cause(&e))
                        };
                        let max = live.consumer.max_offset(mq).await.map_err(fail)?;
                        let next = match ours {
                            Some(o) => o,
                            None => match live.consumer.committed(mq).await.map_err(fail)? {
                                o if o >= 0 => o,
                                // Nothing committed yet: the group starts where it was told to.
                                _ => match start_from {
                                    StartFrom::First => live.consumer.min_offset(mq).await.map_err(fail)?,
                                    StartFrom::Last => max,
                                },
                            },
                        };
                        Ok::<u64, (String, String, bool)>((max - next).max(0) as u64)
                    }
                });
                let mut total = 0u64;
                for lag in futures_util::future::join_all(reads).await {
                    total = total.saturating_add(lag?);
                }
                Ok::<_, (String, String, bool)>((assigned.len(), total))
            })
            .await
        });
        let took = started.elapsed();
        Some(match read {
            Ok(Ok((0, _))) => (LagRead::Unassigned, 0),
            Ok(Ok((_, total))) => (LagRead::Read, total),
            Ok(Err((broker, error, connected))) => (
                LagRead::Failed {
                    broker,
                    error,
                    took,
                    connected,
                },
                0,
            ),
            Err(_) => (
                LagRead::Failed {
                    broker: String::new(),
                    error: format!("no answer within {} ms", PROBE_BUDGET.as_millis()),
                    took,
                    connected: true,
                },
                0,
            ),
        })
    }

    /// Replaces the client with a new one (a new instance of the group), keeping the offsets
    /// committed so far: the old one leaves the group first, storing what it holds.
    fn rebuild(&self, why: &str) {
        let mut guard = self.live.write();
        if self.stopped.load(Ordering::Acquire) {
            return;
        }
        if let Some(old) = guard.take() {
            log::warn!(
                "RocketMQ consumer {}: replacing its client ({}): {why}",
                self.config.group,
                old.instance
            );
            let took = stop_live(old, &self.config.group);
            log::info!(
                "RocketMQ consumer {}: old client stopped in {} ms",
                self.config.group,
                took.as_millis()
            );
        }
        let started = start_live(&self.config);
        let mut p = self.probe.lock();
        p.rebuilt = Some(Instant::now());
        p.lag_failures = 0;
        p.verdict = None;
        match started {
            Ok(live) => {
                log::info!(
                    "RocketMQ consumer {}: new client {} started",
                    self.config.group,
                    live.instance
                );
                p.restart_error = None;
                *guard = Some(live);
            }
            Err(e) => {
                log::error!(
                    "RocketMQ consumer {}: could not start a new client (tried again in {} s): {e}",
                    self.config.group,
                    REBUILD_EVERY.as_secs()
                );
                p.restart_error = Some(e.to_string());
            }
        }
    }

    /// Balances the group again (a heartbeat and a balance, as a new subscription does) once
    /// `BALANCE_AGAIN_AFTER` has passed since this instance's queues changed: a notice of a
    /// member joining that the client dropped while it was balancing is caught up a second later
    /// instead of at the next periodic balance.
    fn balance_again_if_due(&self, live: &Live) {
        let due = {
            let mut changed = live.changed.lock();
            match *changed {
                Some(at) if at.elapsed() >= BALANCE_AGAIN_AFTER => changed.take().is_some(),
                _ => false,
            }
        };
        if !due {
            return;
        }
        let topic = self.config.topic.as_str();
        match live
            .owner
            .block_on(async { tokio::time::timeout(PROBE_BUDGET, live.consumer.subscribe(topic)).await })
        {
            Ok(Ok(())) => log::debug!("RocketMQ consumer {}: balanced the group again", self.config.group),
            Ok(Err(e)) => log::debug!(
                "RocketMQ consumer {}: balancing the group again failed: {}",
                self.config.group,
                describe(&e)
            ),
            Err(_) => log::debug!(
                "RocketMQ consumer {}: balancing the group again took longer than {} ms",
                self.config.group,
                PROBE_BUDGET.as_millis()
            ),
        }
    }

    /// Whether `broker`'s address (as seen on its messages) accepts a TCP connection now.
    fn broker_accepts(&self, broker: &str) -> Option<bool> {
        let addr = self.broker_address(broker)?;
        Some(connect(&addr, Duration::from_millis(500)).is_ok())
    }
}

impl Source for RocketMqSource {
    fn poll(&self, timeout: Duration) -> Result<Vec<Message>> {
        let ms = timeout.as_millis().clamp(1, u64::MAX as u128) as u64;
        let batch = {
            let guard = self.live.read();
            let Some(live) = guard.as_ref() else {
                return Err(source_error(
                    "poll",
                    if self.stopped.load(Ordering::Acquire) {
                        "the consumer is shut down"
                    } else {
                        "no client runs: its replacement could not be started"
                    },
                ));
            };
            let batch = live.owner.block_on(live.consumer.poll_with_timeout(ms));
            self.balance_again_if_due(live);
            batch
        };
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        {
            let mut p = self.probe.lock();
            for m in &batch {
                if !p.brokers.contains_key(m.broker_name()) {
                    p.brokers
                        .insert(m.broker_name().to_string(), m.store_host().to_string());
                }
            }
        }
        let mut queues = self.queues.lock();
        Ok(batch
            .into_iter()
            .map(|m| {
                let queue = QueueRef {
                    topic: m.topic().to_string(),
                    broker: m.broker_name().to_string(),
                    queue_id: m.queue_id().max(0) as u32,
                };
                queues.entry(queue.clone()).or_insert_with(|| {
                    MessageQueue::from_parts(m.topic().clone(), m.broker_name().to_string(), m.queue_id())
                });
                let properties: BTreeMap<String, String> = m
                    .properties()
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect();
                let msg_id = Some(m.msg_id().to_string()).filter(|s| !s.is_empty());
                Message::new(
                    queue,
                    m.queue_offset().max(0) as u64,
                    msg_id,
                    m.get_tags().map(|t| t.to_string()),
                    properties,
                    m.body().map(|b| b.to_vec()).unwrap_or_default(),
                )
            })
            .collect())
    }

    fn commit(&self, next_offsets: &[(QueueRef, u64)], persist: bool) {
        // Only offsets given here are ever handed to the client: its own "commit the assigned
        // queues" calls would commit how far it has *pulled*, past messages not yet handled.
        let map: HashMap<MessageQueue, i64> = {
            let queues = self.queues.lock();
            let mut committed = self.committed.lock();
            for (q, o) in next_offsets {
                if let Some(mq) = queues.get(q) {
                    committed.insert(mq.clone(), (*o).min(i64::MAX as u64) as i64);
                }
            }
            if persist {
                committed.clone()
            } else {
                next_offsets
                    .iter()
                    .filter_map(|(q, _)| queues.get(q).and_then(|mq| committed.get_key_value(mq)))
                    .map(|(mq, o)| (mq.clone(), *o))
                    .collect()
            }
        };
        let guard = self.live.read();
        let Some(live) = guard.as_ref() else { return };
        // (Also here: a poller busy handing messages out commits without polling.)
        self.balance_again_if_due(live);
        if map.is_empty() {
            return;
        }
        // A queue balanced away meanwhile is skipped by the client. Storing with a broker that
        // does not answer is given up after the bound (the offsets stay in memory, stored on the
        // next persist or at stop).
        let stored = live
            .owner
            .block_on(async { tokio::time::timeout(PROBE_BUDGET, live.consumer.commit_with_map(map, persist)).await });
        if stored.is_err() {
            log::debug!(
                "RocketMQ consumer {}: storing offsets took longer than {} ms",
                self.config.group,
                PROBE_BUDGET.as_millis()
            );
        }
    }

    fn lag(&self) -> Option<u64> {
        let (read, lag) = self.read_lag()?;
        let mut p = self.probe.lock();
        match &read {
            LagRead::Failed { .. } => p.lag_failures += 1,
            _ => p.lag_failures = 0,
        }
        p.lag = Some((Instant::now(), read.clone()));
        match read {
            LagRead::Read => Some(lag),
            LagRead::Unassigned | LagRead::Failed { .. } => None,
        }
    }

    fn health(&self) -> Option<String> {
        if self.live.read().is_none() {
            if self.stopped.load(Ordering::Acquire) {
                return Some("the consumer is shut down".into());
            }
            // A replacement that could not start a client: try again when due.
            let due = self.probe.lock().rebuilt.is_none_or(|t| t.elapsed() >= REBUILD_EVERY);
            if due {
                self.rebuild("the last replacement could not start a client");
            }
            if let Some(e) = self.probe.lock().restart_error.clone() {
                return Some(format!(
                    "no RocketMQ client runs: a new one could not be started (tried again every {} s): {e}",
                    REBUILD_EVERY.as_secs()
                ));
            }
        }
        let (last, failures, verdict, rebuilt) = {
            let p = self.probe.lock();
            (p.lag.clone(), p.lag_failures, p.verdict.clone(), p.rebuilt)
        };
        // The offsets of every assigned queue were read lately: all is well, no I/O.
        if let Some((at, LagRead::Read)) = &last {
            if at.elapsed() < VERDICT_TTL * 2 {
                return None;
            }
        }
        // A verdict given since the last lag read, lately: the same.
        if let Some((at, v)) = &verdict {
            if at.elapsed() < VERDICT_TTL && last.as_ref().is_none_or(|(read_at, _)| read_at <= at) {
                return v.clone();
            }
        }
        // No queue assigned, a lag read that failed, or none lately: ask the name server.
        let holder = |broker: &str| {
            let address = self
                .broker_address(broker)
                .map(|a| format!(" ({a})"))
                .unwrap_or_default();
            format!(
                "broker {broker}{address}, which holds this consumer's queues of topic {}",
                self.config.topic
            )
        };
        let verdict = match (self.route(), last.map(|(_, r)| r)) {
            (Err(problem), Some(LagRead::Failed { broker, error, .. })) if !broker.is_empty() => {
                Some(format!("{}, cannot be read ({error}), and {problem}", holder(&broker)))
            }
            (Err(problem), _) => Some(problem),
            (
                Ok(brokers),
                Some(LagRead::Failed {
                    broker,
                    error,
                    took,
                    connected,
                }),
            ) => {
                let broker = if broker.is_empty() { brokers.join(", ") } else { broker };
                let what = holder(&broker);
                let routed = brokers.contains(&broker);
                let accepts = self.broker_accepts(&broker);
                // Routed, accepting connections, and the client's requests fail at once without
                // trying a connection: its endpoint circuit breaker holds the broker off (for
                // 30 s after 5 failed connections, and again after each failed probe). A new
                // client is not held off.
                if routed
                    && accepts == Some(true)
                    && !connected
                    && took < Duration::from_secs(1)
                    && rebuilt.is_none_or(|t| t.elapsed() >= REBUILD_EVERY)
                {
                    self.rebuild(&format!(
                        "{what}, accepts connections again but the client, which failed {failures} times in a row to \
                         read from it, no longer tries to connect ({error})"
                    ));
                    Some(format!(
                        "{what}, was unreachable; it accepts connections again, and the client, which had stopped \
                         trying it ({error}), was replaced by a new one"
                    ))
                } else {
                    let state = match (routed, accepts) {
                        (false, _) => "is not in the name server's route (down or restarting)",
                        (true, Some(false)) => "refuses connections (down or restarting)",
                        (true, _) => "does not answer",
                    };
                    Some(format!("{what}, {state}; reading its offsets failed: {error}"))
                }
            }
            // Routed and no queue assigned: a group with more consumers than queues, or a
            // balance not yet done. Routed and read: fine.
            (Ok(_), _) => None,
        };
        self.probe.lock().verdict = Some((Instant::now(), verdict.clone()));
        verdict
    }

    fn shutdown(&self) {
        self.stopped.store(true, Ordering::Release);
        let live = self.live.write().take();
        if let Some(live) = live {
            let took = stop_live(live, &self.config.group);
            log::info!(
                "RocketMQ consumer {} stopped in {} ms",
                self.config.group,
                took.as_millis()
            );
        }
    }
}

impl Drop for RocketMqSource {
    fn drop(&mut self) {
        self.shutdown();
    }
}
