//! The C ABI: a thin layer of argument checks, casts and error mapping over the Rust API.
//! The core knows nothing of it. `include/outbox.h` is generated from this module by cbindgen
//! (`cbindgen.toml`) and committed; `tests/header.rs` fails when the two drift apart.
//!
//! Rules every exported function follows:
//! - its body runs inside [`ffi_boundary!`]: pointer arguments named there are checked for NULL
//!   first, and a panic never crosses into C (it becomes `OUTBOX_ERR_PANIC`);
//! - results are [`outbox_result`] codes with explicit, stable values;
//! - outputs are written only when the call succeeds;
//! - strings are NUL-terminated UTF-8, and invalid UTF-8 is `OUTBOX_ERR_INVALID_UTF8`;
//! - payloads and strings are copied before the call returns;
//! - every object the library allocates is freed by its own `*_free`, once; `*_free(NULL)` is a
//!   no-op.

// The C names are the ABI: snake_case types, SCREAMING_CASE constants.
#![allow(non_camel_case_types)]
// Every function takes raw pointers from C; its documented contract (which goes into the
// header) is the safety contract, as in rustls-ffi.
#![allow(clippy::missing_safety_doc)]

use crate::error::panic_message;
use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

mod conf;
mod consumer;
mod event;
mod logging;
mod relay;
mod tx;

pub use conf::*;
pub use consumer::*;
pub use event::*;
pub use logging::*;
pub use relay::*;
pub use tx::*;

/// The host's callback context; the host promises it may be used from any thread.
#[derive(Clone, Copy)]
pub(crate) struct UserData(pub *mut c_void);
// SAFETY: `outbox_conf_set_dead_letter_cb` documents that the callback and its user data are
// used from relay threads; the host accepts that by setting them.
unsafe impl Send for UserData {}
unsafe impl Sync for UserData {}

impl UserData {
    /// The pointer (a method, so a closure captures the whole `UserData`, which is `Send + Sync`).
    pub(crate) fn ptr(self) -> *mut c_void {
        self.0
    }
}

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
    /// The relay has been stopped (`outbox_stop`); the call is not allowed any more.
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
    /// A bug: the library panicked. The object involved should not be used again (only freed).
    OUTBOX_ERR_PANIC = 99,
}

use outbox_result::*;

impl outbox_result {
    const ALL: [outbox_result; 19] = [
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
        OUTBOX_ERR_PANIC,
    ];

    fn from_code(code: c_int) -> Option<outbox_result> {
        Self::ALL.into_iter().find(|r| *r as c_int == code)
    }

    /// A static, NUL-terminated description.
    fn description(self) -> &'static CStr {
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
            OUTBOX_ERR_STOPPED => c"the relay is stopped",
            OUTBOX_ERR_PUBLISHER => c"publisher (broker client) error",
            OUTBOX_ERR_TIMED_OUT => c"timed out",
            OUTBOX_ERR_BUFFER_TOO_SMALL => c"output buffer too small",
            OUTBOX_ERR_TX_FINISHED => c"the transaction is already committed or rolled back",
            OUTBOX_ERR_DATABASE_REFUSED => {
                c"the database refused the connection (access denied, unknown database, bad URL)"
            }
            OUTBOX_ERR_POOL_TIMEOUT => c"no database connection became free in time (retriable)",
            OUTBOX_ERR_PANIC => c"internal error (the library panicked)",
        }
    }

    fn is_retriable(self) -> bool {
        matches!(
            self,
            OUTBOX_ERR_DATABASE | OUTBOX_ERR_PUBLISHER | OUTBOX_ERR_POOL_TIMEOUT
        )
    }
}

/// A failed call: the code returned to C and the message kept for `outbox_last_error`.
#[derive(Debug)]
pub(crate) struct Failure {
    pub code: outbox_result,
    pub message: String,
}

impl Failure {
    pub fn new(code: outbox_result, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
        }
    }

    pub fn null(arg: &str) -> Failure {
        Failure::new(OUTBOX_ERR_NULL_ARGUMENT, format!("argument `{arg}` is NULL"))
    }
}

impl From<crate::Error> for Failure {
    fn from(e: crate::Error) -> Failure {
        use crate::{ConfigError, Error};
        let code = match &e {
            Error::Config(ConfigError::UnknownKey { .. }) => OUTBOX_ERR_UNKNOWN_KEY,
            Error::Config(ConfigError::InvalidValue { .. }) => OUTBOX_ERR_INVALID_VALUE,
            Error::Config(ConfigError::Inconsistent { .. }) => OUTBOX_ERR_INCONSISTENT_CONFIG,
            Error::InvalidEvent { .. } => OUTBOX_ERR_INVALID_EVENT,
            // Driver errors about the parameters are the caller's mistake, not the database's.
            Error::Db(mysql::Error::DriverError(
                mysql::DriverError::MismatchedStmtParams(..)
                | mysql::DriverError::MixedParams
                | mysql::DriverError::Params(_),
            )) => OUTBOX_ERR_INVALID_ARGUMENT,
            Error::Db(_) if e.is_retriable() => OUTBOX_ERR_DATABASE,
            Error::Db(db) if is_refusal(db) => OUTBOX_ERR_DATABASE_REFUSED,
            Error::Db(_) => OUTBOX_ERR_STATEMENT,
            Error::PoolTimeout { .. } => OUTBOX_ERR_POOL_TIMEOUT,
            Error::Migration { .. } => OUTBOX_ERR_MIGRATION,
            Error::Stopped => OUTBOX_ERR_STOPPED,
            Error::Publisher(_) => OUTBOX_ERR_PUBLISHER,
        };
        Failure::new(code, e.to_string())
    }
}

/// A lasting refusal of the connection or the account (not of one statement).
fn is_refusal(e: &mysql::Error) -> bool {
    match e {
        // access denied (db, user, unix socket), host not allowed/blocked, auth protocol, unknown db
        mysql::Error::MySqlError(me) => matches!(me.code, 1044 | 1045 | 1049 | 1129 | 1130 | 1251 | 1698),
        mysql::Error::UrlError(_) => true,
        mysql::Error::DriverError(d) => !matches!(
            d,
            mysql::DriverError::MismatchedStmtParams(..)
                | mysql::DriverError::MixedParams
                | mysql::DriverError::Params(_)
        ),
        _ => false,
    }
}

impl From<crate::ConfigError> for Failure {
    fn from(e: crate::ConfigError) -> Failure {
        crate::Error::Config(e).into()
    }
}

impl From<mysql::Error> for Failure {
    fn from(e: mysql::Error) -> Failure {
        crate::Error::Db(e).into()
    }
}

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

fn set_last_error(message: &str) {
    LAST_ERROR.with(|m| {
        let mut m = m.borrow_mut();
        m.clear();
        m.push_str(message);
    });
}

/// Runs the body of an exported function that returns an [`outbox_result`]: a panic becomes
/// `OUTBOX_ERR_PANIC`, a [`Failure`] its code (its message kept for `outbox_last_error`).
pub(crate) fn boundary(f: impl FnOnce() -> Result<(), Failure>) -> outbox_result {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => OUTBOX_OK,
        Ok(Err(failure)) => {
            set_last_error(&failure.message);
            failure.code
        }
        Err(panic) => {
            let msg = format!("internal error: {}", panic_message(&*panic));
            set_last_error(&msg);
            OUTBOX_ERR_PANIC
        }
    }
}

/// Runs the body of an exported function that returns a value: a panic yields `fallback`.
pub(crate) fn boundary_value<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(panic) => {
            let msg = format!("internal error: {}", panic_message(&*panic));
            set_last_error(&msg);
            fallback
        }
    }
}

/// The one boundary of every exported function: checks the named pointer arguments for NULL,
/// then runs the body with panics caught.
///
/// - `ffi_boundary!(nonnull(a, b) { body })`: the body returns `Result<(), Failure>`, the
///   function returns [`outbox_result`];
/// - `ffi_boundary!(fallback = v, nonnull(a) { body })`: the body returns a value, the function
///   returns it, or `v` when an argument is NULL or the body panics;
/// - `ffi_boundary!(void, nonnull(a) { body })`: for functions returning nothing (a NULL
///   argument makes them a no-op).
macro_rules! ffi_boundary {
    (nonnull($($arg:ident),*) $body:block) => {
        $crate::ffi::boundary(|| {
            $(if $arg.is_null() {
                return Err($crate::ffi::Failure::null(stringify!($arg)));
            })*
            $body
        })
    };
    (void, nonnull($($arg:ident),*) $body:block) => {
        $crate::ffi::boundary_value((), || {
            $(if $arg.is_null() {
                return;
            })*
            $body
        })
    };
    (fallback = $fallback:expr, nonnull($($arg:ident),*) $body:block) => {
        $crate::ffi::boundary_value($fallback, || {
            $(if $arg.is_null() {
                return $fallback;
            })*
            $body
        })
    };
}
pub(crate) use ffi_boundary;

/// A NUL-terminated UTF-8 string argument. NULL and invalid UTF-8 are errors naming `arg`.
pub(crate) unsafe fn arg_str<'a>(p: *const c_char, arg: &str) -> Result<&'a str, Failure> {
    if p.is_null() {
        return Err(Failure::null(arg));
    }
    CStr::from_ptr(p).to_str().map_err(|e| {
        Failure::new(
            OUTBOX_ERR_INVALID_UTF8,
            format!(
                "argument `{arg}` is not valid UTF-8 (invalid byte at offset {})",
                e.valid_up_to()
            ),
        )
    })
}

/// Like [`arg_str`], NULL meaning absent.
pub(crate) unsafe fn arg_opt_str<'a>(p: *const c_char, arg: &str) -> Result<Option<&'a str>, Failure> {
    if p.is_null() {
        Ok(None)
    } else {
        arg_str(p, arg).map(Some)
    }
}

/// A `(pointer, length)` array argument; NULL is allowed only with length 0.
pub(crate) unsafe fn arg_slice<'a, T>(p: *const T, len: usize, arg: &str) -> Result<&'a [T], Failure> {
    if len == 0 {
        Ok(&[])
    } else if p.is_null() {
        Err(Failure::new(
            OUTBOX_ERR_NULL_ARGUMENT,
            format!("argument `{arg}` is NULL but its length is {len}"),
        ))
    } else {
        Ok(std::slice::from_raw_parts(p, len))
    }
}

/// Writes `message` into a caller's `errstr` buffer of `size` bytes, truncated at a character
/// boundary and always NUL-terminated. Nothing is written when `errstr` is NULL or `size` is 0.
pub(crate) unsafe fn write_errstr(errstr: *mut c_char, size: usize, message: &str) {
    if errstr.is_null() || size == 0 {
        return;
    }
    let mut n = message.len().min(size - 1);
    while !message.is_char_boundary(n) {
        n -= 1;
    }
    std::ptr::copy_nonoverlapping(message.as_ptr(), errstr.cast::<u8>(), n);
    *errstr.add(n) = 0;
}

/// Copies `s` and a NUL into `buf` of `len` bytes. `*needed` (required) receives
/// `strlen(s) + 1` on success and on `OUTBOX_ERR_BUFFER_TOO_SMALL`; `buf` is written only on
/// success and may be NULL when `len` is 0.
pub(crate) unsafe fn write_string_out(
    s: &str,
    buf: *mut c_char,
    len: usize,
    needed: *mut usize,
) -> Result<(), Failure> {
    if needed.is_null() {
        return Err(Failure::null("out_needed"));
    }
    if buf.is_null() && len > 0 {
        return Err(Failure::null("buf"));
    }
    let want = s.len() + 1;
    *needed = want;
    if len < want {
        return Err(Failure::new(
            OUTBOX_ERR_BUFFER_TOO_SMALL,
            format!("the buffer holds {len} bytes, {want} are needed"),
        ));
    }
    std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), s.len());
    *buf.add(s.len()) = 0;
    Ok(())
}

/// Runs `f`; on failure also writes the message into `errstr`.
pub(crate) unsafe fn with_errstr(
    errstr: *mut c_char,
    errstr_size: usize,
    f: impl FnOnce() -> Result<(), Failure>,
) -> Result<(), Failure> {
    let r = f();
    if let Err(failure) = &r {
        write_errstr(errstr, errstr_size, &failure.message);
    }
    r
}

/// The library version, a static NUL-terminated string such as `"0.1.0"`.
///
/// Thread safety: safe from any thread.
#[no_mangle]
pub extern "C" fn outbox_version() -> *const c_char {
    const V: &CStr = match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
        Ok(v) => v,
        Err(_) => panic!("the version has no NUL"),
    };
    V.as_ptr()
}

/// A static, NUL-terminated English description of a result code; never NULL (an unknown code
/// yields "unknown result code").
///
/// Thread safety: safe from any thread.
#[no_mangle]
pub extern "C" fn outbox_result_str(code: c_int) -> *const c_char {
    ffi_boundary!(fallback = c"unknown result code".as_ptr(), nonnull() {
        match outbox_result::from_code(code) {
            Some(r) => r.description().as_ptr(),
            None => c"unknown result code".as_ptr(),
        }
    })
}

/// Whether a call that failed with `code` may succeed if tried again later (a database or
/// broker hiccup) rather than being the caller's mistake. False for `OUTBOX_OK` and unknown
/// codes.
///
/// Thread safety: safe from any thread.
#[no_mangle]
pub extern "C" fn outbox_result_is_retriable(code: c_int) -> bool {
    ffi_boundary!(fallback = false, nonnull() {
        outbox_result::from_code(code).is_some_and(outbox_result::is_retriable)
    })
}

/// Copies the message of the most recent failed call made *on this thread* into `buf` (see
/// `out_needed` conventions of `outbox_stats`). The message names what was wrong, e.g. the
/// database's own error text. It is only meaningful right after a call returned an error;
/// successful calls leave it as it was. A failure of this call itself does not replace it.
///
/// Thread safety: safe from any thread; each thread has its own message.
#[no_mangle]
pub unsafe extern "C" fn outbox_last_error(buf: *mut c_char, len: usize, out_needed: *mut usize) -> outbox_result {
    // Not through `boundary`: a failure here must not overwrite the message it reports.
    let r = catch_unwind(AssertUnwindSafe(|| {
        LAST_ERROR.with(|m| write_string_out(&m.borrow(), buf, len, out_needed))
    }));
    match r {
        Ok(Ok(())) => OUTBOX_OK,
        Ok(Err(f)) => f.code,
        Err(_) => OUTBOX_ERR_PANIC,
    }
}

#[cfg(test)]
mod fuzz;
#[cfg(test)]
mod tests;
