//! A test consumer: reads every message of a topic back from the first offset (tests, the demo,
//! the fault suite).

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use cheetah_string::CheetahString;
use rocketmq_client_rust::DefaultLitePullConsumer;
use rocketmq_model::common::consumer::consume_from_where::ConsumeFromWhere;
use rocketmq_model::common::message::MessageTrait;

use super::classify::describe;
use crate::wire;

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
        self.properties.get(wire::EVENT_ID).and_then(|v| v.parse().ok())
    }

    /// The `bizNo` property.
    pub fn biz_no(&self) -> Option<&str> {
        self.properties.get(wire::BIZ_NO).map(String::as_str)
    }
}

/// What [`read_topic`] found.
#[derive(Debug, Clone, Default)]
pub struct ReadBack {
    /// Every message, in the order received (duplicates included).
    pub messages: Vec<Consumed>,
    /// Distinct keys seen (`eventId`s, or the property [`read_topic_by`] was given).
    pub distinct: usize,
    /// Messages that carry the key.
    pub keyed: usize,
    /// Whether the deadline passed before `expected` distinct events arrived.
    pub timed_out: bool,
}

impl ReadBack {
    /// Messages received more than once (by their key): keyed messages minus distinct keys.
    pub fn duplicates(&self) -> usize {
        self.keyed - self.distinct
    }
}

/// Reads `topic` from its first offset with a fresh consumer group until `expected` distinct
/// `eventId`s arrived and one more poll brings nothing (so late duplicates are counted too),
/// or until `deadline` passes.
pub fn read_topic(namesrv: &str, topic: &str, expected: usize, deadline: Duration) -> Result<ReadBack, String> {
    read_topic_by(namesrv, topic, expected, deadline, wire::EVENT_ID)
}

/// [`read_topic`] with events told apart by the property `key` (`bizNo` where ids repeat: a
/// fleet's shards each number their rows from 1).
pub fn read_topic_by(
    namesrv: &str,
    topic: &str,
    expected: usize,
    deadline: Duration,
    key: &'static str,
) -> Result<ReadBack, String> {
    let end = Instant::now() + deadline;
    let (owner, telemetry, rt) = super::runtime::client_runtime("outbox-test-consumer", "outbox-test-consumer")
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
        let key = CheetahString::from_static_str(key);
        let mut seen = HashSet::new();
        let mut out = ReadBack::default();
        loop {
            let batch = consumer.poll_with_timeout(1000).await;
            let empty = batch.is_empty();
            for m in batch {
                if let Some(id) = m.property(&key) {
                    seen.insert(id.to_string());
                    out.keyed += 1;
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
