//! # outbox
//!
//! A transactional-outbox relay: an order service writes its order and an event row in one
//! local transaction; relays running in many instances claim committed rows through a
//! conditional UPDATE and a lease (never a distributed lock), send them to the broker, and mark
//! them sent. Failures retry with backoff and end in a dead-letter state; rows held by a crashed
//! instance come back when their lease expires. Delivery is at least once.
//!
//! The core is blocking: a scanner thread, a reclaimer thread and worker threads fed by a
//! bounded channel. The broker is behind the [`Publisher`] trait. `docs/architecture.md` maps
//! the modules, the threads and the path of one event through both halves.

pub mod admin;
mod breaker;
pub mod cancel;
pub mod config;
#[cfg(feature = "console")]
pub mod console;
pub mod consumer;
pub mod control;
pub mod db;
pub mod error;
pub mod event;
pub mod ffi;
pub mod fleet;
mod host;
pub mod inbox;
pub mod latency;
pub mod migrate;
pub mod ordering;
pub mod protocol;
pub mod publisher;
pub mod queues;
pub mod reemit;
pub mod relay;
pub(crate) mod sql;
pub mod stats;
pub mod store;
pub mod telemetry;
pub mod trace;
pub mod wire;

pub use cancel::{CancelOutcome, CancelReport};
pub use config::{Backoff, BackoffPolicy, ClaimStrategy, Config, SentRows, KEYS};
pub use db::connect;
pub use error::{ConfigError, Error, Result};
pub use event::{EventId, NewEvent, Schedule, MAX_SCHEDULE_AHEAD};
pub use fleet::{Coordination, Fleet, FleetChange, ShardState, ShardView};
pub use host::start::{open, open_with, publisher_for, source_for};
pub use migrate::{migrate, migrate_consumer, migrate_table, MigrationReport};
pub use protocol::SCHEDULED_SQL;
pub use publisher::{FailureKind, OutboundEvent, Publisher, SendError, SendOutcome};
pub use relay::{
    enqueue_in_tx, enqueue_in_tx_with, DeadLetterHook, Delivery, LatencyHook, Relay, RelayBuilder, StopReport,
};
pub use stats::{BreakerState, Stats};
pub use store::{
    insert_scheduled_statement, insert_statement, DeadLetter, Gauges, ScanPosition, INSERT_PARAMS,
    INSERT_SCHEDULED_PARAMS,
};

#[cfg(feature = "jni")]
pub mod jni;
#[cfg(feature = "rocketmq")]
pub mod rocketmq;

/// The library version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
