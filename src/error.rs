//! The crate's error type.

use std::fmt;

/// The message of a caught panic: its `&str` or `String` payload (others are named as such).
/// Pass the payload itself (`&*boxed`), not the `Box`, which is an `Any` of its own.
pub(crate) fn panic_message(p: &(dyn std::any::Any + Send)) -> &str {
    p.downcast_ref::<&str>()
        .copied()
        .or_else(|| p.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("non-string panic payload")
}

/// Everything that can go wrong in the library, by kind. Each variant names what was wrong.
/// New kinds may be added: a `match` outside the crate needs a `_` arm.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A configuration key or value is wrong.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// An event field is wrong (`field` names it).
    #[error("invalid event: {field} {reason}")]
    InvalidEvent { field: &'static str, reason: String },
    /// The database refused or failed a statement, or could not be reached.
    #[error("{}", describe_db(.0))]
    Db(#[from] mysql::Error),
    /// No pooled connection became free in time (`db.pool.wait.ms`).
    #[error(
        "no database connection became free within {waited_ms} ms: all {pool_max} connections of db.pool.max are in use; finish other transactions, raise db.pool.max or db.pool.wait.ms"
    )]
    PoolTimeout { waited_ms: u64, pool_max: usize },
    /// A migration could not be applied; or, with `version` 0, the schema is not what the relay
    /// needs (a table that was not migrated): `description` names the table and column,
    /// `reason` what it is, what it must be and the fix.
    #[error("{}", migration_message(*version, description, reason))]
    Migration {
        version: u32,
        description: String,
        reason: String,
    },
    /// The relay was already stopped.
    #[error("the relay is stopped")]
    Stopped,
    /// A broker client could not be created or started.
    #[error("publisher error: {0}")]
    Publisher(String),
    /// The operating system refused to start one of the library's threads (`name`): too many
    /// threads in the process or the system, or not enough memory. Not retriable: the limit or
    /// the settings that size the thread pools (`workers`, `consumer.threads`) must change.
    #[error("could not start thread {name}: {source}")]
    Thread {
        name: String,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// Whether this is a database deadlock or lock wait timeout ([`is_lock_conflict`]).
    pub fn is_lock_conflict(&self) -> bool {
        matches!(self, Error::Db(e) if is_lock_conflict(e))
    }

    /// Whether trying the same call again later can succeed because the failure was transient
    /// (connection refused or reset, timeouts, lock wait timeout, deadlock, server gone, a busy
    /// pool, a broker hiccup), as opposed to a caller mistake or a setting that stays wrong
    /// (access denied, unknown database, syntax, bad URL...).
    pub fn is_retriable(&self) -> bool {
        match self {
            Error::Db(e) => is_transient_db_error(e),
            Error::PoolTimeout { .. } => true,
            Error::Publisher(_) => true,
            _ => false,
        }
    }
}

fn migration_message(version: u32, description: &str, reason: &str) -> String {
    if version == 0 {
        format!("{description}: {reason}")
    } else {
        format!("migration {version} ({description}) failed: {reason}")
    }
}

/// Whether a database error is a lock conflict: a deadlock (1213) or a lock wait timeout (1205).
/// Transient, and a batch that meets one may go through whole once the other transaction has
/// moved on.
pub fn is_lock_conflict(e: &mysql::Error) -> bool {
    matches!(e, mysql::Error::MySqlError(me) if me.code == 1205 || me.code == 1213)
}

/// Whether a database error is transient (see [`Error::is_retriable`]).
pub fn is_transient_db_error(e: &mysql::Error) -> bool {
    match e {
        mysql::Error::MySqlError(me) => is_transient_mysql_code(me.code),
        mysql::Error::DriverError(d) => matches!(
            d,
            mysql::DriverError::ConnectTimeout
                | mysql::DriverError::CouldNotConnect(_)
                | mysql::DriverError::Timeout
                | mysql::DriverError::PacketOutOfSync
                | mysql::DriverError::UnexpectedPacket
                | mysql::DriverError::PoisonedPoolMutex
        ),
        // The connection broke (reset, refused, closed mid-packet).
        mysql::Error::IoError(_) | mysql::Error::CodecError(_) => true,
        _ => false,
    }
}

/// Server errors that come from the server's state at the time, not from the request or the
/// account: trying again later can succeed.
fn is_transient_mysql_code(code: u16) -> bool {
    matches!(
        code,
        1040 // too many connections
            | 1053 // server shutdown in progress
            | 1205 // lock wait timeout
            | 1213 // deadlock
            | 1158
            ..=1161 // network read/write errors and timeouts
            | 1180 // error during COMMIT
            | 1203 // user has too many connections
            | 1226 // user resource limit reached
            | 1290 // --read-only (fail-over in progress)
            | 1317 // query interrupted
            | 1836 // read-only mode
            | 1927 // connection killed (MariaDB)
            | 1969 // statement timeout (MariaDB)
            | 2002 | 2003 | 2006 | 2013 // cannot connect, server gone, lost connection
            | 3024 // query execution time exceeded (MySQL)
            | 4031 // disconnected by the server for inactivity (MySQL)
    )
}

/// A database error in words, for people: the server's own message and code, or what went
/// wrong with the connection, without the driver's debug text.
pub fn describe_db(e: &mysql::Error) -> String {
    match e {
        mysql::Error::MySqlError(me) => {
            let what = match me.code {
                1045 => "access denied (check the user and password of db.url)",
                1044 => "access denied to the database (grant the user access)",
                1049 => "unknown database (create it, or fix the database name in db.url)",
                1146 => "the table does not exist (run the migrations first)",
                1205 => "lock wait timeout (retriable)",
                1213 => "deadlock (retriable)",
                _ => "",
            };
            let message = me.message.trim();
            if what.is_empty() {
                format!("database error {} (SQLSTATE {}): {message}", me.code, me.state)
            } else {
                format!("database error {} (SQLSTATE {}): {what}: {message}", me.code, me.state)
            }
        }
        mysql::Error::DriverError(d) => match d {
            mysql::DriverError::CouldNotConnect(Some((addr, desc, _))) => {
                format!("database error: cannot connect to {addr}: {desc}")
            }
            mysql::DriverError::CouldNotConnect(None) => "database error: cannot connect: no address given".into(),
            mysql::DriverError::ConnectTimeout => "database error: cannot connect: the connection timed out".into(),
            mysql::DriverError::Timeout => "database error: the database did not answer in time".into(),
            other => format!("database error: {}", lowercase_first(&other.to_string())),
        },
        mysql::Error::IoError(io) => format!("database error: the connection failed: {io}"),
        mysql::Error::CodecError(c) => format!("database error: the connection failed: {c}"),
        mysql::Error::UrlError(u) => format!("database error: bad database URL: {}", describe_url_error(u)),
        other => format!("database error: {}", lowercase_first(&other.to_string())),
    }
}

/// A `mysql://` URL problem in words.
pub fn describe_url_error(e: &mysql::UrlError) -> String {
    match e {
        mysql::UrlError::ParseError(p) => format!("{p} (expected mysql://user:password@host:port/database)"),
        mysql::UrlError::UnsupportedScheme(s) => format!("scheme {s:?} is not supported (use mysql://)"),
        mysql::UrlError::UnknownParameter(p) => format!("unknown URL parameter {p:?}"),
        mysql::UrlError::InvalidValue(p, v) => format!("invalid value {v:?} for URL parameter {p:?}"),
        mysql::UrlError::BadUrl => {
            "invalid or incomplete URL (expected mysql://user:password@host:port/database)".into()
        }
        other => lowercase_first(&other.to_string()),
    }
}

fn lowercase_first(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_lowercase().chain(c).collect(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(code: u16, state: &str, message: &str) -> Error {
        Error::Db(mysql::Error::MySqlError(mysql::MySqlError {
            state: state.into(),
            message: message.into(),
            code,
        }))
    }

    #[test]
    fn access_denied_and_unknown_database_are_not_retriable() {
        let denied = server(
            1045,
            "28000",
            "Access denied for user 'x'@'localhost' (using password: YES)",
        );
        assert!(!denied.is_retriable());
        assert!(!server(1049, "42000", "Unknown database 'nope'").is_retriable());
        assert!(!server(1044, "42000", "Access denied for user").is_retriable());
        assert!(!server(1064, "42000", "syntax").is_retriable());
        assert!(!server(1146, "42S02", "Table 'x.y' doesn't exist").is_retriable());
        let text = denied.to_string();
        assert!(text.contains("access denied") && text.contains("1045"), "{text}");
        assert!(!text.contains("MySqlError"), "{text}");
    }

    #[test]
    fn transient_errors_are_retriable() {
        for code in [1205, 1213, 2006, 2013, 1040, 1927] {
            assert!(server(code, "HY000", "x").is_retriable(), "{code}");
        }
        let refused = Error::Db(mysql::Error::IoError(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )));
        assert!(refused.is_retriable());
        assert!(Error::PoolTimeout {
            waited_ms: 5,
            pool_max: 1
        }
        .is_retriable());
    }

    #[test]
    fn a_thread_that_cannot_start_says_so_and_is_not_retriable() {
        let e = Error::Thread {
            name: "outbox-worker-0".into(),
            source: std::io::Error::from(std::io::ErrorKind::WouldBlock),
        };
        assert!(!e.is_retriable());
        let text = e.to_string();
        assert!(text.starts_with("could not start thread outbox-worker-0: "), "{text}");
        assert!(!text.contains("publisher"), "{text}");
    }

    #[test]
    fn url_errors_read_as_words() {
        let e = mysql::Opts::from_url("mysql://root@127.0.0.1:99999/x").unwrap_err();
        let text = Error::Db(e.into()).to_string();
        assert!(!text.contains("ParseError {"), "{text}");
        assert!(text.contains("bad database URL") && text.contains("port"), "{text}");
    }
}

/// A configuration error. Every variant names the key and, where there is one, the value.
/// New kinds may be added: a `match` outside the crate needs a `_` arm.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// The key is not a configuration key.
    UnknownKey { key: String },
    /// The key exists but the value is not acceptable.
    InvalidValue { key: String, value: String, reason: String },
    /// Each value is fine alone, but they do not work together.
    Inconsistent { keys: Vec<String>, reason: String },
}

impl ConfigError {
    /// An invalid value of `key`, and why.
    pub fn invalid(key: &str, value: impl fmt::Display, reason: impl Into<String>) -> Self {
        ConfigError::InvalidValue {
            key: key.to_string(),
            value: value.to_string(),
            reason: reason.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::UnknownKey { key } => write!(f, "unknown configuration key {key:?}"),
            ConfigError::InvalidValue { key, value, reason } => {
                write!(f, "invalid value {value:?} for {key}: {reason}")
            }
            ConfigError::Inconsistent { keys, reason } => {
                write!(f, "inconsistent configuration ({}): {reason}", keys.join(", "))
            }
        }
    }
}

impl std::error::Error for ConfigError {}

pub type Result<T, E = Error> = std::result::Result<T, E>;
