//! Configuration: one typed [`Config`] with defaults, the seed-compatible profile, and its checks
//! (`typed.rs`); the string keys shared by the C ABI, JNI and the daemon, with their meanings
//! (`keys.rs`); the parsers of their values (`parse.rs`).

mod keys;
mod parse;
mod typed;

pub use keys::{KeyInfo, KEYS, SECRET_KEYS};
pub use parse::redact_url;
pub(crate) use parse::table_name;
pub use typed::*;
