package outbox

// #include <stdlib.h>
// #include "outbox.h"
import "C"

import (
	"fmt"
	"runtime"
	"unsafe"
)

// Code is a result code of the C ABI (outbox_result). The values are stable.
type Code int

// The result codes, as in include/outbox.h.
const (
	CodeOK                 Code = C.OUTBOX_OK
	CodeNullArgument       Code = C.OUTBOX_ERR_NULL_ARGUMENT
	CodeInvalidUTF8        Code = C.OUTBOX_ERR_INVALID_UTF8
	CodeUnknownKey         Code = C.OUTBOX_ERR_UNKNOWN_KEY
	CodeInvalidValue       Code = C.OUTBOX_ERR_INVALID_VALUE
	CodeInconsistentConfig Code = C.OUTBOX_ERR_INCONSISTENT_CONFIG
	CodeInvalidEvent       Code = C.OUTBOX_ERR_INVALID_EVENT
	CodeInvalidArgument    Code = C.OUTBOX_ERR_INVALID_ARGUMENT
	CodeDatabase           Code = C.OUTBOX_ERR_DATABASE
	CodeStatement          Code = C.OUTBOX_ERR_STATEMENT
	CodeMigration          Code = C.OUTBOX_ERR_MIGRATION
	CodeStopped            Code = C.OUTBOX_ERR_STOPPED
	CodePublisher          Code = C.OUTBOX_ERR_PUBLISHER
	CodeTimedOut           Code = C.OUTBOX_ERR_TIMED_OUT
	CodeBufferTooSmall     Code = C.OUTBOX_ERR_BUFFER_TOO_SMALL
	CodeTxFinished         Code = C.OUTBOX_ERR_TX_FINISHED
	CodeDatabaseRefused    Code = C.OUTBOX_ERR_DATABASE_REFUSED
	CodePoolTimeout        Code = C.OUTBOX_ERR_POOL_TIMEOUT
	CodeResource           Code = C.OUTBOX_ERR_RESOURCE
	CodePanic              Code = C.OUTBOX_ERR_PANIC
)

// String is the library's description of the code.
func (c Code) String() string {
	return C.GoString(C.outbox_result_str(C.int(c)))
}

// Retriable reports whether a call that failed with this code may succeed later (a database or
// broker hiccup) rather than being the caller's mistake.
func (c Code) Retriable() bool {
	return bool(C.outbox_result_is_retriable(C.int(c)))
}

// Error is every error of this package: the library's result code and its message.
// errors.Is matches it against the sentinel of its code (ErrStopped, ErrInvalidEvent, ...).
type Error struct {
	Code    Code
	Message string
}

func (e *Error) Error() string {
	if e.Message == "" {
		return "outbox: " + e.Code.String()
	}
	return fmt.Sprintf("outbox: %s (%s)", e.Message, e.Code.String())
}

// Is reports whether target is an *Error with the same code (so errors.Is(err, ErrStopped)).
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

// Retriable reports whether trying again later may succeed.
func (e *Error) Retriable() bool { return e.Code.Retriable() }

// Sentinels for errors.Is, one per code.
var (
	ErrNullArgument       = &Error{Code: CodeNullArgument}
	ErrInvalidUTF8        = &Error{Code: CodeInvalidUTF8}
	ErrUnknownKey         = &Error{Code: CodeUnknownKey}
	ErrInvalidValue       = &Error{Code: CodeInvalidValue}
	ErrInconsistentConfig = &Error{Code: CodeInconsistentConfig}
	ErrInvalidEvent       = &Error{Code: CodeInvalidEvent}
	ErrInvalidArgument    = &Error{Code: CodeInvalidArgument}
	ErrDatabase           = &Error{Code: CodeDatabase}
	ErrStatement          = &Error{Code: CodeStatement}
	ErrMigration          = &Error{Code: CodeMigration}
	// ErrStopped: the relay was stopped or closed.
	ErrStopped        = &Error{Code: CodeStopped}
	ErrPublisher      = &Error{Code: CodePublisher}
	ErrTimedOut       = &Error{Code: CodeTimedOut}
	ErrBufferTooSmall = &Error{Code: CodeBufferTooSmall}
	// ErrTxFinished: the transaction was already committed or rolled back.
	ErrTxFinished = &Error{Code: CodeTxFinished}
	// ErrDatabaseRefused: access denied, unknown database, bad URL; not retriable.
	ErrDatabaseRefused = &Error{Code: CodeDatabaseRefused}
	// ErrPoolTimeout: no pool connection became free within db.pool.wait.ms; retriable.
	ErrPoolTimeout = &Error{Code: CodePoolTimeout}
	// ErrResource: a thread of the relay or the consumer could not be started; not retriable.
	ErrResource = &Error{Code: CodeResource}
	ErrPanic    = &Error{Code: CodePanic}
)

// call runs one C call and turns a failure into an *Error carrying the library's message. The
// goroutine stays on one OS thread meanwhile: the message is kept per thread.
func call(f func() C.enum_outbox_result) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	rc := f()
	if rc == C.OUTBOX_OK {
		return nil
	}
	return &Error{Code: Code(rc), Message: lastError()}
}

// lastError reads outbox_last_error of the current thread (the caller has locked it).
func lastError() string {
	size := C.size_t(256)
	for i := 0; i < 4; i++ {
		buf := (*C.char)(C.malloc(size))
		var needed C.size_t
		rc := C.outbox_last_error(buf, size, &needed)
		if rc == C.OUTBOX_OK {
			s := C.GoString(buf)
			C.free(unsafe.Pointer(buf))
			return s
		}
		C.free(unsafe.Pointer(buf))
		if rc != C.OUTBOX_ERR_BUFFER_TOO_SMALL {
			return ""
		}
		size = needed
	}
	return ""
}

func goError(code Code, format string, args ...any) error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}
