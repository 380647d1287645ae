//! [`outbox_result`]: the code every fallible exported function returns, with stable values,
//! and what each means.

use std::ffi::{c_int, CStr};

/// The result of every fallible function. The values are stable: new codes are only ever
/// added, never renumbered.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum outbox_result {
    /// Success.
    OUTBOX_OK = 0,
    /// A required pointer argument was NULL.
    OUTBOX_ERR_NULL_ARGUMENT = 1,
    /// A string argument was not valid UTF-8.
    OUTBOX_ERR_INVALID_UTF8 = 2,
    /// `outbox_conf_set`: the key is not a configuration key.
    OUTBOX_ERR_UNKNOWN_KEY = 3,
    /// A configuration value is not acceptable for its key (the message names both).
    OUTBOX_ERR_INVALID_VALUE = 4,
    /// Configuration values are fine alone but do not work together (found at start).
    OUTBOX_ERR_INCONSISTENT_CONFIG = 5,
    /// An event field is wrong (the message names the field).
    OUTBOX_ERR_INVALID_EVENT = 6,
    /// Some other argument is wrong (parameter kind, parameter count, ...).
    OUTBOX_ERR_INVALID_ARGUMENT = 7,
    /// The database could not be reached or failed; trying again later may succeed.
    OUTBOX_ERR_DATABASE = 8,
    /// The database refused the statement itself (syntax, unknown column, duplicate key, ...).
    OUTBOX_ERR_STATEMENT = 9,
    /// A schema migration could not be applied.
    OUTBOX_ERR_MIGRATION = 10,
    /// The relay or the consumer has been stopped (`outbox_stop`, `outbox_consumer_stop`); the call
    /// is not allowed any more.
    OUTBOX_ERR_STOPPED = 11,
    /// The broker client could not be created or started.
    OUTBOX_ERR_PUBLISHER = 12,
    /// `outbox_stop`: the deadline passed before every relay thread ended.
    OUTBOX_ERR_TIMED_OUT = 13,
    /// The output buffer is too small; `*out_needed` says how many bytes are needed.
    OUTBOX_ERR_BUFFER_TOO_SMALL = 14,
    /// The transaction was already committed or rolled back.
    OUTBOX_ERR_TX_FINISHED = 15,
    /// The database refused the connection or the account, and will until a setting changes:
    /// access denied (1045), unknown database (1049), bad `db.url`. Not retriable.
    OUTBOX_ERR_DATABASE_REFUSED = 16,
    /// `outbox_tx_begin`: no pool connection became free within `db.pool.wait.ms`. Retriable.
    OUTBOX_ERR_POOL_TIMEOUT = 17,
    /// The system refused what the call needs: a thread of the relay or the consumer could not
    /// be started (too many threads or processes, not enough memory). Not retriable as such:
    /// raise the limit, or stop something else first.
    OUTBOX_ERR_RESOURCE = 18,
    /// A bug: the library panicked. The object involved should not be used again (only freed).
    OUTBOX_ERR_PANIC = 99,
}

use outbox_result::*;

impl outbox_result {
    pub(super) const ALL: [outbox_result; 20] = [
        OUTBOX_OK,
        OUTBOX_ERR_NULL_ARGUMENT,
        OUTBOX_ERR_INVALID_UTF8,
        OUTBOX_ERR_UNKNOWN_KEY,
        OUTBOX_ERR_INVALID_VALUE,
        OUTBOX_ERR_INCONSISTENT_CONFIG,
        OUTBOX_ERR_INVALID_EVENT,
        OUTBOX_ERR_INVALID_ARGUMENT,
        OUTBOX_ERR_DATABASE,
        OUTBOX_ERR_STATEMENT,
        OUTBOX_ERR_MIGRATION,
        OUTBOX_ERR_STOPPED,
        OUTBOX_ERR_PUBLISHER,
        OUTBOX_ERR_TIMED_OUT,
        OUTBOX_ERR_BUFFER_TOO_SMALL,
        OUTBOX_ERR_TX_FINISHED,
        OUTBOX_ERR_DATABASE_REFUSED,
        OUTBOX_ERR_POOL_TIMEOUT,
        OUTBOX_ERR_RESOURCE,
        OUTBOX_ERR_PANIC,
    ];

    pub(crate) fn from_code(code: c_int) -> Option<outbox_result> {
        Self::ALL.into_iter().find(|r| *r as c_int == code)
    }

    /// A static, NUL-terminated description.
    pub(super) fn description(self) -> &'static CStr {
        match self {
            OUTBOX_OK => c"success",
            OUTBOX_ERR_NULL_ARGUMENT => c"a required pointer argument was NULL",
            OUTBOX_ERR_INVALID_UTF8 => c"a string argument is not valid UTF-8",
            OUTBOX_ERR_UNKNOWN_KEY => c"unknown configuration key",
            OUTBOX_ERR_INVALID_VALUE => c"invalid configuration value",
            OUTBOX_ERR_INCONSISTENT_CONFIG => c"inconsistent configuration",
            OUTBOX_ERR_INVALID_EVENT => c"invalid event",
            OUTBOX_ERR_INVALID_ARGUMENT => c"invalid argument",
            OUTBOX_ERR_DATABASE => c"database unavailable or failed (retriable)",
            OUTBOX_ERR_STATEMENT => c"the database refused the statement",
            OUTBOX_ERR_MIGRATION => c"schema migration failed",
            OUTBOX_ERR_STOPPED => c"stopped: the relay or consumer was stopped or closed",
            OUTBOX_ERR_PUBLISHER => c"publisher (broker client) error",
            OUTBOX_ERR_TIMED_OUT => c"timed out",
            OUTBOX_ERR_BUFFER_TOO_SMALL => c"output buffer too small",
            OUTBOX_ERR_TX_FINISHED => c"the transaction is already committed or rolled back",
            OUTBOX_ERR_DATABASE_REFUSED => {
                c"the database refused the connection (access denied, unknown database, bad URL)"
            }
            OUTBOX_ERR_POOL_TIMEOUT => c"no database connection became free in time (retriable)",
            OUTBOX_ERR_RESOURCE => c"the system refused a resource (a thread could not be started)",
            OUTBOX_ERR_PANIC => c"internal error (the library panicked)",
        }
    }

    pub(crate) fn is_retriable(self) -> bool {
        matches!(
            self,
            OUTBOX_ERR_DATABASE | OUTBOX_ERR_PUBLISHER | OUTBOX_ERR_POOL_TIMEOUT
        )
    }
}
