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

pub mod dead_letter;
mod failure;
mod handle;
mod handler;
mod health;
mod message;
mod replay;
mod runtime;
mod shared;
mod source;
mod stats;

pub use crate::config::{ConsumerConfig, StartFrom};
/// The queue a message came from and where its dedup key came from: the wire contract's
/// ([`crate::wire`]), which a [`Source`] and a handler name.
pub use crate::wire::{KeySource, QueueRef};
pub use handler::{BatchHandler, Handler, HandlerError, Transient};
pub use message::Message;
pub use runtime::Consumer;
pub use source::Source;
pub use stats::{ConsumerStats, CreditedLatency};
