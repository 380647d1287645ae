//go:build cgo

package outbox

/*
#include <stdlib.h>
#include "outbox.h"
*/
import "C"

import "unsafe"

// CancelOutcome is what Relay.Cancel did to an event (docs/scheduling.md).
type CancelOutcome int

// The outcomes of a cancel (the values of the C enum outbox_cancel_outcome).
const (
	// Cancelled: deleted before it was sent (audited as "cancel").
	Cancelled CancelOutcome = C.OUTBOX_CANCELLED
	// CancelAlreadyCancelled: an earlier cancel removed it.
	CancelAlreadyCancelled CancelOutcome = C.OUTBOX_CANCEL_ALREADY_CANCELLED
	// CancelInFlight: claimed by a relay under a lease; it will be sent.
	CancelInFlight CancelOutcome = C.OUTBOX_CANCEL_IN_FLIGHT
	// CancelAlreadySent: sent (kept as SUCCESS, or deleted as sent while the cancel waited).
	CancelAlreadySent CancelOutcome = C.OUTBOX_CANCEL_ALREADY_SENT
	// CancelDeadLettered: dead-lettered (FAIL), not sent.
	CancelDeadLettered CancelOutcome = C.OUTBOX_CANCEL_DEAD_LETTERED
	// CancelGone: not in the table: sent and deleted (sent.rows = delete), purged, or never
	// committed.
	CancelGone CancelOutcome = C.OUTBOX_CANCEL_GONE
)

// String names the outcome.
func (o CancelOutcome) String() string {
	switch o {
	case Cancelled:
		return "cancelled"
	case CancelAlreadyCancelled:
		return "already cancelled"
	case CancelInFlight:
		return "in flight"
	case CancelAlreadySent:
		return "already sent"
	case CancelDeadLettered:
		return "dead-lettered"
	case CancelGone:
		return "gone"
	}
	return "unknown"
}

// Cancel cancels the event id (as Enqueue returned it) if it has not left yet. A cancel racing
// the relay waits for a round sending the event to end, so the outcome is exact: Cancelled, or
// sent (CancelAlreadySent, or CancelInFlight and then sent). It is audited in outbox_audit with
// the relay's instance id. An id the table never issued is an error matching ErrInvalidEvent,
// and nothing changes. It works after Stop too (not after Close).
func (r *Relay) Cancel(id uint64) (CancelOutcome, error) {
	var out C.enum_outbox_cancel_outcome
	err := r.with(func(h *C.outbox_relay) error {
		return call(func() C.enum_outbox_result { return C.outbox_cancel(h, C.uint64_t(id), &out) })
	})
	return CancelOutcome(out), err
}

// CancelByBizNo cancels the pending events of bizNo (of eventType only, when not empty), like
// Cancel; it returns how many it cancelled (the others had left, or were in flight).
func (r *Relay) CancelByBizNo(bizNo, eventType string) (uint64, error) {
	cb, err := cString(bizNo, "bizNo", CodeInvalidEvent)
	if err != nil {
		return 0, err
	}
	defer C.free(unsafe.Pointer(cb))
	var ct *C.char
	if eventType != "" {
		if ct, err = cString(eventType, "eventType", CodeInvalidEvent); err != nil {
			return 0, err
		}
		defer C.free(unsafe.Pointer(ct))
	}
	var n C.uint64_t
	err = r.with(func(h *C.outbox_relay) error {
		return call(func() C.enum_outbox_result { return C.outbox_cancel_by_biz_no(h, cb, ct, &n) })
	})
	return uint64(n), err
}
