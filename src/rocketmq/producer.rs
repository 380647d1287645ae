//! [`RocketMqPublisher`]: one started producer on a runtime of its own, shared by every worker
//! thread. Unordered calls go out as broker batches (split below [`BATCH_MAX_BYTES`]), with a
//! batch refused for its content resent message by message; ordered calls go to `super::ordered`.
//! What a call's outcomes say about the broker (reachable or not) is kept for health checks.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cheetah_string::CheetahString;
use parking_lot::RwLock;
use rocketmq_client_rust::{AclClientRPCHook, ClientConfig, ClientRuntime, DefaultMQProducer, SessionCredentials};
use rocketmq_model::common::message::message_single::Message;
use rocketmq_observability::TelemetryRuntimeGuard;
use rocketmq_runtime::RuntimeOwner;

use super::classify::{describe, to_send_error, NO_ROUTE};
use super::message::{batch_outcomes, build_message, message_size, single_result};
use super::runtime::{block_on_bounded, client_runtime, millis, SHUTDOWN_STEP};
use crate::config::{Config, TagSource};
use crate::error::{Error, Result};
use crate::event::OutboundEvent;
use crate::publisher::{FailureKind, Publisher, SendError, SendOutcome};
use crate::queues::{queue_index, QueueBook};
use crate::wire::QueueRef;

/// Largest encoded size of one broker batch. The broker refuses a request whose body exceeds its
/// `maxMessageSize` (4 MiB by default); a batch is one request, so batches stay well below it.
pub const BATCH_MAX_BYTES: usize = 1024 * 1024;

/// A send is not started with less budget than this left; the event is returned unsent.
pub(super) const MIN_SEND_BUDGET: Duration = Duration::from_millis(5);

/// Ordered topics' routes: the queues as last fetched, and when.
pub(super) type Routes = HashMap<String, (Instant, Vec<QueueRef>)>;

pub(super) struct Live {
    pub(super) owner: RuntimeOwner,
    pub(super) client_runtime: Arc<ClientRuntime>,
    pub(super) producer: DefaultMQProducer,
    pub(super) telemetry: TelemetryRuntimeGuard,
}

/// Publishes events to Apache RocketMQ through one producer. See the module documentation.
pub struct RocketMqPublisher {
    pub(super) live: RwLock<Option<Live>>,
    pub(super) tag_source: TagSource,
    /// `ordering = per-biz-no`: the stable queue set of each topic; a key's events go, in order,
    /// to the queue its biz_no hashes to among them (see [`crate::ordering`]).
    pub(super) book: Option<QueueBook>,
    /// Ordered topics: the queues of the route as last fetched, and when.
    /// A route past [`ROUTE_TTL`] is still used while one background lookup refreshes it, so no
    /// send waits for the name server except the first of a topic (and after a failure).
    pub(super) routes: Arc<parking_lot::Mutex<Routes>>,
    /// Topics whose route a background lookup is refreshing now.
    pub(super) refreshing: Arc<parking_lot::Mutex<HashSet<String>>>,
    /// Ordered topics this publisher already tried to create.
    pub(super) created: parking_lot::Mutex<HashSet<String>>,
    pub(super) namesrv: String,
    pub(super) producer_group: String,
    pub(super) acl: bool,
    pub(super) batch_max_bytes: usize,
    /// The configured default topic (`topic`).
    pub(super) default_topic: String,
    /// False after a publish call in which the broker was unreachable for every event; true again
    /// after any call that reached it.
    pub(super) reachable: AtomicBool,
    /// Send requests made to brokers (a batch counts once), for [`RocketMqPublisher::requests`].
    pub(super) requests: AtomicU64,
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

pub(super) fn publisher_error(what: &str, e: impl fmt::Display) -> Error {
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
            &live.owner,
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
            &live.owner,
            budget,
            live.producer.send_with_timeout(message, millis(budget)),
        ))
    }
}

/// A send that failed before it reached a broker that could store it, for a reason of that
/// broker (not a missing route, which every broker would give alike).
fn refused_by_a_broker(outcome: &SendOutcome) -> bool {
    matches!(outcome, SendOutcome::Failed(e) if e.kind == FailureKind::Unavailable && !e.message.starts_with(NO_ROUTE))
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

pub(super) fn budget_spent() -> SendError {
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

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
            created_ms: 0,
        }
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
}
