//! `outbox_relay`: start, notify, stop, free, and what hosts need for their own transactions.

use std::ffi::{c_char, CStr, CString};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use super::boundary::{ffi_boundary, write_string_out, Failure};
use super::conf::{c_dead_letter_hook, outbox_conf};
use super::event::{outbox_event, outbox_schedule, to_new_event, to_schedule};
use super::result::outbox_result::{self, *};
use crate::host::relay::{check_event, insert_statement, HostRelay};

/// A started relay (or enqueue-only instance with `publisher=none`). Created by
/// `outbox_start`, stopped by `outbox_stop`, freed by `outbox_free`.
pub struct outbox_relay {
    /// Shared with the transactions begun on it, which keep it (and so the pool) alive after
    /// `outbox_free`, so a tx may be finished or freed in any order.
    pub(crate) host: Arc<HostRelay>,
}

/// Longest stop deadline honoured (about 49 days); longer ones are shortened to it.
const MAX_STOP_MS: u64 = u32::MAX as u64;

/// Starts a relay from `conf`. The conf is consumed whether this succeeds or not: do not use
/// or free it afterwards (even when `out_relay` is NULL). It opens the database pool, checks
/// that the table exists (run `outbox_migrate` first), starts the publisher named by
/// `publisher` and the relay threads; with `publisher=none` it starts no thread and only
/// enqueues. On success `*out_relay` receives the handle; on failure nothing is written there
/// and, if `errstr` is not NULL, a NUL-terminated message is written into it.
///
/// Thread safety: safe from any thread (for distinct confs).
#[no_mangle]
pub unsafe extern "C" fn outbox_start(
    conf: *mut outbox_conf,
    out_relay: *mut *mut outbox_relay,
    errstr: *mut c_char,
    errstr_size: usize,
) -> outbox_result {
    ffi_boundary!(errstr(errstr, errstr_size), nonnull(conf) {
        let conf = *Box::from_raw(conf);
        if out_relay.is_null() {
            return Err(Failure::null("out_relay"));
        }
        let hook = conf.dead_letter.map(|(cb, user_data)| c_dead_letter_hook(cb, user_data));
        let host = Arc::new(HostRelay::start(conf.config, hook)?);
        *out_relay = Box::into_raw(Box::new(outbox_relay { host }));
        Ok(())
    })
}

/// Wakes the relay so committed events are dispatched now instead of at the next scan. Call it
/// after committing a transaction of your own that enqueued events (`outbox_tx_commit` does it
/// by itself). Never blocks. `OUTBOX_ERR_STOPPED` after `outbox_stop`.
///
/// Thread safety: safe from any thread, concurrently with any call on the same relay except
/// `outbox_free`.
#[no_mangle]
pub unsafe extern "C" fn outbox_notify(relay: *const outbox_relay) -> outbox_result {
    ffi_boundary!(nonnull(relay) { Ok((*relay).host.notify()?) })
}

/// Stops the relay: stops claiming, lets sends in flight finish until `timeout_ms`, returns
/// claimed-but-unsent events to WAIT, and joins the relay threads. Blocks until then. Returns
/// `OUTBOX_ERR_TIMED_OUT` if some thread was still running at the deadline (its events come
/// back when their lease expires); a later call waits for those threads again, up to its own
/// deadline, and joins them. Once every thread has ended, calls return `OUTBOX_OK` at once.
/// After it, `outbox_notify`, `outbox_tx_begin` and `outbox_enqueue_in_tx` return
/// `OUTBOX_ERR_STOPPED`; `outbox_stats`, `outbox_insert_statement` and transactions already
/// begun (execute, commit, rollback) still work. The handle must still be freed.
///
/// Thread safety: safe from any thread, concurrently with any call on the same relay except
/// `outbox_free`; a call made while another stop is in progress waits for it, then for the
/// threads itself.
#[no_mangle]
pub unsafe extern "C" fn outbox_stop(relay: *mut outbox_relay, timeout_ms: u64) -> outbox_result {
    ffi_boundary!(nonnull(relay) {
        let report = (*relay).host.stop(Duration::from_millis(timeout_ms.min(MAX_STOP_MS)));
        if report.timed_out {
            return Err(Failure::new(
                OUTBOX_ERR_TIMED_OUT,
                format!(
                    "the relay threads did not end within {timeout_ms} ms ({} events still in flight)",
                    report.in_flight_at_deadline
                ),
            ));
        }
        Ok(())
    })
}

/// Frees a relay handle, stopping it first if needed, or finishing a stop that timed out (with
/// a deadline of the send timeout plus one second; threads still running after that are left
/// to end on their own). After it returns the dead-letter callback is never called again. Transactions
/// begun on it stay usable until freed. NULL is a no-op; freeing twice is undefined behaviour.
///
/// Thread safety: must not run concurrently with any other call on the same relay.
#[no_mangle]
pub unsafe extern "C" fn outbox_free(relay: *mut outbox_relay) {
    ffi_boundary!(void, nonnull(relay) {
        Box::from_raw(relay).host.stop_and_release();
    })
}

/// Writes a JSON snapshot of the relay's counters (`sent`, `retried`, `dead_lettered`,
/// `reclaimed`, `in_flight`, `breaker_state`, ...) and, when the database answers, its gauges
/// (`gauges.wait`, `gauges.sending`, `gauges.fail`, `gauges.oldest_wait_age_ms`; else
/// `"gauges": null`) into `buf`, NUL-terminated. `latency` holds the commit → broker-ack times
/// of the events this relay delivered: `count`, `mean_ms`, `max_ms`, and `p50_ms`/`p99_ms`
/// (upper bounds of power-of-two buckets; all 0 before the first delivery).
///
/// Buffer convention (also `outbox_insert_statement`, `outbox_last_error`): `*out_needed`
/// receives the size needed including the NUL, on success and on `OUTBOX_ERR_BUFFER_TOO_SMALL`
/// (then `buf` is untouched); `buf` may be NULL when `len` is 0, to ask for the size. Each call
/// takes a new snapshot, so the size can grow between two calls: leave some room.
///
/// Thread safety: safe from any thread, concurrently with any call on the same relay except
/// `outbox_free`. Works after `outbox_stop`.
#[no_mangle]
pub unsafe extern "C" fn outbox_stats(
    relay: *const outbox_relay,
    buf: *mut c_char,
    len: usize,
    out_needed: *mut usize,
) -> outbox_result {
    ffi_boundary!(nonnull(relay, out_needed) {
        write_string_out(&(*relay).host.stats_json(true), buf, len, out_needed)
    })
}

/// Writes the parameterised INSERT that enqueues one event due now into the relay's table, for
/// hosts that insert with their own driver inside their own transaction (then `outbox_notify`
/// after their commit). Its `?` parameters, in order, are named by
/// `outbox_insert_param_name(0..outbox_insert_param_count())`: `biz_no`, `event_type`, `payload`
/// (bytes), `topic` (NULL = the configured topic), `tag` (NULL = the event type), `headers`
/// (NULL, or a JSON object of string values). A scheduled event takes
/// `outbox_insert_scheduled_statement`. Validate the event with `outbox_validate_event` first.
/// Buffer convention as in `outbox_stats`.
///
/// Thread safety: safe from any thread, concurrently with any call on the same relay except
/// `outbox_free`. Works after `outbox_stop`.
#[no_mangle]
pub unsafe extern "C" fn outbox_insert_statement(
    relay: *const outbox_relay,
    buf: *mut c_char,
    len: usize,
    out_needed: *mut usize,
) -> outbox_result {
    write_insert_statement(relay, false, buf, len, out_needed)
}

/// Writes the parameterised INSERT that enqueues one scheduled event into the relay's table:
/// the parameters of `outbox_insert_statement`, then `deliver_at_ms` and `delay_ms`
/// (`outbox_schedule_params` gives their values), `outbox_insert_scheduled_param_count()` in
/// all, named by `outbox_insert_param_name`. Buffer convention as in `outbox_stats`.
///
/// Thread safety: safe from any thread, concurrently with any call on the same relay except
/// `outbox_free`. Works after `outbox_stop`.
#[no_mangle]
pub unsafe extern "C" fn outbox_insert_scheduled_statement(
    relay: *const outbox_relay,
    buf: *mut c_char,
    len: usize,
    out_needed: *mut usize,
) -> outbox_result {
    write_insert_statement(relay, true, buf, len, out_needed)
}

/// Either INSERT of the relay's table into `buf` (the two entry points above).
unsafe fn write_insert_statement(
    relay: *const outbox_relay,
    scheduled: bool,
    buf: *mut c_char,
    len: usize,
    out_needed: *mut usize,
) -> outbox_result {
    ffi_boundary!(nonnull(relay, out_needed) {
        let relay = &*relay;
        let sql = insert_statement(&relay.host.relay.config().table, scheduled)?;
        write_string_out(&sql, buf, len, out_needed)
    })
}

/// The names of the scheduled INSERT's parameters; the first of them are the plain INSERT's.
fn param_names() -> &'static [CString] {
    static NAMES: OnceLock<Vec<CString>> = OnceLock::new();
    NAMES.get_or_init(|| {
        crate::store::INSERT_SCHEDULED_PARAMS
            .iter()
            .map(|n| CString::new(*n).expect("no NUL"))
            .collect()
    })
}

/// The number of `?` parameters of `outbox_insert_statement`.
///
/// Thread safety: safe from any thread.
#[no_mangle]
pub extern "C" fn outbox_insert_param_count() -> usize {
    ffi_boundary!(fallback = 0, nonnull() { crate::store::INSERT_PARAMS.len() })
}

/// The number of `?` parameters of `outbox_insert_scheduled_statement`.
///
/// Thread safety: safe from any thread.
#[no_mangle]
pub extern "C" fn outbox_insert_scheduled_param_count() -> usize {
    ffi_boundary!(fallback = 0, nonnull() { crate::store::INSERT_SCHEDULED_PARAMS.len() })
}

/// The name of parameter `index` of `outbox_insert_scheduled_statement` (a static
/// NUL-terminated string), or NULL when `index` is out of range. The parameters of
/// `outbox_insert_statement` are its first `outbox_insert_param_count()`, in the same order.
///
/// Thread safety: safe from any thread.
#[no_mangle]
pub extern "C" fn outbox_insert_param_name(index: usize) -> *const c_char {
    ffi_boundary!(fallback = std::ptr::null(), nonnull() {
        param_names().get(index).map_or(std::ptr::null(), |n| CStr::as_ptr(n))
    })
}

/// Writes the value to bind to the `headers` parameter of `outbox_insert_statement` (and of the
/// scheduled one) for
/// `event`: its headers as the library stores them (a JSON object of strings), or the empty
/// string when it has none (bind NULL then). With `outbox_validate_event` and the statement, a
/// host that inserts with its own driver stores exactly what `outbox_enqueue_in_tx` would.
/// `out_needed` receives the size needed, NUL included; `buf` is written only when it is large
/// enough (else `OUTBOX_ERR_BUFFER_TOO_SMALL`).
///
/// Thread safety: safe from any thread.
#[no_mangle]
pub unsafe extern "C" fn outbox_event_headers_json(
    event: *const outbox_event,
    buf: *mut c_char,
    len: usize,
    out_needed: *mut usize,
) -> outbox_result {
    ffi_boundary!(nonnull(event, out_needed) {
        let ev = to_new_event(&*event)?;
        write_string_out(ev.headers_json().as_deref().unwrap_or(""), buf, len, out_needed)
    })
}

/// Checks `schedule` as `outbox_enqueue_scheduled_in_tx` would (one field set, not negative,
/// at most 366 days ahead) and writes the values to bind to the `deliver_at_ms` and `delay_ms`
/// parameters of `outbox_insert_scheduled_statement` (`*out_bind_*` false: bind NULL), for hosts that
/// insert with their own driver. `OUTBOX_ERR_INVALID_EVENT` names the wrong value in `errstr`.
///
/// Thread safety: safe from any thread.
#[no_mangle]
pub unsafe extern "C" fn outbox_schedule_params(
    schedule: *const outbox_schedule,
    out_deliver_at_ms: *mut i64,
    out_bind_deliver_at: *mut bool,
    out_delay_ms: *mut i64,
    out_bind_delay: *mut bool,
    errstr: *mut c_char,
    errstr_size: usize,
) -> outbox_result {
    ffi_boundary!(errstr(errstr, errstr_size), nonnull(out_deliver_at_ms, out_bind_deliver_at, out_delay_ms, out_bind_delay) {
        let schedule = to_schedule(schedule)?;
        if let Some(s) = &schedule {
            s.validate()?;
        }
        let (at, delay) = crate::event::Schedule::params(schedule.as_ref());
        *out_deliver_at_ms = at.unwrap_or(0);
        *out_bind_deliver_at = at.is_some();
        *out_delay_ms = delay.unwrap_or(0);
        *out_bind_delay = delay.is_some();
        Ok(())
    })
}

/// Checks `event` as `outbox_enqueue_in_tx` would (required fields, lengths, the relay's
/// `payload.max.bytes`, topic characters, reserved header names) without writing anything: for
/// hosts that insert with `outbox_insert_statement`. `OUTBOX_ERR_INVALID_EVENT` names the
/// field in `errstr` (if not NULL).
///
/// Thread safety: safe from any thread, concurrently with any call on the same relay except
/// `outbox_free`.
#[no_mangle]
pub unsafe extern "C" fn outbox_validate_event(
    relay: *const outbox_relay,
    event: *const outbox_event,
    errstr: *mut c_char,
    errstr_size: usize,
) -> outbox_result {
    ffi_boundary!(errstr(errstr, errstr_size), nonnull(relay, event) {
        let relay = &*relay;
        check_event(&to_new_event(&*event)?, relay.host.relay.config().payload_max_bytes)?;
        Ok(())
    })
}
