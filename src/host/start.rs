//! What a configuration starts: the publisher its `publisher` key names, the consumer's source,
//! and the relay itself. `lib.rs` re-exports these as the crate's face (`outbox::open`,
//! `outbox::publisher_for`, `outbox::source_for`); the hosts' operations in `host/` use them from
//! here, so no host names the RocketMQ adapter itself.

use std::sync::Arc;

use crate::config::{Config, ConsumerConfig, PublisherKind};
use crate::consumer::Source;
use crate::error::Result;
use crate::publisher::Publisher;
use crate::relay::{DeadLetterHook, LatencyHook, Relay};

/// The publisher that `config.publisher` names: `None` for `publisher = none` (enqueue-only).
/// RocketMQ needs the `rocketmq` feature; without it this is a config error naming the key.
pub fn publisher_for(config: &Config) -> Result<Option<Arc<dyn Publisher>>> {
    match config.publisher {
        PublisherKind::None => Ok(None),
        #[cfg(feature = "rocketmq")]
        PublisherKind::RocketMq => Ok(Some(Arc::new(crate::rocketmq::RocketMqPublisher::start(config)?))),
        #[cfg(not(feature = "rocketmq"))]
        PublisherKind::RocketMq => Err(crate::error::ConfigError::InvalidValue {
            key: "publisher".into(),
            value: "rocketmq".into(),
            reason: "this build has no RocketMQ support (cargo feature rocketmq); use publisher=none to enqueue only"
                .into(),
        }
        .into()),
    }
}

/// The source a consumer of `topic` reads from: RocketMQ's name server `rocketmq.namesrv` of
/// `config`, with the group, start and pull batch of `consumer`. A name server that cannot be
/// reached does not fail it (the source keeps trying). Without the `rocketmq` feature this is
/// `Error::Publisher`, saying so.
pub fn source_for(config: &Config, topic: &str, consumer: &ConsumerConfig) -> Result<Arc<dyn Source>> {
    #[cfg(feature = "rocketmq")]
    {
        use crate::rocketmq::{RocketMqSource, SourceConfig};
        let source = RocketMqSource::start(&SourceConfig::for_consumer(&config.rocketmq.namesrv, topic, consumer))?;
        Ok(Arc::new(source))
    }
    #[cfg(not(feature = "rocketmq"))]
    {
        let _ = (config, topic, consumer);
        Err(crate::error::Error::Publisher(
            "this library was built without the rocketmq feature: no consumer (build it with \
             `cargo build --features rocketmq`)"
                .into(),
        ))
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
