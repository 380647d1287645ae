//! A [`Source`] on RocketMQ: `rocketmq-client-rust`'s lite pull
//! consumer in subscribe mode (the broker balances the topic's queues over the group's
//! instances), with automatic offset commits off: offsets move only when the [`Consumer`]
//! commits them, after the database commit.
//!
//! [`Consumer`]: crate::consumer::Consumer

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rocketmq_client_rust::{ClientRuntime, DefaultLitePullConsumer};
use rocketmq_model::common::consumer::consume_from_where::ConsumeFromWhere;
use rocketmq_model::common::message::message_queue::MessageQueue;
use rocketmq_observability::TelemetryRuntimeGuard;
use rocketmq_runtime::RuntimeOwner;

use super::classify::describe;
use super::runtime::client_runtime;
use crate::config::ConsumerConfig;
use crate::consumer::{Message, QueueRef, Source};
use crate::error::{Error, Result};

pub use crate::config::StartFrom;

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

/// The lite pull consumer and the runtime it runs on.
pub struct RocketMqSource {
    owner: RuntimeOwner,
    client_runtime: Arc<ClientRuntime>,
    consumer: DefaultLitePullConsumer,
    _telemetry: TelemetryRuntimeGuard,
    /// Message queues by our queue reference (commits need the client's own value).
    queues: Mutex<HashMap<QueueRef, MessageQueue>>,
    /// The next offset to consume per queue, as committed by the consumer.
    committed: Mutex<HashMap<MessageQueue, i64>>,
    closed: Mutex<bool>,
}

fn source_error(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Publisher(format!("RocketMQ consumer {what}: {e}"))
}

impl RocketMqSource {
    /// Subscribes `config.topic` with `config.group` and starts pulling.
    pub fn start(config: &SourceConfig) -> Result<RocketMqSource> {
        crate::inbox::check_group(&config.group)?;
        if config.topic.is_empty() {
            return Err(crate::error::ConfigError::invalid("consumer.topic", "", "must not be empty").into());
        }
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
            .build()
            .map_err(|e| source_error("configuration", describe(&e)))?;
        owner.block_on(async {
            consumer
                .subscribe(config.topic.as_str())
                .await
                .map_err(|e| source_error(&format!("subscribe to {}", config.topic), describe(&e)))?;
            consumer.start().await.map_err(|e| source_error("start", describe(&e)))
        })?;
        log::info!(
            "RocketMQ consumer {} subscribed to {} at {}",
            config.group,
            config.topic,
            config.namesrv
        );
        Ok(RocketMqSource {
            owner,
            client_runtime,
            consumer,
            _telemetry: telemetry,
            queues: Mutex::new(HashMap::new()),
            committed: Mutex::new(HashMap::new()),
            closed: Mutex::new(false),
        })
    }
}

impl Source for RocketMqSource {
    fn poll(&self, timeout: Duration) -> Result<Vec<Message>> {
        let ms = timeout.as_millis().clamp(1, u64::MAX as u128) as u64;
        let batch = self.owner.block_on(self.consumer.poll_with_timeout(ms));
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
        if !map.is_empty() {
            // A queue balanced away meanwhile is skipped by the client.
            self.owner.block_on(self.consumer.commit_with_map(map, persist));
        }
    }

    fn lag(&self) -> Option<u64> {
        self.owner.block_on(async {
            let assigned = self.consumer.assignment().await.ok()?;
            let mut lag = 0u64;
            for mq in assigned {
                let max = self.consumer.max_offset(&mq).await.ok()?;
                let committed = self.consumer.committed(&mq).await.unwrap_or(0).max(0);
                lag += (max - committed).max(0) as u64;
            }
            Some(lag)
        })
    }

    fn shutdown(&self) {
        let mut closed = self.closed.lock();
        if *closed {
            return;
        }
        *closed = true;
        let step = Duration::from_secs(10);
        self.owner.block_on(async {
            if tokio::time::timeout(step, self.consumer.shutdown()).await.is_err() {
                log::warn!(
                    "RocketMQ consumer shutdown took longer than {} s; going on",
                    step.as_secs()
                );
            }
            let _ = tokio::time::timeout(step, self.client_runtime.shutdown()).await;
        });
    }
}

impl Drop for RocketMqSource {
    fn drop(&mut self) {
        self.shutdown();
    }
}
