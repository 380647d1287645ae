//! The crate's error type.

use std::fmt;

/// Everything that can go wrong in the library, by kind. Each variant names what was wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A configuration key or value is wrong.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// An event field is wrong (`field` names it).
    #[error("invalid event: {field} {reason}")]
    InvalidEvent { field: &'static str, reason: String },
    /// The database refused or failed a statement.
    #[error("database error: {0}")]
    Db(#[from] mysql::Error),
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
}

impl Error {
    /// Whether trying the same call again later can succeed (a database or broker hiccup), as
    /// opposed to a caller mistake.
    pub fn is_retriable(&self) -> bool {
        match self {
            Error::Db(mysql::Error::MySqlError(me)) => !is_caller_mysql_error(me.code),
            Error::Db(mysql::Error::DriverError(d)) => matches!(
                d,
                mysql::DriverError::ConnectTimeout
                    | mysql::DriverError::CouldNotConnect(_)
                    | mysql::DriverError::Timeout
                    | mysql::DriverError::PacketOutOfSync
                    | mysql::DriverError::UnexpectedPacket
            ),
            Error::Db(mysql::Error::UrlError(_) | mysql::Error::FromValueError(_) | mysql::Error::FromRowError(_)) => {
                false
            }
            Error::Db(_) => true,
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

/// Server errors that come from the statement itself rather than the server's state
/// (syntax, unknown column/table, data too long, duplicate key, ...).
fn is_caller_mysql_error(code: u16) -> bool {
    matches!(code, 1054 | 1062 | 1064 | 1146 | 1264 | 1366 | 1406 | 1048 | 1292)
}

/// A configuration error. Every variant names the key and, where there is one, the value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// The key is not a configuration key.
    UnknownKey { key: String },
    /// The key exists but the value is not acceptable.
    InvalidValue { key: String, value: String, reason: String },
    /// Each value is fine alone, but they do not work together.
    Inconsistent { keys: Vec<String>, reason: String },
}

impl ConfigError {
    pub(crate) fn invalid(key: &str, value: impl fmt::Display, reason: impl Into<String>) -> Self {
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
