//! The one boundary every exported function runs behind ([`ffi_boundary!`]): NULL checks, panics
//! caught, a [`Failure`] turned into its [`outbox_result`] code with its message kept for
//! `outbox_last_error`; and the argument and output conventions (strings, slices, buffers,
//! `errstr`).

use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use super::result::outbox_result::{self, *};
use crate::error::{panic_message, ConfigError, Error};
use crate::host::error::HostError;

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

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
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
            // No code of its own without a new one in the header: the code the starts
            // (`outbox_start`, `outbox_consumer_start`) have always returned for it; the message
            // says what it is.
            Error::Thread { .. } => OUTBOX_ERR_RESOURCE,
        };
        Failure::new(code, e.to_string())
    }
}

impl From<HostError> for Failure {
    fn from(e: HostError) -> Failure {
        match e {
            HostError::Core(e) => e.into(),
            HostError::InvalidArgument(message) => Failure::new(OUTBOX_ERR_INVALID_ARGUMENT, message),
            HostError::EndsTransaction { statement, lent } => Failure::new(
                OUTBOX_ERR_INVALID_ARGUMENT,
                format!(
                    "{statement} is not allowed through outbox_tx_execute: it would end the transaction behind \
                     the library ({})",
                    if lent {
                        "a consumer's handler returns 0 to commit, non-zero to roll back"
                    } else {
                        "use outbox_tx_commit or outbox_tx_rollback"
                    }
                ),
            ),
            HostError::ConsumerTx(what) => Failure::new(
                OUTBOX_ERR_INVALID_ARGUMENT,
                format!(
                    "{what} is not allowed on a consumer's transaction: return 0 from the handler callback to \
                     commit it, non-zero to roll it back"
                ),
            ),
            HostError::TxFinished => Failure::new(
                OUTBOX_ERR_TX_FINISHED,
                "the transaction was already committed or rolled back",
            ),
        }
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

impl From<ConfigError> for Failure {
    fn from(e: ConfigError) -> Failure {
        Error::Config(e).into()
    }
}

thread_local! {
    pub(super) static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

pub(super) fn set_last_error(message: &str) {
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
/// - `ffi_boundary!(errstr(errstr, errstr_size), nonnull(a) { body })`: the same, and a failure's
///   message (a NULL argument's too) is also written into the caller's `errstr` buffer;
/// - `ffi_boundary!(fallback = v, nonnull(a) { body })`: the body returns a value, the function
///   returns it, or `v` when an argument is NULL or the body panics;
/// - `ffi_boundary!(void, nonnull(a) { body })`: for functions returning nothing (a NULL
///   argument makes them a no-op).
macro_rules! ffi_boundary {
    (nonnull($($arg:ident),*) $body:block) => {
        $crate::ffi::boundary::boundary(|| {
            $(if $arg.is_null() {
                return Err($crate::ffi::boundary::Failure::null(stringify!($arg)));
            })*
            $body
        })
    };
    (errstr($errstr:ident, $size:ident), nonnull($($arg:ident),*) $body:block) => {
        $crate::ffi::boundary::boundary(|| {
            $crate::ffi::boundary::with_errstr($errstr, $size, || {
                $(if $arg.is_null() {
                    return Err($crate::ffi::boundary::Failure::null(stringify!($arg)));
                })*
                $body
            })
        })
    };
    (void, nonnull($($arg:ident),*) $body:block) => {
        $crate::ffi::boundary::boundary_value((), || {
            $(if $arg.is_null() {
                return;
            })*
            $body
        })
    };
    (fallback = $fallback:expr, nonnull($($arg:ident),*) $body:block) => {
        $crate::ffi::boundary::boundary_value($fallback, || {
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
