//! `outbox_conf`: string keys and values, so new options never change the ABI.

use std::ffi::{c_char, c_void, CString};
use std::sync::Arc;

use super::boundary::{arg_str, ffi_boundary, UserData};
use super::result::outbox_result;
use crate::config::Config;
use crate::relay::DeadLetterHook;
use crate::store::DeadLetter;

/// A relay configuration being built: the keys of the Rust `Config` (`db.url`, `table`,
/// `publisher`, `scan.interval.ms`, ...), set as strings. Create it with `outbox_conf_new`,
/// hand it to `outbox_start` (which takes it over) or free it with `outbox_conf_free`.
pub struct outbox_conf {
    pub(crate) config: Config,
    pub(crate) dead_letter: Option<(outbox_dead_letter_cb_fn, UserData)>,
}

/// A dead-lettered event, as passed to the dead-letter callback. Every pointer is valid only
/// during the callback; copy what you keep.
#[repr(C)]
pub struct outbox_dead_letter {
    /// The event id (`t_event_record.id`).
    pub id: u64,
    /// NUL-terminated UTF-8.
    pub biz_no: *const c_char,
    /// NUL-terminated UTF-8.
    pub event_type: *const c_char,
    /// Attempts made, counting the last one.
    pub retry_count: u32,
    /// The last error, NUL-terminated UTF-8.
    pub last_error: *const c_char,
}

type outbox_dead_letter_cb_fn = unsafe extern "C" fn(user_data: *mut c_void, letter: *const outbox_dead_letter);

/// Called once per event that ends dead-lettered (status FAIL), for alerting. It runs on a
/// relay thread, possibly on several at once: it must be thread-safe and short, and must not
/// call `outbox_stop` or `outbox_free` on its own relay.
pub type outbox_dead_letter_cb =
    Option<unsafe extern "C" fn(user_data: *mut c_void, letter: *const outbox_dead_letter)>;

/// The host's callback as a [`DeadLetterHook`], each letter copied into an
/// `outbox_dead_letter` for the call.
pub(crate) fn c_dead_letter_hook(cb: outbox_dead_letter_cb_fn, ud: UserData) -> DeadLetterHook {
    Arc::new(move |d: &DeadLetter| {
        let c = |s: &str| CString::new(s.replace('\0', "\u{FFFD}")).unwrap_or_default();
        let (biz_no, event_type, last_error) = (c(&d.biz_no), c(&d.event_type), c(&d.last_error));
        let letter = outbox_dead_letter {
            id: d.id,
            biz_no: biz_no.as_ptr(),
            event_type: event_type.as_ptr(),
            retry_count: d.retry_count,
            last_error: last_error.as_ptr(),
        };
        // SAFETY: the host gave us this callback and context for exactly this call.
        unsafe { cb(ud.ptr(), &letter) };
    })
}

/// A new configuration with the library's defaults (`publisher` is `rocketmq`; set `db.url`).
/// Never NULL (except if the library panicked, which is a bug).
///
/// Thread safety: safe from any thread.
#[no_mangle]
pub extern "C" fn outbox_conf_new() -> *mut outbox_conf {
    ffi_boundary!(fallback = std::ptr::null_mut(), nonnull() {
        crate::host::log_sink::install();
        Box::into_raw(Box::new(outbox_conf {
            config: Config::default(),
            dead_letter: None,
        }))
    })
}

/// Sets one configuration key from its string form. Returns `OUTBOX_ERR_UNKNOWN_KEY` for a
/// key that does not exist and `OUTBOX_ERR_INVALID_VALUE` for a value the key does not accept;
/// in both cases the conf is unchanged and, if `errstr` is not NULL, a NUL-terminated message
/// naming the key (and the value) is written into it, truncated to `errstr_size` bytes.
/// `errstr` is not written on success.
///
/// Thread safety: not thread-safe for the same conf (one call at a time); distinct confs may be
/// used from distinct threads.
#[no_mangle]
pub unsafe extern "C" fn outbox_conf_set(
    conf: *mut outbox_conf,
    key: *const c_char,
    value: *const c_char,
    errstr: *mut c_char,
    errstr_size: usize,
) -> outbox_result {
    ffi_boundary!(errstr(errstr, errstr_size), nonnull(conf) {
        let key = arg_str(key, "key")?;
        let value = arg_str(value, "value")?;
        (*conf).config.set(key, value)?;
        Ok(())
    })
}

/// Sets (or, with `cb` NULL, clears) the dead-letter callback of the relay this conf will
/// start. `user_data` is passed back to every call; it must stay valid, and be usable from any
/// thread, until `outbox_free` of that relay returns (after which the callback is never called).
///
/// Thread safety: not thread-safe for the same conf.
#[no_mangle]
pub unsafe extern "C" fn outbox_conf_set_dead_letter_cb(
    conf: *mut outbox_conf,
    cb: outbox_dead_letter_cb,
    user_data: *mut c_void,
) -> outbox_result {
    ffi_boundary!(nonnull(conf) {
        (*conf).dead_letter = cb.map(|cb| (cb, UserData(user_data)));
        Ok(())
    })
}

/// Frees a conf that was not handed to `outbox_start`. NULL is a no-op. Freeing a conf twice,
/// or after `outbox_start`, is undefined behaviour.
///
/// Thread safety: not thread-safe for the same conf.
#[no_mangle]
pub unsafe extern "C" fn outbox_conf_free(conf: *mut outbox_conf) {
    ffi_boundary!(void, nonnull(conf) {
        drop(Box::from_raw(conf));
    })
}

/// Applies the pending schema migrations to the table of `conf` (key `table`) in the database
/// of `db.url`, which must exist. Safe to run from several processes at once; applied versions
/// are skipped. Call it before `outbox_start`, which fails when the table is missing. The conf
/// is not consumed. On failure a message is written into `errstr` (if not NULL).
///
/// Thread safety: safe from any thread as long as the conf is not being changed meanwhile.
#[no_mangle]
pub unsafe extern "C" fn outbox_migrate(
    conf: *const outbox_conf,
    errstr: *mut c_char,
    errstr_size: usize,
) -> outbox_result {
    ffi_boundary!(errstr(errstr, errstr_size), nonnull(conf) {
        crate::host::relay::migrate(&(*conf).config)?;
        Ok(())
    })
}

/// Applies the consuming half's pending migrations alone (the inbox and the consumer
/// dead-letter tables; none of the relay's) in the database of `db.url`, which must exist: what
/// a service that only consumes runs before `outbox_consumer_start`. Safe to run from several
/// processes at once; applied versions are skipped. The conf is not consumed. On failure a
/// message is written into `errstr` (if not NULL).
///
/// Thread safety: safe from any thread as long as the conf is not being changed meanwhile.
#[no_mangle]
pub unsafe extern "C" fn outbox_migrate_consumer(
    conf: *const outbox_conf,
    errstr: *mut c_char,
    errstr_size: usize,
) -> outbox_result {
    ffi_boundary!(errstr(errstr, errstr_size), nonnull(conf) {
        crate::host::consumer::migrate_consumer(&(*conf).config)?;
        Ok(())
    })
}
