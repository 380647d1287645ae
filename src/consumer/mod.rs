//! The consumer runtime: the consuming half of the pattern (docs/inbox.md).
//!
//! A [`Consumer`] takes messages from a [`Source`] (RocketMQ: `outbox::rocketmq::RocketMqSource`,
//! cargo feature `rocketmq`) and runs the service's [`Handler`] on each, inside a database transaction
//! that also holds the message's [inbox](crate::inbox) mark: the handler's writes commit once per
//! consumer group and event key, however many copies arrive.
//!
//! One file per concern: the vocabulary ([`Message`], [`Source`], [`Handler`]) here;
//! [`ConsumerConfig`] in `config.rs`; [`ConsumerStats`] in `stats.rs`; the [`Consumer`] with its
//! poller and handler threads in `runtime.rs`; one message's transaction, retries and parking in
//! `handle.rs`; dead-letter replay and mark retention in `replay.rs`; the dead-letter table's
//! statements in `dead_letter.rs`.
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

mod config;
pub mod dead_letter;
mod handle;
mod replay;
mod runtime;
mod shared;
mod stats;

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use mysql::Transaction;

use crate::error::Result;
use crate::inbox::MessageMeta;

pub use config::ConsumerConfig;
pub use runtime::Consumer;
pub use stats::ConsumerStats;

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

    pub(crate) fn meta(&self) -> MessageMeta {
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
