//! One integration-test binary; each module covers one area. Every test uses its own database.

mod support;
mod protocol;
mod schema;
mod relay;
mod admin;
#[cfg(feature = "daemon")]
mod daemon;
