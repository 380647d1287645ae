//! One integration-test binary; each module covers one area. Every test uses its own database.

mod admin;
mod bad_input;
mod cancel;
mod conformance;
#[cfg(feature = "console")]
mod console;
mod consumer;
#[cfg(feature = "rocketmq")]
mod consumer_e2e;
mod control;
#[cfg(feature = "daemon")]
mod daemon;
mod event_key;
mod fleet;
mod fleet_catalog;
mod fleet_profiles;
mod fleet_share;
mod inbox;
mod ordering;
mod protocol;
mod proxy;
mod reemit;
mod relay;
#[cfg(feature = "rocketmq")]
mod rocketmq_e2e;
mod schedule;
mod schema;
mod stall;
#[cfg(feature = "rocketmq")]
mod stalled_broker;
mod support;
#[cfg(feature = "otel")]
mod tracing;
#[cfg(feature = "rocketmq")]
mod two_brokers;
