package outbox

/*
#include <stdint.h>
#include "outbox.h"
*/
import "C"

import (
	"fmt"
	"runtime/cgo"
	"unsafe"
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

// outboxGoConsumeBatch is every consumer's handler callback (outbox_consume_batch_cb, through the
// trampoline in consumer.go), called on a consumer thread with the lent transaction and the
// batch's new messages (one, when the runtime handles a batch again one message at a time).
//
//export outboxGoConsumeBatch
func outboxGoConsumeBatch(handle C.uintptr_t, tx *C.outbox_tx, messages *C.outbox_message, count C.size_t, errBuf *C.char, errSize C.size_t) (rc C.int) {
	defer containConsume(&rc, errBuf, errSize)
	st := cgo.Handle(handle).Value().(*consumerState)
	views := unsafe.Slice(messages, int(count))
	msgs := make([]*Message, len(views))
	for i := range views {
		m, err := goMessage(&views[i])
		if err != nil {
			writeCString(errBuf, errSize, err.Error())
			return outcome(err)
		}
		msgs[i] = m
	}
	return st.run(tx, msgs, errBuf, errSize)
}

// containConsume turns a panic of the binding's own callback code (the handler's are recovered
// where it runs) into a failure of the message: it must not unwind into the library's frames.
func containConsume(rc *C.int, errBuf *C.char, errSize C.size_t) {
	if p := recover(); p != nil {
		writeCString(errBuf, errSize, fmt.Sprintf("the Go consumer callback failed: %v", p))
		*rc = C.int(CodePanic)
	}
}
