//! The operator console's settings (`console.*` keys of [`super::Config`]; docs/console.md): off
//! by default; when on, served by `outboxd` on a loopback address by default, reads behind a
//! read token (or open, when said so explicitly), actions behind an admin token.

/// Where the console listens when it is on and `console.listen` is not set.
pub const DEFAULT_CONSOLE_LISTEN: &str = "127.0.0.1:9470";

/// Shortest token accepted: guessing one must be out of reach.
pub const MIN_TOKEN_CHARS: usize = 16;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsoleConfig {
    /// Serve the console (`console.enabled`).
    pub enabled: bool,
    /// `host:port` (`console.listen`).
    pub listen: String,
    /// The token that lets an operator act (replay, discard, pause); `None`: the console only
    /// reads.
    pub admin_token: Option<String>,
    /// The token that lets an operator read; the admin token reads too.
    pub read_token: Option<String>,
    /// Reading needs no token at all (`console.read.open`): only on a network you trust.
    pub read_open: bool,
    /// The database holding the consumers' inbox and dead-letter tables (`console.consumer.db.url`;
    /// `None`: `db.url`). The tables are `inbox.table` and `inbox.dead_letter.table`.
    pub consumer_db_url: Option<String>,
}

impl Default for ConsoleConfig {
    /// The declared defaults of the `console.*` keys (`settings.rs`).
    fn default() -> ConsoleConfig {
        super::Config::default().console
    }
}
