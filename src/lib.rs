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
pub mod config;
#[cfg(feature = "console")]
pub mod console;
pub mod consumer;
pub mod control;
pub mod db;
pub mod error;
pub mod event;
pub mod ffi;
mod host;
pub mod inbox;
pub mod latency;
pub mod migrate;
pub mod ordering;
pub mod publisher;
pub mod queues;
pub mod relay;
pub(crate) mod sql;
pub mod stats;
pub mod store;
pub mod telemetry;
pub mod trace;
pub mod wire;

pub use config::{Backoff, BackoffPolicy, ClaimStrategy, Config, KEYS};
pub use db::connect;
pub use error::{ConfigError, Error, Result};
pub use event::{EventId, NewEvent};
pub use migrate::{migrate, migrate_table, MigrationReport};
pub use publisher::{FailureKind, OutboundEvent, Publisher, SendError, SendOutcome};
pub use relay::{
    enqueue_in_tx, enqueue_in_tx_with, DeadLetterHook, Delivery, LatencyHook, Relay, RelayBuilder, StopReport,
};
pub use stats::{BreakerState, Stats};
pub use store::{insert_statement, DeadLetter, Gauges, ScanPosition, INSERT_PARAMS};

#[cfg(feature = "jni")]
pub mod jni;
#[cfg(feature = "rocketmq")]
pub mod rocketmq;

/// The publisher that `config.publisher` names: `None` for `publisher = none` (enqueue-only).
/// RocketMQ needs the `rocketmq` feature; without it this is a config error naming the key.
pub fn publisher_for(config: &Config) -> Result<Option<std::sync::Arc<dyn Publisher>>> {
    match config.publisher {
        config::PublisherKind::None => Ok(None),
        #[cfg(feature = "rocketmq")]
        config::PublisherKind::RocketMq => Ok(Some(std::sync::Arc::new(rocketmq::RocketMqPublisher::start(config)?))),
        #[cfg(not(feature = "rocketmq"))]
        config::PublisherKind::RocketMq => Err(ConfigError::InvalidValue {
            key: "publisher".into(),
            value: "rocketmq".into(),
            reason: "this build has no RocketMQ support (cargo feature rocketmq); use publisher=none to enqueue only"
                .into(),
        }
        .into()),
    }
}

/// Starts a relay whose publisher is chosen by `config.publisher` (what the C ABI, the JNI
/// binding and `outboxd` use).
pub fn open(config: Config, dead_letter: Option<DeadLetterHook>) -> Result<Relay> {
    open_with(config, dead_letter, None)
}

/// Like [`open`], with a hook called with each event's delivery times (what the bindings'
/// latency stats are made of).
pub fn open_with(config: Config, dead_letter: Option<DeadLetterHook>, latency: Option<LatencyHook>) -> Result<Relay> {
    // Check the whole configuration before any broker client is created.
    config.validate()?;
    if let Some(level) = config.log_level {
        log::set_max_level(level);
    }
    let publisher = publisher_for(&config)?;
    let mut b = Relay::builder(config);
    if let Some(p) = publisher {
        b = b.publisher(p);
    }
    if let Some(h) = dead_letter {
        b = b.dead_letter_hook(move |d| h(d));
    }
    if let Some(h) = latency {
        b = b.latency_hook(move |d| h(d));
    }
    b.start()
}

/// The library version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
