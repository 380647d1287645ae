//! Host logging over the C ABI: the core's `log` records routed to a C callback
//! (`outbox_set_log_callback`) through the shared sink of [`crate::host::log_sink`], and the
//! process-wide threshold (`outbox_set_log_level`).

use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::Arc;

use super::boundary::{ffi_boundary, UserData};
use super::result::outbox_result;
use crate::host::log_level;
use crate::host::log_sink::{set_sink, HostLogFn, Sink};

/// Severity of a log record, and the threshold of `outbox_set_log_level`. The values are
/// stable.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum outbox_log_level {
    /// As a threshold: no records at all. Never the level of a record.
    OUTBOX_LOG_OFF = 0,
    OUTBOX_LOG_ERROR = 1,
    OUTBOX_LOG_WARN = 2,
    /// The default threshold: start, stop, state changes; no line per event.
    OUTBOX_LOG_INFO = 3,
    /// Per-round and per-event detail.
    OUTBOX_LOG_DEBUG = 4,
    OUTBOX_LOG_TRACE = 5,
}

use outbox_log_level::*;

impl outbox_log_level {
    /// The level of number `n` (see [`crate::host::log_level`]; the values are the numbers).
    fn of_number(n: i32) -> outbox_log_level {
        const BY_NUMBER: [outbox_log_level; 6] = [
            OUTBOX_LOG_OFF,
            OUTBOX_LOG_ERROR,
            OUTBOX_LOG_WARN,
            OUTBOX_LOG_INFO,
            OUTBOX_LOG_DEBUG,
            OUTBOX_LOG_TRACE,
        ];
        usize::try_from(n)
            .ok()
            .and_then(|i| BY_NUMBER.get(i).copied())
            .unwrap_or(OUTBOX_LOG_INFO)
    }
}

/// Receives one log record. `target` is the module that logged (`outbox::relay`,
/// `outbox::store`, `mysql::conn::pool`, ...) and `message` the text, both NUL-terminated UTF-8
/// valid only during the call. Called on whatever thread logged (relay threads, or the thread
/// of an `outbox_*` call), possibly on several at once: it must be thread-safe and should be
/// quick. It must not call `outbox_set_log_callback`; records logged by `outbox_*` calls made
/// from inside the callback are dropped (no recursion).
pub type outbox_log_cb = Option<
    unsafe extern "C" fn(
        level: outbox_log_level,
        target: *const c_char,
        message: *const c_char,
        user_data: *mut c_void,
    ),
>;

type LogFn = unsafe extern "C" fn(outbox_log_level, *const c_char, *const c_char, *mut c_void);

/// Delivers each record to the host's C callback.
fn c_callback(cb: LogFn, ud: UserData) -> HostLogFn {
    Arc::new(move |level, target, message| {
        let c = |s: &str| CString::new(s.replace('\0', "\u{FFFD}")).unwrap_or_default();
        let (target, message) = (c(target), c(message));
        // SAFETY: the host set this callback and context for exactly these calls.
        unsafe {
            cb(
                outbox_log_level::of_number(log_level::number_of(level)),
                target.as_ptr(),
                message.as_ptr(),
                ud.ptr(),
            )
        };
    })
}

/// Routes the library's log records to `cb` (process-wide), or back to the default (one line
/// per record on stderr) when `cb` is NULL. `user_data` is passed back to every call; it must
/// stay valid, and be usable from any thread, until the callback is replaced (this call waits
/// for records being delivered to the old callback, so the old context may be freed once it
/// returns). Set it before `outbox_start` to see the start-up records. Which records arrive is
/// decided by `outbox_set_log_level` (default `OUTBOX_LOG_INFO`) and the `log.level` key.
/// Returns `OUTBOX_ERR_INVALID_ARGUMENT` when called from inside a log callback.
///
/// Thread safety: safe from any thread.
#[no_mangle]
pub unsafe extern "C" fn outbox_set_log_callback(cb: outbox_log_cb, user_data: *mut c_void) -> outbox_result {
    ffi_boundary!(nonnull() {
        let sink = match cb {
            Some(cb) => Sink::Host(c_callback(cb, UserData(user_data))),
            None => Sink::Stderr,
        };
        Ok(set_sink(sink)?)
    })
}

/// Sets the process-wide threshold: records above it (less severe) are not even formatted.
/// `OUTBOX_LOG_OFF` silences the library. Default `OUTBOX_LOG_INFO`. `level` is an
/// `outbox_log_level` value passed as an int, so that a value out of range is an error. The configuration key
/// `log.level`, when set, does the same at `outbox_start`. An unknown value is
/// `OUTBOX_ERR_INVALID_ARGUMENT`.
///
/// Thread safety: safe from any thread.
#[no_mangle]
pub extern "C" fn outbox_set_log_level(level: c_int) -> outbox_result {
    ffi_boundary!(nonnull() { Ok(log_level::set_max_level(level)?) })
}

/// The process-wide threshold now in force (an `outbox_log_level` value).
///
/// Thread safety: safe from any thread.
#[no_mangle]
pub extern "C" fn outbox_get_log_level() -> outbox_log_level {
    ffi_boundary!(fallback = OUTBOX_LOG_INFO, nonnull() {
        outbox_log_level::of_number(log_level::max_level())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;

    static SEEN: Mutex<Vec<(outbox_log_level, String, String)>> = parking_lot::const_mutex(Vec::new());

    unsafe extern "C" fn keep(level: outbox_log_level, target: *const c_char, message: *const c_char, _: *mut c_void) {
        let s = |p: *const c_char| std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned();
        SEEN.lock().push((level, s(target), s(message)));
    }

    #[test]
    fn records_reach_the_callback_and_a_panicking_host_sink_is_contained() {
        // One test owns the process-wide logger state (the lib tests install no other logger).
        assert_eq!(
            unsafe { outbox_set_log_callback(Some(keep), std::ptr::null_mut()) },
            outbox_result::OUTBOX_OK
        );
        log::warn!(target: "outbox::test", "careful: {}", 1);
        log::debug!(target: "outbox::test", "below the default threshold");
        let seen = SEEN.lock().clone();
        assert!(
            seen.contains(&(OUTBOX_LOG_WARN, "outbox::test".into(), "careful: 1".into())),
            "{seen:?}"
        );
        assert!(
            !seen.iter().any(|(_, _, m)| m.contains("below the default")),
            "{seen:?}"
        );

        set_sink(Sink::Host(Arc::new(|_, _, _| panic!("a host logger that panics")))).unwrap();
        log::error!(target: "outbox::test", "into a panicking sink");
        // The thread goes on and later records are delivered.
        assert_eq!(
            unsafe { outbox_set_log_callback(Some(keep), std::ptr::null_mut()) },
            outbox_result::OUTBOX_OK
        );
        log::error!(target: "outbox::test", "after the panic");
        assert!(SEEN
            .lock()
            .iter()
            .any(|(l, _, m)| *l == OUTBOX_LOG_ERROR && m == "after the panic"));

        assert_eq!(outbox_set_log_level(9), outbox_result::OUTBOX_ERR_INVALID_ARGUMENT);
        assert_eq!(
            unsafe { outbox_set_log_callback(None, std::ptr::null_mut()) },
            outbox_result::OUTBOX_OK
        );
    }

    unsafe extern "C" fn discard(_: outbox_log_level, _: *const c_char, _: *const c_char, _: *mut c_void) {}

    /// The figures in the bindings' READMEs: `cargo test --release --lib logging_cost -- --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement, not a check"]
    fn logging_cost() {
        use std::hint::black_box;
        use std::time::Instant;
        assert_eq!(
            unsafe { outbox_set_log_callback(Some(discard), std::ptr::null_mut()) },
            outbox_result::OUTBOX_OK
        );
        // Nanoseconds per DEBUG record, over `n` of them, at threshold `level`.
        let per_record = |level: log::LevelFilter, n: u64| {
            log::set_max_level(level);
            let t = Instant::now();
            for i in 0..n {
                log::debug!(target: "outbox::relay", "event {} acked by the broker", black_box(i));
            }
            t.elapsed().as_nanos() as f64 / n as f64
        };
        let disabled = per_record(log::LevelFilter::Info, 20_000_000);
        let delivered = per_record(log::LevelFilter::Debug, 1_000_000);
        log::set_max_level(log::LevelFilter::Info);
        assert_eq!(
            unsafe { outbox_set_log_callback(None, std::ptr::null_mut()) },
            outbox_result::OUTBOX_OK
        );
        println!("a record below the threshold: {disabled:.2} ns; a record delivered to a C callback that discards it: {delivered:.0} ns");
    }
}
