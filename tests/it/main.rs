//! One integration-test binary; each module covers one area. Every test uses its own database.

mod support;
mod protocol;
mod schema;
mod relay;
#[cfg(feature = "rocketmq")]
mod rocketmq_e2e;
mod admin;
#[cfg(feature = "daemon")]
mod daemon;
