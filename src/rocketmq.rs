//! The RocketMQ publisher (cargo feature `rocketmq`), on `rocketmq-client-rust` 1.0.
//!
//! The client is async; the relay core is blocking. [`RocketMqPublisher`] therefore owns a small
//! Tokio runtime (a [`RuntimeOwner`]), the client runtime built on it and one started
//! [`DefaultMQProducer`]. Worker threads call [`Publisher::publish`] concurrently; each call blocks
//! on the shared runtime (the producer's send methods take `&self`).
//!
//! What a message looks like: body = the row's payload, key = the event id, tag = the row's tag
//! or else its event type (`rocketmq.tag.source`), user properties `eventId`, `eventKey` (the
//! dedup key, unique across outbox tables and databases), `eventType`, `bizNo` plus the row's
//! headers.
//!
//! Several events of one call go out as one broker batch (`send_batch_with_timeout`), split so
//! that no batch is larger than [`BATCH_MAX_BYTES`]. A batch refused for a reason of its content
//! is retried message by message, so one bad message never fails the others. Every message of a
//! batch carries the same message id on the consumer side: consumers deduplicate on the
//! `eventKey` property (the inbox does), never on the message id.
//!
//! Client errors are classified by their canonical descriptor (see [`classify`]): broker-wide
//! failures are [`FailureKind::Unavailable`] (not counted against the event; the relay's circuit
//! breaker counts them), unknown outcomes are [`FailureKind::Timeout`], and problems of the
//! message are [`FailureKind::Rejected`].

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cheetah_string::CheetahString;
use parking_lot::RwLock;
use rocketmq_client_rust::{
    AclClientRPCHook, ClientConfig, ClientError, ClientRuntime, ClientRuntimeConfig, DefaultMQProducer,
    MQBrokerException, MQClientException, SendResult, SendStatus, SessionCredentials,
};
use rocketmq_error::{CanonicalCondition, ErrorDescriptor};
use rocketmq_model::common::message::message_queue::MessageQueue;
use rocketmq_model::common::message::message_single::Message;
use rocketmq_observability::TelemetryRuntimeGuard;
use rocketmq_runtime::{RuntimeConfig, RuntimeOwner};

use crate::config::{Config, TagSource};
use crate::error::{Error, Result};
use crate::queues::{queue_index, queue_key, QueueBook, QueueRef};
use crate::publisher::{FailureKind, OutboundEvent, Publisher, SendError, SendOutcome};

/// Largest encoded size of one broker batch. The broker refuses a request whose body exceeds its
/// `maxMessageSize` (4 MiB by default); a batch is one request, so batches stay well below it.
pub const BATCH_MAX_BYTES: usize = 1024 * 1024;

/// A send is not started with less budget than this left; the event is returned unsent.
const MIN_SEND_BUDGET: Duration = Duration::from_millis(5);

/// Extra time given to the client beyond its own send timeout before the call is abandoned
/// (the client enforces the timeout itself; this only guards against a hung future).
const HARD_TIMEOUT_SLACK: Duration = Duration::from_millis(500);

/// Bound on each shutdown step (producer, client runtime, Tokio runtime).
const SHUTDOWN_STEP: Duration = Duration::from_secs(5);

/// Most bytes of encoded properties one message may carry (a 16-bit length on the wire).
const MAX_PROPERTIES_BYTES: usize = i16::MAX as usize;

/// The message property carrying the event's dedup key ([`OutboundEvent::key`]), unique across
/// outbox tables and databases; consumers' inboxes key on it.
pub const EVENT_KEY_PROPERTY: &str = "eventKey";

/// Longest message id stored on a row (`broker_msg_id` is `VARCHAR(128)`).
const MAX_MSG_ID_CHARS: usize = 128;

/// The client's own error codes (`ClientErrorCode` in the client, which does not export them).
mod client_code {
    pub const CONNECT_BROKER_EXCEPTION: i32 = 10001;
    pub const ACCESS_BROKER_TIMEOUT: i32 = 10002;
    pub const BROKER_NOT_EXIST_EXCEPTION: i32 = 10003;
    pub const NO_NAME_SERVER_EXCEPTION: i32 = 10004;
    pub const NOT_FOUND_TOPIC_EXCEPTION: i32 = 10005;
    pub const REQUEST_TIMEOUT_EXCEPTION: i32 = 10006;
}

/// Broker response codes that mean "the broker as a whole cannot take messages now".
mod broker_code {
    /// From the name server: no live broker serves the topic. From a broker: it has no such topic.
    pub const TOPIC_NOT_EXIST: i32 = 17;
    pub const SYSTEM_BUSY: i32 = 2;
    pub const SERVICE_NOT_AVAILABLE: i32 = 14;
    pub const FLUSH_DISK_TIMEOUT: i32 = 10;
    pub const SLAVE_NOT_AVAILABLE: i32 = 11;
    pub const FLUSH_SLAVE_TIMEOUT: i32 = 12;
}

/// How the message of a send that found no route for its topic begins. Whether that is the
/// broker's absence (no attempt used) or a topic that does not exist (an attempt) is decided
/// after the send, by [`RocketMqPublisher::judge_missing_routes`].
const NO_ROUTE: &str = "no route for the topic";

/// The topic every broker that creates topics on first use registers (`TBW102`): a route for it
/// or for the default topic shows a live broker.
const AUTO_CREATE_TOPIC: &str = "TBW102";

/// How long the route of an ordered topic is reused before the name server is asked again, in
/// the background (a broker that dies meanwhile is found by its refused connections; one that
/// returns waits about this long).
const ROUTE_TTL: Duration = Duration::from_secs(3);

/// Queues per broker of an ordered topic the publisher creates itself (only where the brokers
/// create topics on first use, as a first send would): the client's own default for a topic a
/// first send creates. An ordered call costs one broker request per queue it reaches, so more
/// queues buy consumer parallelism with more requests per event at low load (docs/ordering.md).
const ORDERED_TOPIC_QUEUES: i32 = 4;

/// Ordered topics' routes: the queues as last fetched, and when.
type Routes = HashMap<String, (Instant, Vec<QueueRef>)>;

struct Live {
    owner: RuntimeOwner,
    client_runtime: Arc<ClientRuntime>,
    producer: DefaultMQProducer,
    telemetry: TelemetryRuntimeGuard,
}

/// Publishes events to Apache RocketMQ through one producer. See the module documentation.
pub struct RocketMqPublisher {
    live: RwLock<Option<Live>>,
    tag_source: TagSource,
    /// `ordering = per-biz-no`: the stable queue set of each topic; a key's events go, in order,
    /// to the queue its biz_no hashes to among them (see [`crate::ordering`]).
    book: Option<QueueBook>,
    /// Ordered topics: the queues of the route as last fetched, and when.
    /// A route past [`ROUTE_TTL`] is still used while one background lookup refreshes it, so no
    /// send waits for the name server except the first of a topic (and after a failure).
    routes: Arc<parking_lot::Mutex<Routes>>,
    /// Topics whose route a background lookup is refreshing now.
    refreshing: Arc<parking_lot::Mutex<HashSet<String>>>,
    /// Ordered topics this publisher already tried to create.
    created: parking_lot::Mutex<HashSet<String>>,
    namesrv: String,
    producer_group: String,
    acl: bool,
    batch_max_bytes: usize,
    /// The configured default topic (`topic`).
    default_topic: String,
    /// False after a publish call in which the broker was unreachable for every event; true again
    /// after any call that reached it.
    reachable: AtomicBool,
    /// Send requests made to brokers (a batch counts once), for [`RocketMqPublisher::requests`].
    requests: AtomicU64,
}

impl fmt::Debug for RocketMqPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the access or secret key: only whether ACL is on.
        f.debug_struct("RocketMqPublisher")
            .field("namesrv", &self.namesrv)
            .field("producer_group", &self.producer_group)
            .field("acl", &if self.acl { "on" } else { "off" })
            .field("tag_source", &self.tag_source)
            .field("running", &self.live.read().is_some())
            .finish()
    }
}

/// A Tokio runtime of its own (2 threads) with the client's runtime on it as `component`: the
/// client never creates one. `Err` says which step failed.
pub(crate) fn client_runtime(
    name: &'static str,
    component: &'static str,
) -> std::result::Result<(RuntimeOwner, TelemetryRuntimeGuard, Arc<ClientRuntime>), (&'static str, String)> {
    let owner = RuntimeOwner::plan(RuntimeConfig::for_parallelism(name, 2))
        .map_err(|e| ("runtime configuration", e.to_string()))?
        .build()
        .map_err(|e| ("runtime", e.to_string()))?;
    let telemetry = TelemetryRuntimeGuard::noop();
    let client_runtime = ClientRuntime::try_new(
        owner.root_context().component(component),
        ClientRuntimeConfig::default(),
        telemetry.handle(),
    )
    .map_err(|e| ("client runtime", describe(&e)))?;
    Ok((owner, telemetry, client_runtime))
}

fn publisher_error(what: &str, e: impl fmt::Display) -> Error {
    Error::Publisher(format!("RocketMQ {what}: {e}"))
}

impl RocketMqPublisher {
    /// Builds the runtime, the client runtime and the producer for `config.rocketmq`, and starts
    /// the producer. Nothing is sent yet; the first send looks up the topic's route.
    pub fn start(config: &Config) -> Result<RocketMqPublisher> {
        let rc = &config.rocketmq;
        let (owner, telemetry, client_runtime) = client_runtime("outbox-rocketmq", "outbox-rocketmq-client")
            .map_err(|(what, e)| publisher_error(what, e))?;

        let mut client_config = ClientConfig::new();
        // A distinct instance name per publisher: several relays in one process (tests, demos)
        // must not share a client id on the broker.
        client_config.set_instance_name(CheetahString::from_string(format!(
            "outbox-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        )));
        // Unordered sends, whose queue the client picks: after a send to a broker fails (the
        // connection refused, an error response), pick the other brokers' queues for a while
        // (10 s) instead of failing every other send until the client's next route update. With
        // one broker the client falls back to its queues. Ordered sends pick their own queue.
        client_config.set_send_latency_enable(true);
        let timeout_ms = config.send_timeout.as_millis().clamp(1, u32::MAX as u128) as u32;
        // The client refuses bodies above its own limit before sending; let it accept whatever
        // enqueue accepted (payload.max.bytes), so the broker's own limit is the judge.
        let max_message_size = config.payload_max_bytes.clamp(4 * 1024 * 1024, i32::MAX as usize) as u32;
        let mut builder = DefaultMQProducer::builder(client_runtime.clone())
            .client_config(client_config)
            .producer_group(rc.producer_group.as_str())
            .name_server_addr(rc.namesrv.as_str())
            .send_msg_timeout(timeout_ms)
            .retry_times_when_send_failed(rc.retries)
            .max_message_size(max_message_size);
        if let (Some(ak), Some(sk)) = (&rc.access_key, &rc.secret_key) {
            let credentials = SessionCredentials::with_keys(ak.as_str(), sk.as_str());
            builder = builder.rpc_hook(Arc::new(AclClientRPCHook::new(credentials)));
        }
        let book = if config.ordering == crate::config::Ordering::PerBizNo {
            let book = QueueBook::new(crate::db::connect(config)?);
            book.check().map_err(|e| {
                publisher_error(
                    "ordered publishing",
                    format!("the queue book table outbox_topic_queue is unreadable (apply migration V6): {e}"),
                )
            })?;
            Some(book)
        } else {
            None
        };
        let mut producer = builder.build();
        if let Err(e) = owner.block_on(producer.start()) {
            let message = describe(&e);
            shutdown_live(Live {
                owner,
                client_runtime,
                producer,
                telemetry,
            });
            return Err(publisher_error("producer start", message));
        }
        log::info!(
            "RocketMQ producer started: group {}, name server {}, send timeout {} ms, {} client retries{}",
            rc.producer_group,
            rc.namesrv,
            timeout_ms,
            rc.retries,
            if rc.access_key.is_some() { ", ACL on" } else { "" }
        );
        Ok(RocketMqPublisher {
            live: RwLock::new(Some(Live {
                owner,
                client_runtime,
                producer,
                telemetry,
            })),
            tag_source: rc.tag_source,
            book,
            routes: Arc::new(parking_lot::Mutex::new(HashMap::new())),
            refreshing: Arc::new(parking_lot::Mutex::new(HashSet::new())),
            created: parking_lot::Mutex::new(HashSet::new()),
            namesrv: rc.namesrv.clone(),
            producer_group: rc.producer_group.clone(),
            acl: rc.access_key.is_some(),
            batch_max_bytes: BATCH_MAX_BYTES,
            default_topic: config.topic.clone(),
            reachable: AtomicBool::new(true),
            requests: AtomicU64::new(0),
        })
    }

    /// Sets the largest encoded size of one broker batch (default [`BATCH_MAX_BYTES`]). Keep it
    /// below the broker's `maxMessageSize`; a batch the broker refuses is resent message by
    /// message, so a larger value only costs time (tests use that to exercise the fallback).
    pub fn with_batch_max_bytes(mut self, bytes: usize) -> Self {
        self.batch_max_bytes = bytes.max(1);
        self
    }

    /// Send requests made to brokers so far; a batch counts once.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Stops the producer and its runtimes (idempotent; also done on drop).
    pub fn close(&self) {
        let live = self.live.write().take();
        if let Some(live) = live {
            shutdown_live(live);
            log::info!("RocketMQ producer {} shut down", self.producer_group);
        }
    }

    /// Sends one planned group: alone, or as one batch with a one-by-one fallback when the batch
    /// is refused for a reason of its content.
    fn send_group(
        &self,
        live: &Live,
        events: &[&OutboundEvent],
        mut messages: Vec<Message>,
        deadline: Instant,
    ) -> Vec<SendOutcome> {
        if messages.len() == 1 {
            let m = messages.pop().expect("one message");
            return vec![self.send_single(live, m, deadline)];
        }
        let budget = deadline.saturating_duration_since(Instant::now());
        self.requests.fetch_add(1, Ordering::Relaxed);
        let result = block_on_bounded(
            live,
            budget,
            live.producer.send_batch_with_timeout(messages, millis(budget)),
        );
        match result {
            Ok(Ok(r)) => batch_outcomes(&r, events.len()),
            Ok(Err(e)) => {
                let err = to_send_error(&e);
                if err.kind == FailureKind::Rejected {
                    // Something in the batch was refused: find out what by sending one by one.
                    log::debug!(
                        "batch of {} events refused ({}); sending them one by one",
                        events.len(),
                        err.message
                    );
                    events
                        .iter()
                        .map(|e| match build_message(e, self.tag_source) {
                            Ok(m) => self.send_single(live, m, deadline),
                            Err(err) => SendOutcome::Failed(err),
                        })
                        .collect()
                } else {
                    vec![SendOutcome::Failed(err); events.len()]
                }
            }
            Err(hung) => vec![SendOutcome::Failed(hung); events.len()],
        }
    }

    fn send_single(&self, live: &Live, message: Message, deadline: Instant) -> SendOutcome {
        let budget = deadline.saturating_duration_since(Instant::now());
        if budget < MIN_SEND_BUDGET {
            return SendOutcome::Failed(budget_spent());
        }
        self.requests.fetch_add(1, Ordering::Relaxed);
        single_result(block_on_bounded(
            live,
            budget,
            live.producer.send_with_timeout(message, millis(budget)),
        ))
    }
}

/// Ordered publishing (`ordering = per-biz-no`).
impl RocketMqPublisher {
    /// Sends the events of `events` (whole runs of keys, each in id order) to their keys' queues:
    /// per queue, in order, as batches. A key's events after one that failed are not sent
    /// ([`FailureKind::HeldBack`]); keys whose queue's broker is down while another broker of the
    /// topic is up are [`FailureKind::Parked`].
    #[allow(clippy::too_many_arguments)]
    fn publish_ordered(
        &self,
        live: &Live,
        book: &QueueBook,
        events: &[OutboundEvent],
        built: &mut [Option<Message>],
        sizes: &[(usize, usize)],
        outcomes: &mut [Option<SendOutcome>],
        deadline: Instant,
    ) {
        let size_of: HashMap<usize, usize> = sizes.iter().copied().collect();
        let mut topics: Vec<&str> = Vec::new();
        for e in events {
            if !topics.contains(&e.topic.as_str()) {
                topics.push(e.topic.as_str());
            }
        }
        for topic in topics {
            let members: Vec<usize> = (0..events.len()).filter(|&i| events[i].topic == topic).collect();
            let looked_up = self.live_queues(live, topic, deadline).and_then(|live_qs| {
                let stable = book
                    .queues(topic, &live_qs)
                    .map_err(|e| SendError::unavailable(format!("the queue book could not be read: {e}")))?;
                if stable.is_empty() {
                    return Err(SendError::unavailable(format!("{NO_ROUTE}: {topic} has no queue")));
                }
                Ok((live_qs, stable))
            });
            let (live_qs, stable) = match looked_up {
                Ok(v) => v,
                Err(e) => {
                    for &i in &members {
                        outcomes[i].get_or_insert_with(|| SendOutcome::Failed(e.clone()));
                    }
                    continue;
                }
            };
            let live_brokers: HashSet<&str> = live_qs.iter().map(|q| q.broker.as_str()).collect();
            // Per queue of the stable set, the events in the call's order.
            let mut by_queue: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
            for &i in &members {
                by_queue
                    .entry(queue_index(&events[i].biz_no, stable.len()))
                    .or_default()
                    .push(i);
            }
            // Each queue's events on their own: what one queue holds goes out in order, the
            // queues go out at once (a small call of many keys would otherwise pay one round
            // trip per queue in a row).
            let mut work = Vec::new();
            for (qi, idx) in by_queue {
                let q = &stable[qi];
                if !live_brokers.contains(q.broker.as_str()) {
                    let e = SendError::parked(format!(
                        "queue {q} of the key: broker {} is not in the route of {topic}",
                        q.broker
                    ));
                    for &i in &idx {
                        outcomes[i].get_or_insert_with(|| SendOutcome::Failed(e.clone()));
                    }
                    continue;
                }
                let others_up = live_brokers.iter().any(|b| *b != q.broker.as_str());
                // The queue's own copy of the call's state: its messages and outcomes so far.
                let mut own_built: Vec<Option<Message>> = (0..events.len()).map(|_| None).collect();
                let mut own_outcomes: Vec<Option<SendOutcome>> = vec![None; events.len()];
                for &i in &idx {
                    own_built[i] = built[i].take();
                    own_outcomes[i] = outcomes[i].take();
                }
                work.push((q, others_up, idx, own_built, own_outcomes));
            }
            // The queues' sends as futures of one `block_on`: they run at once on the client's
            // runtime, with no thread per queue.
            let size_of = &size_of;
            let sends = work.into_iter().map(|(q, others_up, idx, mut b, mut o)| async move {
                self.send_queue(
                    live, topic, q, others_up, events, &mut b, size_of, &idx, &mut o, deadline,
                )
                .await;
                (idx, o)
            });
            let done: Vec<(Vec<usize>, Vec<Option<SendOutcome>>)> =
                live.owner.block_on(futures_util::future::join_all(sends));
            for (idx, mut o) in done {
                for i in idx {
                    outcomes[i] = o[i].take();
                }
            }
        }
    }

    /// Sends the events `idx` (in order) to queue `q`, batch after batch, stopping each key at its
    /// first failure.
    #[allow(clippy::too_many_arguments)]
    async fn send_queue(
        &self,
        live: &Live,
        topic: &str,
        q: &QueueRef,
        others_up: bool,
        events: &[OutboundEvent],
        built: &mut [Option<Message>],
        size_of: &HashMap<usize, usize>,
        idx: &[usize],
        outcomes: &mut [Option<SendOutcome>],
        deadline: Instant,
    ) {
        let mq = MessageQueue::from_parts(topic, q.broker.as_str(), q.queue_id as i32);
        let mut failed: HashSet<String> = HashSet::new();
        let held = || SendOutcome::Failed(SendError::held_back("an earlier event of the key failed"));
        // Consecutive batches, in order, each at most batch_max_bytes.
        let mut batch: Vec<usize> = Vec::new();
        let mut bytes = 0;
        let mut pending = idx.iter().copied().peekable();
        loop {
            let next = pending.peek().copied();
            let full = next.is_some_and(|i| {
                !batch.is_empty() && bytes + size_of.get(&i).copied().unwrap_or(0) > self.batch_max_bytes
            });
            if next.is_none() || full {
                if batch.is_empty() {
                    break;
                }
                // Keys that failed in an earlier batch of this call go no further.
                let (go, stop): (Vec<usize>, Vec<usize>) = batch
                    .drain(..)
                    .partition(|&i| !failed.contains(&queue_key(&events[i].biz_no)));
                for i in stop {
                    outcomes[i] = Some(held());
                }
                let results = self
                    .send_to_queue(live, &mq, others_up, events, built, &go, deadline)
                    .await;
                for (&i, r) in go.iter().zip(results) {
                    if matches!(r, SendOutcome::Failed(_)) {
                        failed.insert(queue_key(&events[i].biz_no));
                    }
                    outcomes[i] = Some(r);
                }
                bytes = 0;
                continue;
            }
            let i = pending.next().expect("peeked");
            if outcomes[i].is_some() || built[i].is_none() {
                // Could not be built (already failed): the key's later events wait.
                failed.insert(queue_key(&events[i].biz_no));
                continue;
            }
            if failed.contains(&queue_key(&events[i].biz_no)) {
                outcomes[i] = Some(held());
                continue;
            }
            bytes += size_of.get(&i).copied().unwrap_or(0);
            batch.push(i);
        }
    }

    /// One batch (or one message) to `mq`. A batch refused for its content is sent one by one,
    /// each key stopping at its first failure. A broker that cannot be reached parks the events
    /// when another broker of the topic is up.
    #[allow(clippy::too_many_arguments)]
    async fn send_to_queue(
        &self,
        live: &Live,
        mq: &MessageQueue,
        others_up: bool,
        events: &[OutboundEvent],
        built: &mut [Option<Message>],
        go: &[usize],
        deadline: Instant,
    ) -> Vec<SendOutcome> {
        if go.is_empty() {
            return Vec::new();
        }
        let messages: Vec<Message> = go.iter().filter_map(|&i| built[i].take()).collect();
        let result = self.request_to_queue(live, mq, messages, deadline).await;
        let parked = |e: SendError| {
            // This broker is gone (or going) while others serve the topic: park its keys.
            self.routes.lock().remove(mq.topic_str());
            SendError::parked(format!("broker {} unreachable: {}", mq.broker_name(), e.message))
        };
        match result {
            Ok(v) => v,
            Err(e) if e.kind == FailureKind::Rejected && go.len() > 1 => {
                log::debug!(
                    "ordered batch of {} refused ({}); sending one by one",
                    go.len(),
                    e.message
                );
                let mut failed: HashSet<String> = HashSet::new();
                let mut out = Vec::with_capacity(go.len());
                for &i in go {
                    let key = queue_key(&events[i].biz_no);
                    if failed.contains(&key) {
                        out.push(SendOutcome::Failed(SendError::held_back(
                            "an earlier event of the key failed",
                        )));
                        continue;
                    }
                    let r = match build_message(&events[i], self.tag_source) {
                        Ok(m) => match self.request_to_queue(live, mq, vec![m], deadline).await {
                            Ok(mut v) => v.pop().unwrap_or_else(|| SendOutcome::Failed(budget_spent())),
                            Err(e) if e.kind == FailureKind::Unavailable && others_up => SendOutcome::Failed(parked(e)),
                            Err(e) => SendOutcome::Failed(e),
                        },
                        Err(err) => SendOutcome::Failed(err),
                    };
                    if matches!(r, SendOutcome::Failed(_)) {
                        failed.insert(key);
                    }
                    out.push(r);
                }
                out
            }
            Err(e) if e.kind == FailureKind::Unavailable && others_up => {
                vec![SendOutcome::Failed(parked(e)); go.len()]
            }
            Err(e) => vec![SendOutcome::Failed(e); go.len()],
        }
    }

    /// One request to `mq`: the message alone, or the messages as one batch; one outcome each.
    async fn request_to_queue(
        &self,
        live: &Live,
        mq: &MessageQueue,
        mut messages: Vec<Message>,
        deadline: Instant,
    ) -> std::result::Result<Vec<SendOutcome>, SendError> {
        let budget = deadline.saturating_duration_since(Instant::now());
        if budget < MIN_SEND_BUDGET {
            return Ok(vec![SendOutcome::Failed(budget_spent()); messages.len()]);
        }
        self.requests.fetch_add(1, Ordering::Relaxed);
        let n = messages.len();
        if n == 1 {
            let m = messages.pop().expect("one message");
            let sent = live.producer.send_to_queue_with_timeout(m, mq.clone(), millis(budget));
            match bounded(budget, sent).await? {
                Ok(Some(r)) => Ok(vec![single_outcome(&r)]),
                Ok(None) => Err(SendError::timeout("the client returned no send result")),
                Err(e) => Err(to_send_error(&e)),
            }
        } else {
            let sent = live
                .producer
                .send_batch_to_queue_with_timeout(messages, mq.clone(), millis(budget));
            match bounded(budget, sent).await? {
                Ok(r) => Ok(batch_outcomes(&r, n)),
                Err(e) => Err(to_send_error(&e)),
            }
        }
    }

    /// The queues of `topic`'s route now (cached for [`ROUTE_TTL`]). A topic without a route is
    /// created on the brokers that create topics on first use, as a first send would.
    fn live_queues(
        &self,
        live: &Live,
        topic: &str,
        deadline: Instant,
    ) -> std::result::Result<Vec<QueueRef>, SendError> {
        if let Some((at, qs)) = self.routes.lock().get(topic) {
            if at.elapsed() >= ROUTE_TTL {
                self.refresh_route_in_background(live, topic);
            }
            return Ok(qs.clone());
        }
        let fetch = |topic: &str| -> std::result::Result<Vec<QueueRef>, SendError> {
            let budget = deadline.saturating_duration_since(Instant::now());
            if budget < MIN_SEND_BUDGET {
                return Err(budget_spent());
            }
            match route_queues(live, topic, budget) {
                Some(Ok(qs)) => Ok(queue_refs(&qs)),
                Some(Err(e)) => Err(SendError::unavailable(format!("{NO_ROUTE}: {}", describe(&e)))),
                // Nothing was sent: the broker side is not answering.
                None => Err(SendError::unavailable("the route lookup timed out")),
            }
        };
        let mut found = fetch(topic);
        let missing = found.as_ref().map_or(true, |v| v.is_empty());
        if missing
            && self.created.lock().insert(topic.to_string())
            && fetch(AUTO_CREATE_TOPIC).is_ok_and(|v| !v.is_empty())
        {
            let mut producer = live.producer.clone();
            let created = live.owner.block_on(async {
                producer
                    .create_topic(AUTO_CREATE_TOPIC, topic, ORDERED_TOPIC_QUEUES, HashMap::new())
                    .await
            });
            match created {
                Ok(()) => log::info!("created ordered topic {topic} ({ORDERED_TOPIC_QUEUES} queues per broker)"),
                Err(e) => log::warn!("could not create ordered topic {topic}: {}", describe(&e)),
            }
            found = fetch(topic);
        }
        let qs = found?;
        self.routes
            .lock()
            .insert(topic.to_string(), (Instant::now(), qs.clone()));
        Ok(qs)
    }
}

impl RocketMqPublisher {
    /// Looks `topic`'s route up again on the publisher's runtime, without waiting for it: the
    /// caller goes on with the cached route. One lookup per topic at a time; a lookup that fails
    /// or finds no queue leaves the cached route as it was (a dead broker is noticed by its
    /// refused connections, which drop the route).
    fn refresh_route_in_background(&self, live: &Live, topic: &str) {
        if !self.refreshing.lock().insert(topic.to_string()) {
            return;
        }
        let (routes, refreshing) = (self.routes.clone(), self.refreshing.clone());
        let mut producer = live.producer.clone();
        let topic = topic.to_string();
        live.owner.block_on(async move {
            tokio::spawn(async move {
                let found = tokio::time::timeout(ROUTE_TTL, producer.fetch_publish_message_queues(&topic)).await;
                if let Ok(Ok(qs)) = found {
                    let qs = queue_refs(&qs);
                    if !qs.is_empty() {
                        routes.lock().insert(topic.clone(), (Instant::now(), qs));
                    }
                }
                refreshing.lock().remove(&topic);
            });
        });
    }

    /// Sends that found no route to their topic are the broker's absence (no attempt used) when
    /// no topic has a route, and a topic that does not exist (an attempt, so the row ends FAIL)
    /// when the name server has a route for the default topic or the auto-create topic while
    /// theirs has none. A missing route for the default topic itself always counts as the
    /// broker's absence: the relay cannot tell, and waiting loses nothing.
    fn judge_missing_routes(
        &self,
        live: &Live,
        events: &[OutboundEvent],
        outcomes: &mut [SendOutcome],
        deadline: Instant,
    ) {
        let missing: Vec<usize> = outcomes
            .iter()
            .enumerate()
            .filter(|(i, o)| {
                matches!(o, SendOutcome::Failed(e) if e.kind == FailureKind::Unavailable && e.message.starts_with(NO_ROUTE))
                    && events[*i].topic != self.default_topic
            })
            .map(|(i, _)| i)
            .collect();
        if missing.is_empty() || !self.some_topic_has_a_route(live, deadline) {
            return;
        }
        for i in missing {
            if let SendOutcome::Failed(e) = &mut outcomes[i] {
                *e = SendError::rejected(format!(
                    "topic {} does not exist on the broker (the name server has routes for other topics): {}",
                    events[i].topic, e.message
                ));
            }
        }
    }

    /// Whether the name server has a route for the default topic or the auto-create topic (a
    /// live broker is registered), asked within `timeout`. What a send that finds no route for
    /// its own topic is judged by.
    pub fn has_routes(&self, timeout: Duration) -> bool {
        let guard = self.live.read();
        guard
            .as_ref()
            .is_some_and(|live| self.some_topic_has_a_route(live, Instant::now() + timeout))
    }

    /// Creates `topic` with `queues` queues on every broker that holds the auto-create topic
    /// (`TBW102`), as an operator would before relaying an ordered topic.
    pub fn create_topic(&self, topic: &str, queues: i32) -> Result<()> {
        let guard = self.live.read();
        let live = guard
            .as_ref()
            .ok_or_else(|| publisher_error("create topic", "the publisher is shut down"))?;
        let mut producer = live.producer.clone();
        live.owner
            .block_on(async {
                producer
                    .create_topic(AUTO_CREATE_TOPIC, topic, queues, HashMap::new())
                    .await
            })
            .map_err(|e| publisher_error("create topic", describe(&e)))
    }

    /// The brokers that `topic`'s route lists now, as the name server answers within `timeout`.
    pub fn topic_brokers(&self, topic: &str, timeout: Duration) -> Vec<String> {
        let guard = self.live.read();
        let Some(live) = guard.as_ref() else { return Vec::new() };
        let mut brokers: Vec<String> = match route_queues(live, topic, timeout) {
            Some(Ok(qs)) => qs.iter().map(|q| q.broker_name().to_string()).collect(),
            _ => Vec::new(),
        };
        brokers.sort();
        brokers.dedup();
        brokers
    }

    /// [`RocketMqPublisher::has_routes`], within what is left of a send's budget (no answer: no).
    fn some_topic_has_a_route(&self, live: &Live, deadline: Instant) -> bool {
        for topic in [self.default_topic.as_str(), AUTO_CREATE_TOPIC] {
            let budget = deadline.saturating_duration_since(Instant::now());
            if budget < MIN_SEND_BUDGET {
                return false;
            }
            if matches!(route_queues(live, topic, budget), Some(Ok(queues)) if !queues.is_empty()) {
                return true;
            }
        }
        false
    }
}

/// The queues `topic`'s route lists, as the name server answers within `budget` (`None`: no
/// answer in time).
/// A route's queues as the ordering code names them, sorted.
fn queue_refs(qs: &[MessageQueue]) -> Vec<QueueRef> {
    let mut refs: Vec<QueueRef> = qs
        .iter()
        .map(|q| QueueRef {
            broker: q.broker_name().to_string(),
            queue_id: q.queue_id().max(0) as u32,
        })
        .collect();
    refs.sort();
    refs
}

fn route_queues(
    live: &Live,
    topic: &str,
    budget: Duration,
) -> Option<rocketmq_client_rust::ClientResult<Vec<MessageQueue>>> {
    let mut producer = live.producer.clone();
    live.owner
        .block_on(async { tokio::time::timeout(budget, producer.fetch_publish_message_queues(topic)).await })
        .ok()
}

/// A send that failed before it reached a broker that could store it, for a reason of that
/// broker (not a missing route, which every broker would give alike).
fn refused_by_a_broker(outcome: &SendOutcome) -> bool {
    matches!(outcome, SendOutcome::Failed(e) if e.kind == FailureKind::Unavailable && !e.message.starts_with(NO_ROUTE))
}

fn single_result(
    result: std::result::Result<rocketmq_client_rust::ClientResult<Option<SendResult>>, SendError>,
) -> SendOutcome {
    match result {
        Ok(Ok(Some(r))) => single_outcome(&r),
        Ok(Ok(None)) => SendOutcome::Failed(SendError::timeout("the client returned no send result")),
        Ok(Err(e)) => SendOutcome::Failed(to_send_error(&e)),
        Err(hung) => SendOutcome::Failed(hung),
    }
}

impl Publisher for RocketMqPublisher {
    fn publish(&self, events: &[OutboundEvent], timeout: Duration) -> Vec<SendOutcome> {
        let deadline = Instant::now() + timeout;
        let guard = self.live.read();
        let Some(live) = guard.as_ref() else {
            let e = SendError::unavailable("the RocketMQ publisher is shut down");
            return vec![SendOutcome::Failed(e); events.len()];
        };
        let mut outcomes: Vec<Option<SendOutcome>> = vec![None; events.len()];
        // Messages that cannot even be built fail alone; the rest are planned into batches.
        let mut built: Vec<Option<Message>> = Vec::with_capacity(events.len());
        let mut sizes = Vec::with_capacity(events.len());
        for (i, e) in events.iter().enumerate() {
            match message_size(e, self.tag_source).and_then(|size| Ok((size, build_message(e, self.tag_source)?))) {
                Ok((size, m)) => {
                    sizes.push((i, size));
                    built.push(Some(m));
                }
                Err(err) => {
                    outcomes[i] = Some(SendOutcome::Failed(err));
                    built.push(None);
                }
            }
        }
        let mut broker_down: Option<SendError> = None;
        let mut resent = false;
        if let Some(book) = &self.book {
            self.publish_ordered(live, book, events, &mut built, &sizes, &mut outcomes, deadline);
        } else {
            for group in plan_batches(events, &sizes, self.batch_max_bytes) {
                let members: Vec<&OutboundEvent> = group.iter().map(|&i| &events[i]).collect();
                let messages: Vec<Message> = group.iter().filter_map(|&i| built[i].take()).collect();
                let results = if let Some(e) = &broker_down {
                    // The broker just proved unreachable: do not spend the budget on the rest.
                    vec![SendOutcome::Failed(e.clone()); members.len()]
                } else if deadline.saturating_duration_since(Instant::now()) < MIN_SEND_BUDGET {
                    vec![SendOutcome::Failed(budget_spent()); members.len()]
                } else {
                    let mut r = self.send_group(live, &members, messages, deadline);
                    // Refused before it reached a broker that could store it (connection refused,
                    // broker not serving): free to repeat at once, once per call, and the client
                    // now steers it to another broker of the topic (its fault tolerance marked
                    // this one). With every broker down the repeat fails the same way.
                    if !resent && r.iter().all(refused_by_a_broker) {
                        resent = true;
                        let again: Vec<Message> = members
                            .iter()
                            .filter_map(|e| build_message(e, self.tag_source).ok())
                            .collect();
                        if again.len() == members.len()
                            && deadline.saturating_duration_since(Instant::now()) >= MIN_SEND_BUDGET
                        {
                            r = self.send_group(live, &members, again, deadline);
                        }
                    }
                    r
                };
                for (&i, r) in group.iter().zip(results) {
                    if let SendOutcome::Failed(e) = &r {
                        if e.kind == FailureKind::Unavailable && broker_down.is_none() {
                            broker_down = Some(e.clone());
                        }
                    }
                    outcomes[i] = Some(r);
                }
            }
        }
        let mut outcomes: Vec<SendOutcome> = outcomes
            .into_iter()
            .map(|o| o.unwrap_or_else(|| SendOutcome::Failed(budget_spent())))
            .collect();
        self.judge_missing_routes(live, events, &mut outcomes, deadline);
        let any_sent = outcomes.iter().any(|o| matches!(o, SendOutcome::Sent { .. }));
        let all_unavailable = !outcomes.is_empty()
            && outcomes
                .iter()
                .all(|o| matches!(o, SendOutcome::Failed(e) if e.kind == FailureKind::Unavailable));
        if any_sent {
            self.reachable.store(true, Ordering::Relaxed);
        } else if all_unavailable {
            self.reachable.store(false, Ordering::Relaxed);
        }
        outcomes
    }

    /// Ordered: the index of the key's queue in the topic's stable set as last read (no I/O; the
    /// set only grows, so a stale size is a wrong hint for a while, never a wrong queue).
    fn queue_hint(&self, event: &OutboundEvent) -> Option<u64> {
        let n = self.book.as_ref()?.cached_len(&event.topic)?;
        Some(queue_index(&event.biz_no, n) as u64)
    }

    fn is_healthy(&self) -> bool {
        self.live.read().is_some() && self.reachable.load(Ordering::Relaxed)
    }

    fn shutdown(&self) {
        self.close();
    }
}

impl Drop for RocketMqPublisher {
    fn drop(&mut self) {
        self.close();
    }
}

/// Shuts down in the order the client needs: producer, client runtime (both inside the runtime),
/// then the Tokio runtime, then telemetry. Each step is bounded.
fn shutdown_live(live: Live) {
    let Live {
        owner,
        client_runtime,
        mut producer,
        telemetry,
    } = live;
    if tokio::runtime::Handle::try_current().is_ok() {
        // Called from inside some Tokio runtime (block_on would panic): let Tokio finish in the
        // background instead.
        log::warn!("RocketMQ publisher dropped inside an async context; shutting its runtime down in the background");
        drop(producer);
        drop(client_runtime);
        owner.shutdown_background();
        drop(telemetry);
        return;
    }
    owner.block_on(async {
        if tokio::time::timeout(SHUTDOWN_STEP, producer.shutdown()).await.is_err() {
            log::warn!(
                "RocketMQ producer shutdown took longer than {} s; going on",
                SHUTDOWN_STEP.as_secs()
            );
        }
        match tokio::time::timeout(SHUTDOWN_STEP, client_runtime.shutdown()).await {
            Ok(report) if !report.is_healthy() => {
                log::warn!("RocketMQ client runtime shutdown report: {}", report.to_json())
            }
            Ok(_) => {}
            Err(_) => log::warn!(
                "RocketMQ client runtime shutdown took longer than {} s; going on",
                SHUTDOWN_STEP.as_secs()
            ),
        }
    });
    drop(producer);
    drop(client_runtime);
    if let Err(e) = owner.shutdown_runtime_blocking_with_timeout(SHUTDOWN_STEP) {
        log::warn!("RocketMQ runtime shutdown: {e}");
    }
    drop(telemetry);
}

/// Runs `fut` on the publisher's runtime, giving up (as a timeout) if it outlives its budget by
/// more than [`HARD_TIMEOUT_SLACK`]: the client enforces the budget itself, this is a backstop.
fn block_on_bounded<F: std::future::Future>(
    live: &Live,
    budget: Duration,
    fut: F,
) -> std::result::Result<F::Output, SendError> {
    live.owner.block_on(bounded(budget, fut))
}

/// `fut`, given up (as a timeout) if it outlives `budget` by more than [`HARD_TIMEOUT_SLACK`].
async fn bounded<F: std::future::Future>(budget: Duration, fut: F) -> std::result::Result<F::Output, SendError> {
    tokio::time::timeout(budget + HARD_TIMEOUT_SLACK, fut)
        .await
        .map_err(|_| {
            SendError::timeout(format!(
                "the client did not return within {} ms",
                (budget + HARD_TIMEOUT_SLACK).as_millis()
            ))
        })
}

fn millis(d: Duration) -> u64 {
    (d.as_millis() as u64).max(1)
}

fn budget_spent() -> SendError {
    SendError::unavailable("the send budget ran out before this message was sent")
}

/// Splits the buildable events (`sizes`: index and encoded size) into groups sent as one batch
/// each: same topic, at most `max_bytes` together. A message bigger than that goes alone.
fn plan_batches(events: &[OutboundEvent], sizes: &[(usize, usize)], max_bytes: usize) -> Vec<Vec<usize>> {
    let mut groups: Vec<(String, usize, Vec<usize>)> = Vec::new();
    let mut singles = Vec::new();
    for &(i, size) in sizes {
        if size > max_bytes {
            singles.push(vec![i]);
            continue;
        }
        let topic = &events[i].topic;
        match groups
            .iter_mut()
            .rev()
            .find(|(t, bytes, _)| t == topic && bytes + size <= max_bytes)
        {
            Some((_, bytes, members)) => {
                *bytes += size;
                members.push(i);
            }
            None => groups.push((topic.clone(), size, vec![i])),
        }
    }
    groups.into_iter().map(|(_, _, m)| m).chain(singles).collect()
}

/// The tag of `event`: its own, else its event type (or none), per `tag_source`.
fn tag_of(event: &OutboundEvent, tag_source: TagSource) -> Option<&str> {
    match (&event.tag, tag_source) {
        (Some(t), _) if !t.is_empty() => Some(t.as_str()),
        (_, TagSource::EventType) => Some(event.event_type.as_str()),
        (_, TagSource::None) => None,
    }
}

/// The user properties of `event`: `eventId`, `eventKey`, `eventType`, `bizNo`, then its headers.
pub fn properties_of(event: &OutboundEvent) -> BTreeMap<String, String> {
    let mut p = event.headers.clone();
    p.insert("eventId".into(), event.id.to_string());
    p.insert(EVENT_KEY_PROPERTY.into(), event.key.clone());
    p.insert("eventType".into(), event.event_type.clone());
    p.insert("bizNo".into(), event.biz_no.clone());
    p
}

/// RocketMQ encodes properties as `name\u{1}value\u{2}`: those characters cannot be sent.
fn check_property_text(what: &str, s: &str) -> std::result::Result<(), SendError> {
    if s.contains(['\u{1}', '\u{2}']) {
        return Err(SendError::rejected(format!(
            "{what} {s:?} contains a control character RocketMQ uses as a property separator"
        )));
    }
    Ok(())
}

/// The approximate encoded size of the event's message, after checking that it can be built.
fn message_size(event: &OutboundEvent, tag_source: TagSource) -> std::result::Result<usize, SendError> {
    // KEYS, UNIQ_KEY and WAIT, which the client adds.
    let mut props = 64 + event.id.to_string().len();
    for (k, v) in properties_of(event) {
        check_property_text("property name", &k)?;
        check_property_text("property value", &v)?;
        props += k.len() + v.len() + 2;
    }
    if let Some(tag) = tag_of(event, tag_source) {
        check_property_text("tag", tag)?;
        props += tag.len() + 6;
    }
    // The wire format stores the properties' length in 16 bits.
    if props > MAX_PROPERTIES_BYTES {
        return Err(SendError::rejected(format!(
            "the message properties take about {props} bytes, more than RocketMQ's {MAX_PROPERTIES_BYTES}"
        )));
    }
    Ok(24 + event.payload.len() + props)
}

/// Builds the message for `event`.
pub fn build_message(event: &OutboundEvent, tag_source: TagSource) -> std::result::Result<Message, SendError> {
    message_size(event, tag_source)?;
    let mut b = Message::builder()
        .topic(event.topic.as_str())
        .key(event.id.to_string())
        .body(event.payload.clone());
    if let Some(tag) = tag_of(event, tag_source) {
        b = b.tags(tag);
    }
    for (k, v) in properties_of(event) {
        b = b
            .raw_property(k.as_str(), v.as_str())
            .map_err(|e| SendError::rejected(format!("property {k:?} cannot be sent: {e}")))?;
    }
    b.build()
        .map_err(|e| SendError::rejected(format!("message cannot be built: {e}")))
}

fn msg_id_of(r: &SendResult) -> Option<String> {
    r.msg_id
        .as_ref()
        .map(|m| m.to_string())
        .or_else(|| r.offset_msg_id.clone())
        .filter(|m| !m.is_empty())
}

fn truncated(mut s: String) -> String {
    if s.len() > MAX_MSG_ID_CHARS {
        let mut end = MAX_MSG_ID_CHARS;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

fn status_error(status: SendStatus) -> SendError {
    // The master stored the message but could not confirm durability or replication: the outcome
    // is as good as unknown, so it is retried (and may be delivered twice).
    SendError::timeout(format!("broker stored the message without confirmation: {status:?}"))
}

fn single_outcome(r: &SendResult) -> SendOutcome {
    if r.send_status != SendStatus::SendOk {
        return SendOutcome::Failed(status_error(r.send_status));
    }
    SendOutcome::Sent {
        msg_id: msg_id_of(r).map(truncated),
    }
}

/// One outcome per message of a batch. The client reports the message ids of a batch joined by
/// commas, in order; when that does not match, every event gets the batch's id.
fn batch_outcomes(r: &SendResult, n: usize) -> Vec<SendOutcome> {
    if r.send_status != SendStatus::SendOk {
        return vec![SendOutcome::Failed(status_error(r.send_status)); n];
    }
    let id = msg_id_of(r);
    let parts: Vec<&str> = id.as_deref().map(|s| s.split(',').collect()).unwrap_or_default();
    if parts.len() == n {
        parts
            .into_iter()
            .map(|p| SendOutcome::Sent {
                msg_id: Some(truncated(p.to_string())),
            })
            .collect()
    } else {
        let shared = id.map(truncated);
        vec![SendOutcome::Sent { msg_id: shared }; n]
    }
}

fn to_send_error(e: &ClientError) -> SendError {
    if is_route_missing(e) {
        return SendError::unavailable(format!("{NO_ROUTE}: {}", describe(e)));
    }
    SendError::new(classify(e), describe(e))
}

/// Whether the send failed because no route to its topic was found: the name server knows no
/// live broker serving it. Either every broker is gone (an outage) or the topic does not exist.
fn is_route_missing(e: &ClientError) -> bool {
    use rocketmq_error as re;
    // (A broker that answers a send with TOPIC_NOT_EXIST is up: that topic is refused.)
    is(e.descriptor(), &[&re::ROUTE_TOPIC_NOT_FOUND])
        || e.source_ref::<MQClientException>().is_some_and(|c| {
            matches!(
                c.response_code(),
                broker_code::TOPIC_NOT_EXIST | client_code::NOT_FOUND_TOPIC_EXCEPTION
            )
        })
}

/// A one-line description of a client error: its canonical code and message, plus what the
/// client or the broker said (never credentials: the client's errors do not carry them).
pub fn describe(e: &ClientError) -> String {
    let mut s = e.to_string();
    if let Some(c) = e.source_ref::<MQClientException>() {
        if let Some(m) = c.error_message() {
            // The client appends a FAQ link; keep the message itself.
            let m = m.split(" For more information").next().unwrap_or(m).trim();
            s.push_str(&format!(" (client code {}: {m})", c.response_code()));
        } else {
            s.push_str(&format!(" (client code {})", c.response_code()));
        }
    }
    if let Some(code) = e.broker_response_code() {
        let name = match code {
            1 => " SYSTEM_ERROR",
            2 => " SYSTEM_BUSY",
            13 => " MESSAGE_ILLEGAL",
            14 => " SERVICE_NOT_AVAILABLE",
            16 => " NO_PERMISSION",
            17 => " TOPIC_NOT_EXIST",
            _ => "",
        };
        s.push_str(&format!(" (broker response code {code}{name})"));
        if let Some(m) = e.source_ref::<MQBrokerException>().and_then(|b| b.error_message()) {
            s.push_str(&format!(": {m}"));
        }
    }
    s
}

/// Whether a failed request provably never left this process: the connection was refused or
/// could not be made, or the transport failed in a phase before anything was written (connect,
/// endpoint validation, before the write). Anything else may have reached the broker.
fn never_left(e: &ClientError) -> bool {
    let shared = e.clone().into_shared_error();
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(shared.as_ref());
    while let Some(err) = current {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::AddrNotAvailable
            ) {
                return true;
            }
        }
        if let Some(canonical) = err.downcast_ref::<rocketmq_error::Error>() {
            if let Ok(view) = canonical.diagnostic_view() {
                let before_write = view.fields().any(|f| {
                    f.name() == "phase"
                        && matches!(
                            f.value(),
                            rocketmq_error::ViewValueRef::Text("connect" | "endpoint_validation" | "before_write")
                        )
                });
                if before_write {
                    return true;
                }
            }
        }
        current = err.source();
    }
    false
}

fn is(d: &ErrorDescriptor, candidates: &[&'static ErrorDescriptor]) -> bool {
    candidates.iter().any(|c| c.code() == d.code())
}

/// Classifies a client error by its canonical descriptor (and, for the descriptors that wrap a
/// code, by the client's or the broker's response code).
///
/// - [`FailureKind::Unavailable`]: the request provably never reached a broker that could store
///   it: no route for the topic, the connection refused or not made (the transport failed while
///   connecting, before anything was written), the producer not running, the broker busy or not
///   serving (it answered, refusing).
/// - [`FailureKind::Timeout`]: the outcome is unknown: no answer within the budget, or a
///   connection lost once the request may have been written (a stalled broker: the kernel
///   accepts and buffers, the broker stores the request when it resumes). Counted as an attempt
///   and as a possible duplicate.
/// - [`FailureKind::Rejected`]: the message itself was refused (too large, invalid, bad topic,
///   no permission), or an error nobody classified (counted, so a poison message ends FAIL).
pub fn classify(e: &ClientError) -> FailureKind {
    use rocketmq_error as re;
    if is_route_missing(e) {
        return FailureKind::Unavailable;
    }
    let d = e.descriptor();
    // A connection that failed: free only if nothing can have been written.
    if is(
        d,
        &[
            &re::TRANSPORT_CONNECTION_FAILED,
            &re::TRANSPORT_SESSION_FAILED,
            &re::TRANSPORT_DISPATCH_FAILED,
        ],
    ) {
        return if never_left(e) {
            FailureKind::Unavailable
        } else {
            FailureKind::Timeout
        };
    }
    if is(
        d,
        &[
            &re::TRANSPORT_CONNECTION_TIMEOUT,
            &re::TRANSPORT_DNS_FAILED,
            &re::TRANSPORT_START_FAILED,
            &re::TRANSPORT_ENDPOINT_INVALID,
            &re::TRANSPORT_ADMISSION_QUEUE_SATURATED,
            &re::TRANSPORT_REMOTE_RATE_LIMITED,
            &re::ROUTE_TOPIC_NOT_FOUND,
            &re::ROUTE_CLUSTER_NOT_FOUND,
            &re::BROKER_LOOKUP_NOT_FOUND,
            &re::BROKER_LEADERSHIP_NOT_MASTER,
            &re::RPC_BROKER_ADDRESS_NOT_FOUND,
            &re::CLIENT_LIFECYCLE_NOT_STARTED,
            &re::CLIENT_LIFECYCLE_SHUTTING_DOWN,
            &re::CLIENT_LIFECYCLE_INVALID_STATE,
            &re::CLIENT_COMPONENT_UNAVAILABLE,
            &re::CORE_LIFECYCLE_NOT_INITIALIZED,
        ],
    ) {
        return FailureKind::Unavailable;
    }
    if is(
        d,
        &[
            &re::TRANSPORT_RESPONSE_TIMEOUT,
            &re::TRANSPORT_WRITE_TIMEOUT,
            &re::CORE_OPERATION_TIMED_OUT,
        ],
    ) {
        return FailureKind::Timeout;
    }
    if is(d, &[&re::BROKER_OPERATION_FAILED]) {
        return match e.broker_response_code() {
            Some(broker_code::SYSTEM_BUSY | broker_code::SERVICE_NOT_AVAILABLE) => FailureKind::Unavailable,
            Some(
                broker_code::FLUSH_DISK_TIMEOUT | broker_code::FLUSH_SLAVE_TIMEOUT | broker_code::SLAVE_NOT_AVAILABLE,
            ) => FailureKind::Timeout,
            _ => FailureKind::Rejected,
        };
    }
    if let Some(c) = e.source_ref::<MQClientException>() {
        // The client wraps its own conditions in an argument error with a code of its own.
        return match c.response_code() {
            client_code::CONNECT_BROKER_EXCEPTION
            | client_code::BROKER_NOT_EXIST_EXCEPTION
            | client_code::NO_NAME_SERVER_EXCEPTION
            | client_code::NOT_FOUND_TOPIC_EXCEPTION => FailureKind::Unavailable,
            client_code::ACCESS_BROKER_TIMEOUT | client_code::REQUEST_TIMEOUT_EXCEPTION => FailureKind::Timeout,
            _ => FailureKind::Rejected,
        };
    }
    if is(
        d,
        &[
            &re::BROKER_MESSAGE_TOO_LARGE,
            &re::BROKER_MESSAGE_INVALID,
            &re::BROKER_TOPIC_NOT_FOUND,
            &re::PROTOCOL_MESSAGE_PROPERTY_INVALID,
            &re::CORE_ARGUMENT_INVALID,
        ],
    ) {
        return FailureKind::Rejected;
    }
    // Anything else: go by the descriptor's canonical condition.
    match d.condition() {
        CanonicalCondition::Unavailable | CanonicalCondition::ResourceExhausted => FailureKind::Unavailable,
        CanonicalCondition::DeadlineExceeded => FailureKind::Timeout,
        _ => FailureKind::Rejected,
    }
}

/// A test consumer: reads every message of a topic back from the first offset.
pub mod testing {
    use std::collections::{BTreeMap, HashSet};
    use std::time::{Duration, Instant};

    use cheetah_string::CheetahString;
    use rocketmq_client_rust::DefaultLitePullConsumer;
    use rocketmq_model::common::consumer::consume_from_where::ConsumeFromWhere;
    use rocketmq_model::common::message::MessageTrait;

    use super::describe;

    /// One message as a consumer sees it.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Consumed {
        pub msg_id: String,
        pub topic: String,
        pub body: Vec<u8>,
        pub keys: Option<String>,
        pub tags: Option<String>,
        /// Every property, the system ones (KEYS, TAGS, UNIQ_KEY, ...) included.
        pub properties: BTreeMap<String, String>,
        pub queue_id: i32,
        pub queue_offset: i64,
        /// The broker that stored it (a queue is `(broker, queue_id)`).
        pub broker: String,
    }

    impl Consumed {
        /// The `eventId` property parsed as a row id.
        pub fn event_id(&self) -> Option<u64> {
            self.properties.get("eventId").and_then(|v| v.parse().ok())
        }
    }

    /// What [`read_topic`] found.
    #[derive(Debug, Clone, Default)]
    pub struct ReadBack {
        /// Every message, in the order received (duplicates included).
        pub messages: Vec<Consumed>,
        /// Distinct `eventId`s seen.
        pub distinct: usize,
        /// Whether the deadline passed before `expected` distinct events arrived.
        pub timed_out: bool,
    }

    impl ReadBack {
        /// Messages received more than once (by `eventId`): total minus distinct.
        pub fn duplicates(&self) -> usize {
            self.messages.iter().filter(|m| m.event_id().is_some()).count() - self.distinct
        }
    }

    /// Reads `topic` from its first offset with a fresh consumer group until `expected` distinct
    /// `eventId`s arrived and one more poll brings nothing (so late duplicates are counted too),
    /// or until `deadline` passes.
    pub fn read_topic(namesrv: &str, topic: &str, expected: usize, deadline: Duration) -> Result<ReadBack, String> {
        let end = Instant::now() + deadline;
        let (owner, telemetry, rt) = super::client_runtime("outbox-test-consumer", "outbox-test-consumer")
            .map_err(|(what, e)| format!("{what}: {e}"))?;
        let group = format!("outbox_test_{:08x}", rand::random::<u32>());
        let consumer = DefaultLitePullConsumer::builder(rt.clone())
            .consumer_group(group.as_str())
            .name_server_addr(namesrv)
            .instance_name(group.as_str())
            .consume_from_where(ConsumeFromWhere::ConsumeFromFirstOffset)
            .auto_commit(false)
            .build()
            .map_err(|e| describe(&e))?;
        let result = owner.block_on(async {
            consumer.subscribe(topic).await.map_err(|e| describe(&e))?;
            consumer.start().await.map_err(|e| describe(&e))?;
            let event_id = CheetahString::from_static_str("eventId");
            let mut seen = HashSet::new();
            let mut out = ReadBack::default();
            loop {
                let batch = consumer.poll_with_timeout(1000).await;
                let empty = batch.is_empty();
                for m in batch {
                    if let Some(id) = m.property(&event_id) {
                        seen.insert(id.to_string());
                    }
                    out.messages.push(Consumed {
                        msg_id: m.msg_id().to_string(),
                        topic: m.topic().to_string(),
                        body: m.body().map(|b| b.to_vec()).unwrap_or_default(),
                        keys: m.get_keys().map(|k| k.to_string()),
                        tags: m.get_tags().map(|t| t.to_string()),
                        properties: m
                            .properties()
                            .iter()
                            .map(|(k, v)| (k.to_string(), v.to_string()))
                            .collect(),
                        queue_id: m.queue_id(),
                        queue_offset: m.queue_offset(),
                        broker: m.broker_name().to_string(),
                    });
                }
                out.distinct = seen.len();
                if out.distinct >= expected && empty {
                    break;
                }
                if Instant::now() >= end {
                    out.timed_out = out.distinct < expected;
                    break;
                }
            }
            consumer.shutdown().await;
            Ok::<_, String>(out)
        });
        owner.block_on(async {
            let _ = rt.shutdown().await;
        });
        drop(consumer);
        drop(rt);
        let _ = owner.shutdown_runtime_blocking_with_timeout(Duration::from_secs(5));
        drop(telemetry);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(id: u64) -> OutboundEvent {
        OutboundEvent {
            id,
            key: format!("key-{id}"),
            biz_no: format!("ORD-{id}"),
            event_type: "ORDER_CREATED".into(),
            payload: b"{}".to_vec(),
            topic: "T".into(),
            tag: None,
            headers: BTreeMap::new(),
            attempt: 0,
        }
    }

    fn err(d: &'static ErrorDescriptor) -> ClientError {
        ClientError::from_error(rocketmq_error::Error::new(d))
    }

    fn connection_failed_in(phase: &str) -> ClientError {
        ClientError::from_error(
            rocketmq_error::Error::new(&rocketmq_error::TRANSPORT_CONNECTION_FAILED)
                .with_context(rocketmq_error::ErrorContext::new().with_text(rocketmq_error::fields::PHASE, phase)),
        )
    }

    #[test]
    fn a_connection_that_failed_is_free_only_if_nothing_can_have_been_written() {
        // Refused, or failed while connecting: the request never left.
        for phase in ["connect", "endpoint_validation", "before_write"] {
            assert_eq!(
                classify(&connection_failed_in(phase)),
                FailureKind::Unavailable,
                "{phase}"
            );
        }
        let refused = ClientError::from_error(rocketmq_error::Error::caused_by(
            &rocketmq_error::TRANSPORT_CONNECTION_FAILED,
            std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        ));
        assert_eq!(classify(&refused), FailureKind::Unavailable);
        // Lost while writing or waiting for the answer (a stalled broker), or no telling: the
        // broker may store it, so it is an unknown outcome (an attempt, a possible duplicate).
        for phase in ["writing", "awaiting_response", "read", "write", "closed"] {
            assert_eq!(classify(&connection_failed_in(phase)), FailureKind::Timeout, "{phase}");
        }
        assert_eq!(
            classify(&err(&rocketmq_error::TRANSPORT_CONNECTION_FAILED)),
            FailureKind::Timeout
        );
        let reset = ClientError::from_error(rocketmq_error::Error::caused_by(
            &rocketmq_error::TRANSPORT_CONNECTION_FAILED,
            std::io::Error::from(std::io::ErrorKind::ConnectionReset),
        ));
        assert_eq!(classify(&reset), FailureKind::Timeout);
    }

    #[test]
    fn broker_unreachable_errors_are_unavailable() {
        for d in [
            &rocketmq_error::TRANSPORT_CONNECTION_TIMEOUT,
            &rocketmq_error::ROUTE_TOPIC_NOT_FOUND,
            &rocketmq_error::CLIENT_LIFECYCLE_NOT_STARTED,
            &rocketmq_error::TRANSPORT_ADMISSION_QUEUE_SATURATED,
        ] {
            assert_eq!(classify(&err(d)), FailureKind::Unavailable, "{}", d.code());
        }
        assert_eq!(classify(&ClientError::not_started()), FailureKind::Unavailable);
        assert_eq!(classify(&ClientError::route_not_found("T")), FailureKind::Unavailable);
        assert_eq!(
            classify(&ClientError::broker_not_found("broker-a")),
            FailureKind::Unavailable
        );
        // What the producer returns when it has no route ("No route available", "No route info"),
        // and the name server's TOPIC_NOT_EXIST for a topic no live broker serves (a killed broker).
        for code in [10001, 10003, 10004, 10005, 17] {
            let e = ClientError::from(MQClientException::new_with_code(code, "No route available"));
            assert_eq!(classify(&e), FailureKind::Unavailable, "client code {code}");
        }
        for e in [
            ClientError::from(MQClientException::new_with_code(17, "Topic route was not found")),
            ClientError::route_not_found("T"),
        ] {
            assert!(
                to_send_error(&e).message.starts_with(NO_ROUTE),
                "judged after the send: {}",
                describe(&e)
            );
        }
        let connection = to_send_error(&connection_failed_in("connect"));
        assert!(!connection.message.starts_with(NO_ROUTE));
        for code in [2, 14] {
            let e = ClientError::broker_operation_failed("BROKER_OPERATION", code, "busy");
            assert_eq!(classify(&e), FailureKind::Unavailable, "broker code {code}");
        }
    }

    #[test]
    fn timeouts_are_unknown_outcomes() {
        assert_eq!(classify(&ClientError::timeout("send", 3000)), FailureKind::Timeout);
        assert_eq!(
            classify(&err(&rocketmq_error::TRANSPORT_RESPONSE_TIMEOUT)),
            FailureKind::Timeout
        );
        let e = ClientError::from(MQClientException::new_with_code(10006, "request timeout"));
        assert_eq!(classify(&e), FailureKind::Timeout);
        let e = ClientError::broker_operation_failed("BROKER_OPERATION", 10, "flush disk timeout");
        assert_eq!(classify(&e), FailureKind::Timeout);
    }

    #[test]
    fn message_errors_are_rejected() {
        // The client's own checks (body too large for its limit, blank topic, ...).
        let e = ClientError::from(MQClientException::new_with_code(
            13,
            "the message body size over max value",
        ));
        assert_eq!(classify(&e), FailureKind::Rejected);
        let e = ClientError::from(MQClientException::new("The specified topic is blank"));
        assert_eq!(classify(&e), FailureKind::Rejected);
        // The broker refusing the message.
        for code in [13, 16, 17, 1] {
            let e = ClientError::broker_operation_failed("BROKER_OPERATION", code, "refused");
            assert_eq!(classify(&e), FailureKind::Rejected, "broker code {code}");
        }
        let e: ClientError = MQBrokerException::new(13, "message body size exceeds").into();
        assert_eq!(classify(&e), FailureKind::Rejected);
        assert!(describe(&e).contains("13"), "{}", describe(&e));
        assert_eq!(
            classify(&ClientError::invalid_property("UNIQ_KEY")),
            FailureKind::Rejected
        );
        assert_eq!(
            classify(&err(&rocketmq_error::BROKER_MESSAGE_TOO_LARGE)),
            FailureKind::Rejected
        );
    }

    #[test]
    fn descriptions_keep_the_client_message() {
        let e = ClientError::from(MQClientException::new_with_code(
            13,
            "the message body size over max value, MAX: 4",
        ));
        let d = describe(&e);
        assert!(d.contains("client code 13") && d.contains("over max value"), "{d}");
    }

    #[test]
    fn message_carries_key_tag_and_properties() {
        use rocketmq_model::common::message::MessageTrait;
        let mut e = event(42).clone();
        e.headers.insert("traceId".into(), "t-1".into());
        let m = build_message(&e, TagSource::EventType).unwrap();
        assert_eq!(m.get_keys().unwrap().as_str(), "42");
        assert_eq!(m.get_tags().unwrap().as_str(), "ORDER_CREATED");
        let p = |k: &'static str| m.property(&CheetahString::from_static_str(k)).map(|v| v.to_string());
        assert_eq!(p("eventId").as_deref(), Some("42"));
        assert_eq!(p("eventKey").as_deref(), Some("key-42"));
        assert_eq!(p("eventType").as_deref(), Some("ORDER_CREATED"));
        assert_eq!(p("bizNo").as_deref(), Some("ORD-42"));
        assert_eq!(p("traceId").as_deref(), Some("t-1"));
        e.tag = Some("VIP".into());
        assert_eq!(
            build_message(&e, TagSource::None).unwrap().get_tags().unwrap().as_str(),
            "VIP"
        );
        e.tag = None;
        assert!(build_message(&e, TagSource::None).unwrap().get_tags().is_none());
    }

    #[test]
    fn unsendable_properties_are_rejected_not_sent() {
        let mut e = event(1);
        e.headers.insert("UNIQ_KEY".into(), "x".into());
        assert_eq!(
            build_message(&e, TagSource::EventType).unwrap_err().kind,
            FailureKind::Rejected
        );
        let mut e = event(2);
        e.biz_no = "A\u{1}B".into();
        assert_eq!(
            build_message(&e, TagSource::EventType).unwrap_err().kind,
            FailureKind::Rejected
        );
        let mut e = event(3);
        e.headers.insert("big".into(), "x".repeat(40_000));
        assert_eq!(
            build_message(&e, TagSource::EventType).unwrap_err().kind,
            FailureKind::Rejected
        );
    }

    #[test]
    fn batches_respect_topic_and_size() {
        let mut events: Vec<OutboundEvent> = (0..6).map(event).collect();
        events[2].topic = "U".into();
        let sizes: Vec<(usize, usize)> = vec![
            (0, 100),
            (1, BATCH_MAX_BYTES - 200),
            (2, 100),
            (3, 150),
            (4, BATCH_MAX_BYTES + 1),
            (5, 50),
        ];
        let groups = plan_batches(&events, &sizes, BATCH_MAX_BYTES);
        assert_eq!(groups, vec![vec![0, 1], vec![2], vec![3, 5], vec![4]]);
    }

    #[test]
    fn batch_ids_are_split_per_message() {
        let r = SendResult {
            msg_id: Some(CheetahString::from_string("A,B,C".into())),
            ..Default::default()
        };
        let ids: Vec<_> = batch_outcomes(&r, 3)
            .into_iter()
            .map(|o| match o {
                SendOutcome::Sent { msg_id } => msg_id.unwrap(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(ids, vec!["A", "B", "C"]);
        let shared = batch_outcomes(&r, 2);
        assert_eq!(
            shared[0],
            SendOutcome::Sent {
                msg_id: Some("A,B,C".into())
            }
        );
        let not_ok = SendResult {
            send_status: SendStatus::FlushDiskTimeout,
            ..Default::default()
        };
        assert!(matches!(&batch_outcomes(&not_ok, 1)[0], SendOutcome::Failed(e) if e.kind == FailureKind::Timeout));
    }
}
