//! The wire contract between the relay's messages and the consumers that read them, in one place:
//! the message property names, the names an event's headers may not take, what the message key
//! and the `eventKey` property hold (and the dedup key a consumer falls back on for a message
//! without `eventKey`), the tag a message carries, and the queue a message sits on.
//!
//! The RocketMQ adapter builds messages by it (`rocketmq/message.rs`) and reads them back by it
//! (`rocketmq/source.rs`); the consumer's `Message` picks its dedup key by it; the spans
//! (`telemetry`) carry what it says was sent; the console shows a row's tag and a dead letter's
//! queue by it; events refuse its reserved names as headers (`event.rs`). Broker-neutral: names
//! and rules, no client. The Go and Java bindings spell the names again in their own languages
//! (`bindings/go/inbox.go`, `OutboxInbox.java`, `OutboxTracing.java`).

use std::collections::BTreeMap;
use std::fmt;

/// The property holding the outbox row id (`t_event_record.id`): unique within one outbox table.
pub const EVENT_ID: &str = "eventId";
/// The property holding the event's dedup key (the row's `event_key`, a UUID v7 given at its
/// first claim): unique across outbox tables and databases, what consumers' inboxes key on.
pub const EVENT_KEY: &str = "eventKey";
/// The property holding the row's `event_type`.
pub const EVENT_TYPE: &str = "eventType";
/// The property holding the row's `biz_no` (the business key, the ordering key).
pub const BIZ_NO: &str = "bizNo";
/// The property holding when the row was written (its `create_time`, the outbox database's
/// clock), in milliseconds since the Unix epoch: commit → credited is measured from it. Set only
/// when known.
pub const EVENT_CREATED_AT: &str = "eventCreatedAt";
/// The header (and message property) holding the W3C `traceparent` (the name OpenTelemetry's
/// RocketMQ instrumentation uses); its format is `crate::trace`'s.
pub const TRACEPARENT: &str = "traceparent";
/// The header (and message property) holding the W3C `tracestate`.
pub const TRACESTATE: &str = "tracestate";
/// The property a re-emitted event carries (`crate::reemit`): the id of the row it copies, whose
/// message went out before under the same [`EVENT_KEY`]. Consumers see a re-emit by it; their
/// inboxes still take it for the event they already handled.
pub const REEMIT_OF: &str = "reemitOf";
/// The property naming the re-emit job (`outbox_reemit.id`) that made the copy.
pub const REEMIT_JOB: &str = "reemitJob";
/// RocketMQ's own property holding the message key ([`message_key`]).
pub const KEYS: &str = "KEYS";
/// RocketMQ's own property holding the message tag ([`tag`]).
pub const TAGS: &str = "TAGS";

/// The properties the relay sets on every message from the row's columns (`eventCreatedAt` only
/// when the row's time is known); the row's headers come with them, under their own names.
pub const RELAY_PROPERTIES: [&str; 5] = [EVENT_ID, EVENT_KEY, EVENT_TYPE, BIZ_NO, EVENT_CREATED_AT];

/// The names an event's headers may not take: the properties the relay sets itself (a re-emit's
/// among them), and the broker's own for the key and the tag.
pub const RESERVED: [&str; 9] = [
    RELAY_PROPERTIES[0],
    RELAY_PROPERTIES[1],
    RELAY_PROPERTIES[2],
    RELAY_PROPERTIES[3],
    RELAY_PROPERTIES[4],
    REEMIT_OF,
    REEMIT_JOB,
    KEYS,
    TAGS,
];

/// Whether `name` is one an event's headers may not take ([`RESERVED`]).
pub fn is_reserved(name: &str) -> bool {
    RESERVED.contains(&name)
}

/// The message key (RocketMQ's [`KEYS`]) of the event of row `id`: the row id, as the broker's
/// tools look a message up. Unique within one outbox table only: consumers deduplicate on
/// [`EVENT_KEY`], never on it.
pub fn message_key(id: u64) -> String {
    id.to_string()
}

/// The tag a message carries: the row's own when it sets a non-empty one, else its event type
/// when `by_event_type` (`rocketmq.tag.source = event-type`, the default), else none. What the
/// producer sends and what the `outbox.publish` span reports, so the two cannot differ.
pub fn tag<'a>(row_tag: Option<&'a str>, event_type: &'a str, by_event_type: bool) -> Option<&'a str> {
    match row_tag {
        Some(t) if !t.is_empty() => Some(t),
        _ if by_event_type => Some(event_type),
        _ => None,
    }
}

/// Where a message's dedup key came from ([`dedup_key`]).
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

/// The dedup key of a message on `topic` with `properties` and the broker's `msg_id`: its
/// non-empty [`EVENT_KEY`], else `<topic>#<eventId>` from a non-empty [`EVENT_ID`] (a message of
/// an older relay), else `msg:<message id>`.
pub fn dedup_key(topic: &str, properties: &BTreeMap<String, String>, msg_id: Option<&str>) -> (String, KeySource) {
    match (properties.get(EVENT_KEY), properties.get(EVENT_ID)) {
        (Some(k), _) if !k.is_empty() => (k.clone(), KeySource::EventKey),
        (_, Some(id)) if !id.is_empty() => (format!("{topic}#{id}"), KeySource::EventId),
        _ => (format!("msg:{}", msg_id.unwrap_or_default()), KeySource::MessageId),
    }
}

/// A queue of a topic on one broker: where a consumer's message came from and its offset is
/// committed, and a member of an ordered topic's stable queue set (`crate::queues`). Ordered by
/// topic, broker and queue id (within one topic: by broker name, then queue id).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueueRef {
    pub topic: String,
    pub broker: String,
    pub queue_id: u32,
}

impl QueueRef {
    /// How a queue is written in logs, errors and the console: `topic@broker#queue_id`. The
    /// console writes a dead letter's place with it, whose broker or queue id may be unknown.
    pub fn name(topic: &str, broker: &str, queue_id: impl fmt::Display) -> String {
        format!("{topic}@{broker}#{queue_id}")
    }

    /// The queue within its topic, `broker#queue_id`: how the queue book and ordered sends name
    /// the queues of one topic.
    pub fn in_topic(&self) -> String {
        format!("{}#{}", self.broker, self.queue_id)
    }
}

impl fmt::Display for QueueRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&QueueRef::name(&self.topic, &self.broker, self.queue_id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn the_reserved_names_are_the_relay_s_properties_a_re_emit_s_and_the_broker_s_key_and_tag() {
        for name in RELAY_PROPERTIES.iter().chain([&REEMIT_OF, &REEMIT_JOB, &KEYS, &TAGS]) {
            assert!(is_reserved(name), "{name}");
        }
        assert_eq!(RESERVED.len(), RELAY_PROPERTIES.len() + 4);
        for free in [TRACEPARENT, TRACESTATE, "traceId", "eventkey"] {
            assert!(!is_reserved(free), "{free}");
        }
    }

    #[test]
    fn the_tag_is_the_row_s_else_the_event_type_when_asked_else_none() {
        assert_eq!(tag(Some("VIP"), "ORDER_PAID", true), Some("VIP"));
        assert_eq!(tag(Some("VIP"), "ORDER_PAID", false), Some("VIP"));
        assert_eq!(tag(None, "ORDER_PAID", true), Some("ORDER_PAID"));
        assert_eq!(tag(Some(""), "ORDER_PAID", true), Some("ORDER_PAID"));
        assert_eq!(tag(None, "ORDER_PAID", false), None);
        assert_eq!(tag(Some(""), "ORDER_PAID", false), None);
    }

    #[test]
    fn the_dedup_key_is_event_key_else_topic_and_event_id_else_the_message_id() {
        let k = dedup_key("T", &props(&[(EVENT_KEY, "k-1"), (EVENT_ID, "7")]), Some("M"));
        assert_eq!(k, ("k-1".to_string(), KeySource::EventKey));
        let k = dedup_key("T", &props(&[(EVENT_KEY, ""), (EVENT_ID, "7")]), Some("M"));
        assert_eq!(k, ("T#7".to_string(), KeySource::EventId));
        let k = dedup_key("T", &props(&[(EVENT_ID, "")]), Some("M"));
        assert_eq!(k, ("msg:M".to_string(), KeySource::MessageId));
        assert_eq!(dedup_key("T", &props(&[]), None).0, "msg:");
        assert_eq!(message_key(42), "42");
    }

    #[test]
    fn a_queue_is_written_topic_at_broker_hash_id() {
        let q = QueueRef {
            topic: "T".into(),
            broker: "broker-a".into(),
            queue_id: 3,
        };
        assert_eq!(q.to_string(), "T@broker-a#3");
        assert_eq!(q.in_topic(), "broker-a#3");
        assert_eq!(QueueRef::name("T", "?", ""), "T@?#");
    }
}
