//! [`HostError`]: why a host operation failed, in terms each boundary maps once to its own
//! world (the C ABI: an `outbox_result` code and a message; JNI: a Java exception).

use crate::error::{ConfigError, Error};

/// Why a host operation failed: an error of the core, or one of the few cases only a host
/// meets (an argument, a transaction in the wrong state).
#[derive(Debug)]
pub(crate) enum HostError {
    /// An error of the core (configuration, event, database, broker, stopped relay, thread).
    Core(Error),
    /// An argument that is not usable: a log level out of range, a value that is not a whole
    /// number, a statement parameter of an unknown kind.
    InvalidArgument(String),
    /// A statement that would end the transaction behind the library's back; `statement` is its
    /// first words in upper case. `lent`: on a consumer's transaction (where DDL, which commits
    /// implicitly, is refused too).
    EndsTransaction { statement: String, lent: bool },
    /// An operation only a library-owned transaction allows (`commit`, `rollback`, `enqueue`),
    /// asked of a consumer's transaction, which only the consumer ends and which belongs to no
    /// relay.
    ConsumerTx(&'static str),
    /// The transaction was already committed or rolled back.
    TxFinished,
}

pub(crate) type HostResult<T> = Result<T, HostError>;

impl From<Error> for HostError {
    fn from(e: Error) -> Self {
        HostError::Core(e)
    }
}

impl From<ConfigError> for HostError {
    fn from(e: ConfigError) -> Self {
        HostError::Core(Error::Config(e))
    }
}

impl From<mysql::Error> for HostError {
    fn from(e: mysql::Error) -> Self {
        HostError::Core(Error::Db(e))
    }
}

impl HostError {
    /// Whether this is a transient database or broker failure (see [`Error::is_retriable`]).
    pub(crate) fn is_retriable(&self) -> bool {
        matches!(self, HostError::Core(e) if e.is_retriable())
    }

    /// Whether this is a deadlock or a lock wait timeout (see [`Error::is_lock_conflict`]).
    pub(crate) fn is_lock_conflict(&self) -> bool {
        matches!(self, HostError::Core(e) if e.is_lock_conflict())
    }
}
