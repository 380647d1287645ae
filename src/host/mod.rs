//! What the host boundaries share: the C ABI (`src/ffi`) and the JNI glue (`src/jni`)
//! both import from here, never from each other.
//!
//! - [`owned_tx`]: a transaction that owns its pooled connection (the library-owned
//!   transactions of C, Go and Java hosts);
//! - [`log_sink`]: the library's logger and the sink its records go to (stderr, or a host's own
//!   delivery);
//! - [`statement`]: which statements would end a transaction behind the library's back.

pub(crate) mod log_sink;
pub(crate) mod owned_tx;
pub(crate) mod statement;
