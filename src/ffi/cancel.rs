//! `outbox_cancel`, `outbox_cancel_by_biz_no`: cancelling events that have not left yet.

use std::ffi::c_char;

use super::boundary::{arg_opt_str, arg_str, ffi_boundary};
use super::relay::outbox_relay;
use super::result::outbox_result;
use crate::cancel::CancelOutcome;

/// What `outbox_cancel` did to the event (`*out_outcome`). Values are stable.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum outbox_cancel_outcome {
    /// Deleted before it was sent (audited as `cancel`).
    OUTBOX_CANCELLED = 0,
    /// An earlier cancel removed it.
    OUTBOX_CANCEL_ALREADY_CANCELLED = 1,
    /// Claimed by a relay under a lease: it will be sent.
    OUTBOX_CANCEL_IN_FLIGHT = 2,
    /// Sent (kept as SUCCESS, or deleted as sent while the cancel waited for its relay).
    OUTBOX_CANCEL_ALREADY_SENT = 3,
    /// Dead-lettered (FAIL): not sent.
    OUTBOX_CANCEL_DEAD_LETTERED = 4,
    /// Not in the table: sent and deleted (`sent.rows = delete`), purged, or never committed.
    OUTBOX_CANCEL_GONE = 5,
}

fn code(o: CancelOutcome) -> outbox_cancel_outcome {
    use outbox_cancel_outcome::*;
    match o {
        CancelOutcome::Cancelled { .. } => OUTBOX_CANCELLED,
        CancelOutcome::AlreadyCancelled => OUTBOX_CANCEL_ALREADY_CANCELLED,
        CancelOutcome::InFlight => OUTBOX_CANCEL_IN_FLIGHT,
        CancelOutcome::AlreadySent => OUTBOX_CANCEL_ALREADY_SENT,
        CancelOutcome::DeadLettered => OUTBOX_CANCEL_DEAD_LETTERED,
        CancelOutcome::Gone => OUTBOX_CANCEL_GONE,
    }
}

/// Cancels the event `event_id` if it has not left yet (docs/scheduling.md): a cancel racing
/// the relay waits for a round sending it to end, so the outcome (`*out_outcome`, an
/// `outbox_cancel_outcome` value) is exact: cancelled, or sent (or in flight, and then sent).
/// The cancel is audited in `outbox_audit` with the relay's instance id. An id the table never
/// issued is `OUTBOX_ERR_INVALID_EVENT` (naming it), and nothing changes. Allowed after
/// `outbox_stop`.
///
/// Thread safety: safe from any thread, concurrently with any call on the same relay except
/// `outbox_free`.
#[no_mangle]
pub unsafe extern "C" fn outbox_cancel(
    relay: *const outbox_relay,
    event_id: u64,
    out_outcome: *mut outbox_cancel_outcome,
) -> outbox_result {
    ffi_boundary!(nonnull(relay, out_outcome) {
        *out_outcome = code((*relay).host.cancel(event_id)?);
        Ok(())
    })
}

/// Cancels the pending events of `biz_no` (NUL-terminated UTF-8), of type `event_type` only
/// when it is not NULL, like `outbox_cancel`; `*out_cancelled` receives how many were cancelled
/// (the others had left, or were in flight).
///
/// Thread safety: as `outbox_cancel`.
#[no_mangle]
pub unsafe extern "C" fn outbox_cancel_by_biz_no(
    relay: *const outbox_relay,
    biz_no: *const c_char,
    event_type: *const c_char,
    out_cancelled: *mut u64,
) -> outbox_result {
    ffi_boundary!(nonnull(relay, biz_no, out_cancelled) {
        let biz_no = arg_str(biz_no, "biz_no")?;
        let event_type = arg_opt_str(event_type, "event_type")?;
        *out_cancelled = (*relay).host.cancel_by_biz_no(biz_no, event_type)? as u64;
        Ok(())
    })
}
