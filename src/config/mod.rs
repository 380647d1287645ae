//! Configuration: one typed [`Config`] with defaults, the seed-compatible profile, and its checks
//! (`typed.rs`); the consumer runtime's settings (`consumer.rs`), part of it; the string keys
//! shared by the C ABI, JNI and the daemon, with their meanings (`keys.rs`); the parsers of their
//! values (`parse.rs`).

mod console;
mod consumer;
mod keys;
mod otel;
mod parse;
mod typed;

pub use console::{ConsoleConfig, DEFAULT_CONSOLE_LISTEN, MIN_TOKEN_CHARS};
pub use consumer::{
    ConsumerConfig, StartFrom, DEFAULT_BATCH_MAX, DEFAULT_DEAD_LETTER_TABLE, DEFAULT_INBOX_RETENTION,
    DEFAULT_INBOX_TABLE, MAX_BATCH_MAX, MIN_INBOX_RETENTION,
};
pub use keys::{KeyInfo, KEYS, SECRET_KEYS};
pub use otel::{OtelConfig, DEFAULT_OTEL_SERVICE_NAME};
pub use parse::redact_url;
pub(crate) use parse::table_name;
pub use typed::*;
