//! The library itself, as a host asks about it: its version, what a result code means and
//! whether it is worth retrying, and the last error of the calling thread.

use std::ffi::{c_char, c_int, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use super::boundary::{ffi_boundary, write_string_out, LAST_ERROR};
use super::result::outbox_result::{self, *};

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
