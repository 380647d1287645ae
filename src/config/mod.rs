//! Configuration: every key declared once, with its field, kind, default, reader and meaning
//! (`settings.rs`); what a declared key is and how `Config::set`/`get` use it (`keys.rs`); the
//! kinds of values with their checks (`kinds.rs`, on the parsers of `parse.rs`); the typed
//! [`Config`], the seed-compatible profile and the checks across keys (`typed.rs`); the consumer
//! runtime's, the console's and the span exporter's settings, parts of it (`consumer.rs`,
//! `console.rs`, `otel.rs`); `outboxd config example` and the README's table of keys, generated
//! from the declarations (`reference.rs`).

mod console;
mod consumer;
mod keys;
mod kinds;
mod otel;
mod parse;
mod reference;
mod settings;
mod shards;
mod typed;

pub use console::{ConsoleConfig, DEFAULT_CONSOLE_LISTEN, MIN_TOKEN_CHARS};
pub use consumer::{
    ConsumerConfig, Route, StartFrom, DEFAULT_BATCH_MAX, DEFAULT_DEAD_LETTER_TABLE, DEFAULT_INBOX_RETENTION,
    DEFAULT_INBOX_TABLE, MAX_BATCH_MAX, MIN_INBOX_RETENTION,
};
pub use keys::{setting, KeyInfo, Reader, Setting, KEYS, SECRET_KEYS};
pub use kinds::Redaction;
pub use otel::{OtelConfig, DEFAULT_OTEL_SERVICE_NAME};
pub use parse::redact_url;
pub(crate) use parse::table_name;
pub use reference::{example_toml, reference_table};
pub use shards::{expand_shards, redact_shards, ShardSpec, MAX_SHARDS};
pub use typed::*;
