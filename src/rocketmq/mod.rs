//! The RocketMQ adapter (cargo feature `rocketmq`), on `rocketmq-client-rust` 1.0: the relay's
//! [`Publisher`](crate::publisher::Publisher) and the consumer runtime's [`Source`](crate::consumer::Source).
//!
//! The client is async; the core is blocking. Each side owns a small Tokio runtime of its own
//! (`runtime`) and blocks on it. One file per concern:
//!
//! - [`producer`]: [`RocketMqPublisher`]: the producer, unordered sends as broker batches with a
//!   one-by-one fallback, and what a call's outcomes say about the broker;
//! - `ordered`: ordered sends (`ordering = per-biz-no`): each key's run to its queue, in order;
//! - `routes`: topic routes, the ordered topics' cached queues, and what a missing route means;
//! - [`message`]: an event as a message (key, tag, properties, by [`crate::wire`]) and a send
//!   result as outcomes;
//! - [`classify`]: client errors as [`FailureKind`](crate::publisher::FailureKind)s, and their descriptions;
//! - [`source`]: [`RocketMqSource`], the lite pull consumer the consumer runtime reads from;
//! - [`testing`]: a reader of a whole topic, for tests, the demo and the fault suite.
//!
//! The client is async; the relay core is blocking. [`RocketMqPublisher`] therefore owns a small
//! Tokio runtime (a `RuntimeOwner`), the client runtime built on it and one started
//! `DefaultMQProducer`. Worker threads call [`Publisher::publish`] concurrently; each call blocks
//! on the shared runtime (the producer's send methods take `&self`).
//!
//! What a message looks like ([`crate::wire`], the contract with the consumers): body = the
//! row's payload, key = the event id, tag = the row's tag or else its event type
//! (`rocketmq.tag.source`), user properties `eventId`, `eventKey` (the dedup key, unique across
//! outbox tables and databases), `eventType`, `bizNo`, `eventCreatedAt` plus the row's headers.
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
//!
//! [`classify`]: mod@classify
//! [`Publisher::publish`]: crate::Publisher::publish
//! [`FailureKind::Unavailable`]: crate::publisher::FailureKind::Unavailable
//! [`FailureKind::Timeout`]: crate::publisher::FailureKind::Timeout
//! [`FailureKind::Rejected`]: crate::publisher::FailureKind::Rejected

pub mod classify;
pub mod message;
mod ordered;
pub mod producer;
mod routes;
mod runtime;
pub mod source;
pub mod testing;

pub use classify::{classify, describe};
pub use message::{build_message, properties_of};
pub use producer::{RocketMqPublisher, BATCH_MAX_BYTES};
pub use source::{RocketMqSource, SourceConfig, StartFrom};
