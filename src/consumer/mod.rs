//! The consumer runtime: the consuming half of the pattern (docs/inbox.md).
//!
//! A [`Consumer`] takes messages from a [`Source`] (RocketMQ: `outbox::rocketmq::RocketMqSource`,
//! cargo feature `rocketmq`) and runs the service's [`Handler`] on each, inside a database transaction
//! that also holds the message's [inbox](crate::inbox) mark: the handler's writes commit once per
//! consumer group and event key, however many copies arrive.
//!
//! One file per concern: [`Message`] in `message.rs` (its dedup key, queue and property names
//! are the wire contract's, [`crate::wire`]), [`Source`] in `source.rs`, [`Handler`] in
//! `handler.rs`;
//! [`ConsumerConfig`] in `crate::config` (its `consumer.*` keys); [`ConsumerStats`] in `stats.rs`; the [`Consumer`] with its
//! poller and handler threads in `runtime.rs`; which thread a message goes to and a batch's order
//! in `route.rs`; how far each queue may be committed in `offsets.rs`; one message's
//! transaction, retries and parking in
//! `handle.rs`; dead-letter replay and mark retention in `replay.rs`; the dead-letter table's
//! statements in `dead_letter.rs`.
//!
//! Threads (blocking, like the relay):
//! - the **poller** takes messages from the source and hands each to the handler thread its
//!   route value names (`consumer.route`, `route.rs`: by default its queue, so a queue's
//!   messages, and so an ordered key's events, are handled one at a time in offset order), and
//!   commits each queue's offset past the messages that are all done (`offsets.rs`);
//! - **handler threads** (`threads`) run mark + handler + commit, a batch in the order of its
//!   route values. A batch that meets a deadlock or a lock wait timeout is run again as a
//!   batch (a few times, then one message at a time). A handler error is retried
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

pub mod dead_letter;
mod failure;
mod handle;
mod handler;
mod health;
mod message;
mod offsets;
mod replay;
mod route;
mod runtime;
mod shared;
mod source;
mod stats;

pub use crate::config::{ConsumerConfig, StartFrom};
/// The queue a message came from and where its dedup key came from: the wire contract's
/// ([`crate::wire`]), which a [`Source`] and a handler name.
pub use crate::wire::{KeySource, QueueRef};
pub(crate) use handler::LockConflict;
pub use handler::{BatchHandler, Handler, HandlerError, Transient};
pub use message::Message;
pub use runtime::Consumer;
pub use source::Source;
pub use stats::{ConsumerStats, CreditedLatency};
