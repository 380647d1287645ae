package outbox

/*
#include <stdint.h>
#include "outbox.h"
*/
import "C"

import (
	"runtime/cgo"
)

// outboxGoDeadLetter is called by the library (through the trampoline in outbox.go) on a relay
// thread for each dead-lettered event. A panic in the user's function is recovered: it must not
// unwind into the library's frames.
//
//export outboxGoDeadLetter
func outboxGoDeadLetter(handle C.uintptr_t, letter *C.outbox_dead_letter) {
	defer func() { _ = recover() }()
	f, ok := cgo.Handle(handle).Value().(func(DeadLetter))
	if !ok || f == nil || letter == nil {
		return
	}
	f(DeadLetter{
		ID:         uint64(letter.id),
		BizNo:      C.GoString(letter.biz_no),
		EventType:  C.GoString(letter.event_type),
		RetryCount: uint32(letter.retry_count),
		LastError:  C.GoString(letter.last_error),
	})
}
