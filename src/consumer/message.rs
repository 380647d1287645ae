//! One message as the handler sees it ([`Message`]), the queue it came from, and where its dedup
//! key came from.

use std::collections::BTreeMap;
use std::fmt;

use crate::inbox::MessageMeta;

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

/// The message property carrying when the event's row was written (the outbox database's
/// clock, milliseconds since the Unix epoch): commit → credited is measured from it.
pub const EVENT_CREATED_AT_PROPERTY: &str = "eventCreatedAt";

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

    /// When the event's row was written (`eventCreatedAt`), in milliseconds since the Unix epoch.
    pub fn created_ms(&self) -> Option<u64> {
        self.property(EVENT_CREATED_AT_PROPERTY).and_then(|v| v.parse().ok())
    }

    /// The producer's W3C trace context (`traceparent`, `tracestate`), if the message carries a
    /// valid one (docs/tracing.md).
    pub fn trace_context(&self) -> Option<(crate::trace::TraceParent, Option<&str>)> {
        crate::trace::context_of(&self.properties)
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
