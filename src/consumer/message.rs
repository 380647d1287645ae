//! One message as the handler sees it ([`Message`]): where it came from, its dedup key (by the
//! wire contract, [`crate::wire`]) and what the relay's properties say.

use std::collections::BTreeMap;

use crate::inbox::MessageMeta;
use crate::wire::{self, KeySource, QueueRef};

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
    /// User properties (`eventId`, `eventKey`, `eventType`, `bizNo`, `eventCreatedAt` and the
    /// row's headers: [`crate::wire`]).
    pub properties: BTreeMap<String, String>,
    pub body: Vec<u8>,
}

impl Message {
    /// Builds a message and picks its dedup key ([`wire::dedup_key`]): the `eventKey` property,
    /// else `<topic>#<eventId>`, else the broker's message id.
    pub fn new(
        queue: QueueRef,
        offset: u64,
        msg_id: Option<String>,
        tag: Option<String>,
        properties: BTreeMap<String, String>,
        body: Vec<u8>,
    ) -> Message {
        let (key, key_source) = wire::dedup_key(&queue.topic, &properties, msg_id.as_deref());
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
        self.property(wire::EVENT_ID).and_then(|v| v.parse().ok())
    }

    pub fn event_type(&self) -> Option<&str> {
        self.property(wire::EVENT_TYPE)
    }

    pub fn biz_no(&self) -> Option<&str> {
        self.property(wire::BIZ_NO)
    }

    /// When the event's row was written (`eventCreatedAt`), in milliseconds since the Unix epoch.
    pub fn created_ms(&self) -> Option<u64> {
        self.property(wire::EVENT_CREATED_AT).and_then(|v| v.parse().ok())
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
