//! What the host boundaries share: every operation the C ABI (`src/ffi`) and the JNI glue
//! (`src/jni`) both offer is written here once, over Rust types, and each boundary is a thin
//! adapter of its own argument and error types. Both import from here, never from each other.
//!
//! - [`error`]: [`error::HostError`], which each boundary maps once (C: a result code and a
//!   message; JNI: a Java exception);
//! - [`start`]: what a configuration starts (the publisher, the consumer's source, the relay),
//!   re-exported by `lib.rs`;
//! - [`relay`]: a started relay as the bindings hold it (dead-letter hook slot, latency stats)
//!   and its operations (start, notify, stats, stop, migrate), the insert statement, an event
//!   checked for a host's own INSERT;
//! - [`tx`]: a transaction a host runs statements through, owned by the library or a consumer's
//!   lent to a handler (execute, query, enqueue, inbox mark, commit, rollback);
//! - [`consumer`]: a consumer as the bindings hold it (start, stats, stop);
//! - [`log_level`]: log levels by number; [`log_sink`]: the library's logger and the sink its
//!   records go to (stderr, or a host's own delivery);
//! - [`owned_tx`]: a transaction that owns its pooled connection; [`statement`]: which
//!   statements would end a transaction behind the library's back.

pub(crate) mod consumer;
pub(crate) mod error;
pub(crate) mod log_level;
pub(crate) mod log_sink;
pub(crate) mod owned_tx;
pub(crate) mod relay;
pub(crate) mod start;
pub(crate) mod statement;
pub(crate) mod tx;
