package outbox

/*
#include <stdlib.h>
#include <string.h>
#include "outbox.h"
*/
import "C"

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"math"
	"runtime"
	"strings"
	"sync"
	"time"
	"unsafe"
)

// Event is an event to enqueue in a transaction.
type Event struct {
	// BizNo is the business key (order number). Required, at most 64 characters.
	BizNo string
	// EventType ("ORDER_CREATED") is required, at most 64 characters; the default message tag.
	EventType string
	// Payload is the message body, sent as is. Required.
	Payload []byte
	// Topic overrides the configured topic when not empty.
	Topic string
	// Tag overrides the message tag (the event type) when not empty.
	Tag string
	// Headers are extra message properties.
	Headers map[string]string
	// DeliverAt, when not zero, sends the event at that time rather than as soon as it commits
	// (docs/scheduling.md): the database's clock decides when it is due, and a time already
	// past sends it at once. At most 366 days ahead. Set DeliverAt or DeliverAfter, not both.
	DeliverAt time.Time
	// DeliverAfter, when positive, sends the event that long after its INSERT (the database's
	// clock). It uses no attempt while it waits. At most 366 days; negative is refused.
	DeliverAfter time.Duration
}

// schedule is the event's outbox_schedule (nil when it has none).
func (ev Event) schedule() *C.outbox_schedule {
	if ev.DeliverAt.IsZero() && ev.DeliverAfter == 0 {
		return nil
	}
	s := &C.outbox_schedule{}
	if !ev.DeliverAt.IsZero() {
		s.deliver_at_ms = C.int64_t(ev.DeliverAt.UnixMilli())
	}
	if ev.DeliverAfter != 0 {
		ms := ev.DeliverAfter.Milliseconds()
		if ms == 0 {
			// Under a millisecond, but set: not "no schedule", and keeps its sign.
			ms = 1
			if ev.DeliverAfter < 0 {
				ms = -1
			}
		}
		s.delay_ms = C.int64_t(ms)
	}
	return s
}

// scheduleParams checks the event's schedule as the library does and gives the values of the
// insert statement's deliver_at_ms and delay_ms parameters (nil: NULL).
func scheduleParams(ev Event) (at, delay any, err error) {
	sched := ev.schedule()
	if sched == nil {
		return nil, nil, nil
	}
	var atMs, delayMs C.int64_t
	var bindAt, bindDelay C.bool
	err = call(func() C.enum_outbox_result {
		return C.outbox_schedule_params(sched, &atMs, &bindAt, &delayMs, &bindDelay, nil, 0)
	})
	if err != nil {
		return nil, nil, err
	}
	if bindAt {
		at = int64(atMs)
	}
	if bindDelay {
		delay = int64(delayMs)
	}
	return at, delay, nil
}

// cEvent is an outbox_event and everything it points to, in C memory.
type cEvent struct {
	ev     *C.outbox_event
	allocs []unsafe.Pointer
}

func (c *cEvent) str(s, field string) (*C.char, error) {
	p, err := cString(s, "event."+field, CodeInvalidEvent)
	if err != nil {
		return nil, err
	}
	c.allocs = append(c.allocs, unsafe.Pointer(p))
	return p, nil
}

func (c *cEvent) free() {
	for _, p := range c.allocs {
		C.free(p)
	}
	c.allocs = nil
}

func newCEvent(ev Event) (_ *cEvent, err error) {
	c := &cEvent{}
	defer func() {
		if err != nil {
			c.free()
		}
	}()
	e := (*C.outbox_event)(C.calloc(1, C.size_t(unsafe.Sizeof(C.outbox_event{}))))
	c.allocs = append(c.allocs, unsafe.Pointer(e))
	c.ev = e
	if e.biz_no, err = c.str(ev.BizNo, "biz_no"); err != nil {
		return nil, err
	}
	if e.event_type, err = c.str(ev.EventType, "event_type"); err != nil {
		return nil, err
	}
	if len(ev.Payload) > 0 {
		p := C.CBytes(ev.Payload)
		c.allocs = append(c.allocs, p)
		e.payload = (*C.uint8_t)(p)
		e.payload_len = C.size_t(len(ev.Payload))
	}
	if ev.Topic != "" {
		if e.topic, err = c.str(ev.Topic, "topic"); err != nil {
			return nil, err
		}
	}
	if ev.Tag != "" {
		if e.tag, err = c.str(ev.Tag, "tag"); err != nil {
			return nil, err
		}
	}
	if n := len(ev.Headers); n > 0 {
		hs := (*C.outbox_header)(C.calloc(C.size_t(n), C.size_t(unsafe.Sizeof(C.outbox_header{}))))
		c.allocs = append(c.allocs, unsafe.Pointer(hs))
		arr := unsafe.Slice(hs, n)
		i := 0
		for k, v := range ev.Headers {
			if arr[i].key, err = c.str(k, "headers key"); err != nil {
				return nil, err
			}
			if arr[i].value, err = c.str(v, "headers["+k+"]"); err != nil {
				return nil, err
			}
			i++
		}
		e.headers = hs
		e.headers_len = C.size_t(n)
	}
	return c, nil
}

// cParams is an outbox_param array and everything it points to, in C memory.
type cParams struct {
	ps     *C.outbox_param
	n      int
	allocs []unsafe.Pointer
}

func (c *cParams) free() {
	for _, p := range c.allocs {
		C.free(p)
	}
	c.allocs = nil
}

// newCParams converts Go values: nil, integers, floats, bool, string, []byte, time.Time and
// driver.Valuer (sql.NullString, ...).
func newCParams(args []any) (_ *cParams, err error) {
	c := &cParams{n: len(args)}
	if len(args) == 0 {
		return c, nil
	}
	defer func() {
		if err != nil {
			c.free()
		}
	}()
	c.ps = (*C.outbox_param)(C.calloc(C.size_t(len(args)), C.size_t(unsafe.Sizeof(C.outbox_param{}))))
	c.allocs = append(c.allocs, unsafe.Pointer(c.ps))
	arr := unsafe.Slice(c.ps, len(args))
	for i, a := range args {
		if err := c.set(&arr[i], i, a, 0); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func (c *cParams) set(p *C.outbox_param, i int, a any, depth int) error {
	setInt := func(v int64) { p.kind = C.OUTBOX_PARAM_INT64; p.int_value = C.int64_t(v) }
	setBytes := func(b []byte) {
		p.kind = C.OUTBOX_PARAM_BYTES
		if len(b) > 0 {
			ptr := C.CBytes(b)
			c.allocs = append(c.allocs, ptr)
			p.bytes = (*C.uint8_t)(ptr)
			p.bytes_len = C.size_t(len(b))
		}
	}
	switch v := a.(type) {
	case nil:
		p.kind = C.OUTBOX_PARAM_NULL
	case int:
		setInt(int64(v))
	case int8:
		setInt(int64(v))
	case int16:
		setInt(int64(v))
	case int32:
		setInt(int64(v))
	case int64:
		setInt(v)
	case uint8:
		setInt(int64(v))
	case uint16:
		setInt(int64(v))
	case uint32:
		setInt(int64(v))
	case uint:
		if uint64(v) > math.MaxInt64 {
			return goError(CodeInvalidArgument, "argument %d: %d does not fit in a signed 64-bit integer", i, v)
		}
		setInt(int64(v))
	case uint64:
		if v > math.MaxInt64 {
			return goError(CodeInvalidArgument, "argument %d: %d does not fit in a signed 64-bit integer", i, v)
		}
		setInt(int64(v))
	case bool:
		if v {
			setInt(1)
		} else {
			setInt(0)
		}
	case float32:
		p.kind = C.OUTBOX_PARAM_DOUBLE
		p.double_value = C.double(v)
	case float64:
		p.kind = C.OUTBOX_PARAM_DOUBLE
		p.double_value = C.double(v)
	case string:
		if strings.IndexByte(v, 0) >= 0 {
			// Same bytes on the wire; a C string cannot hold the NUL.
			setBytes([]byte(v))
			return nil
		}
		s := C.CString(v)
		c.allocs = append(c.allocs, unsafe.Pointer(s))
		p.kind = C.OUTBOX_PARAM_TEXT
		p.text = s
	case []byte:
		if v == nil {
			p.kind = C.OUTBOX_PARAM_NULL
		} else {
			setBytes(v)
		}
	case time.Time:
		return c.set(p, i, v.Format("2006-01-02 15:04:05.999999"), depth)
	case driver.Valuer:
		if depth > 4 {
			return goError(CodeInvalidArgument, "argument %d: driver.Valuer nests too deep", i)
		}
		dv, err := v.Value()
		if err != nil {
			return goError(CodeInvalidArgument, "argument %d: %v", i, err)
		}
		return c.set(p, i, dv, depth+1)
	default:
		return goError(CodeInvalidArgument, "argument %d: unsupported type %T", i, a)
	}
	return nil
}

// Tx is a database transaction owned by the library, on a connection of the relay's pool. Use
// it from one goroutine at a time. End it with Commit or Rollback; a Tx that becomes unreachable
// unended is rolled back by a finalizer (do not rely on it: the connection is held until then).
type Tx struct {
	mu sync.Mutex
	h  *C.outbox_tx
}

// Result of Exec: a database/sql Result (sql.Result), read the same way.
type Result struct {
	rowsAffected uint64
	lastInsertID uint64
}

var _ sql.Result = Result{}

// RowsAffected is the number of rows the statement changed (for an UPDATE, those whose values
// changed: the server's affected rows).
func (r Result) RowsAffected() (int64, error) {
	return asInt64(r.rowsAffected, "rows affected")
}

// LastInsertId is the AUTO_INCREMENT value the statement generated, 0 when it generated none.
func (r Result) LastInsertId() (int64, error) {
	return asInt64(r.lastInsertID, "last insert id")
}

func asInt64(v uint64, what string) (int64, error) {
	if v > math.MaxInt64 {
		return 0, goError(CodeInvalidValue, "the %s %d does not fit an int64", what, v)
	}
	return int64(v), nil
}

// Begin begins a library-owned transaction. While all db.pool.max connections are in use it
// waits for one, at most "db.pool.wait.ms" (default 30 s), then fails with ErrPoolTimeout
// (retriable). Fails with ErrStopped after Stop or Close. BeginTx adds a context.
func (r *Relay) Begin() (*Tx, error) {
	if r.stopped.Load() {
		return nil, goError(CodeStopped, "the relay is stopped (Stop was called)")
	}
	var h *C.outbox_tx
	err := r.with(func(rh *C.outbox_relay) error {
		return call(func() C.enum_outbox_result { return C.outbox_tx_begin(rh, &h) })
	})
	if err != nil {
		return nil, err
	}
	t := &Tx{h: h}
	runtime.SetFinalizer(t, (*Tx).release)
	return t, nil
}

// BeginTx is Begin bounded by ctx too: it returns ctx.Err() as soon as ctx is done, even while
// waiting for a pool connection (a connection obtained after that is rolled back and returned to
// the pool at once).
func (r *Relay) BeginTx(ctx context.Context) (*Tx, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if ctx.Done() == nil {
		return r.Begin()
	}
	type begun struct {
		tx  *Tx
		err error
	}
	done := make(chan begun, 1)
	go func() {
		tx, err := r.Begin()
		done <- begun{tx, err}
	}()
	select {
	case b := <-done:
		return b.tx, b.err
	case <-ctx.Done():
		go func() {
			if b := <-done; b.tx != nil {
				_ = b.tx.Rollback()
			}
		}()
		return nil, ctx.Err()
	}
}

func (t *Tx) with(f func(h *C.outbox_tx) error) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.h == nil {
		return goError(CodeTxFinished, "the transaction was already committed or rolled back")
	}
	err := f(t.h)
	runtime.KeepAlive(t)
	return err
}

// release frees the C transaction (rolling it back if it was not ended).
func (t *Tx) release() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.h != nil {
		C.outbox_tx_free(t.h)
		t.h = nil
	}
	runtime.SetFinalizer(t, nil)
}

// txWith runs f with a transaction's live handle, or fails when the transaction is no longer
// usable; Tx.with and ConsumerTx.with are its two kinds.
type txWith func(f func(h *C.outbox_tx) error) error

// withParams converts query and args to C (the parameter encoding of every transaction of this
// package) and runs f on the live handle through with.
func withParams(with txWith, query string, args []any, f func(h *C.outbox_tx, q *C.char, ps *C.outbox_param, n C.size_t) C.enum_outbox_result) error {
	q, err := cString(query, "the statement", CodeInvalidArgument)
	if err != nil {
		return err
	}
	defer C.free(unsafe.Pointer(q))
	ps, err := newCParams(args)
	if err != nil {
		return err
	}
	defer ps.free()
	return with(func(h *C.outbox_tx) error {
		return call(func() C.enum_outbox_result { return f(h, q, ps.ps, C.size_t(ps.n)) })
	})
}

// txExec is Exec on any transaction of this package (outbox_tx_execute).
func txExec(with txWith, query string, args []any) (Result, error) {
	var affected, id C.uint64_t
	err := withParams(with, query, args, func(h *C.outbox_tx, q *C.char, ps *C.outbox_param, n C.size_t) C.enum_outbox_result {
		return C.outbox_tx_execute(h, q, ps, n, &affected, &id)
	})
	if err != nil {
		return Result{}, err
	}
	return Result{rowsAffected: uint64(affected), lastInsertID: uint64(id)}, nil
}

// txQueryInt64 is QueryInt64 on any transaction of this package (outbox_tx_query_int64).
func txQueryInt64(with txWith, query string, args []any) (value int64, found bool, err error) {
	var v C.int64_t
	var f C.bool
	err = withParams(with, query, args, func(h *C.outbox_tx, q *C.char, ps *C.outbox_param, n C.size_t) C.enum_outbox_result {
		return C.outbox_tx_query_int64(h, q, ps, n, &v, &f)
	})
	if err != nil {
		return 0, false, err
	}
	return int64(v), bool(f), nil
}

// Exec runs a business statement with ? placeholders bound to args (never interpolated).
// A statement the database refuses fails with ErrStatement and leaves the transaction open.
func (t *Tx) Exec(query string, args ...any) (Result, error) {
	return txExec(t.with, query, args)
}

// QueryInt64 runs a query and reads the first column of its first row as an integer; found is
// false when there was no row or the value was NULL.
func (t *Tx) QueryInt64(query string, args ...any) (value int64, found bool, err error) {
	return txQueryInt64(t.with, query, args)
}

// Enqueue inserts ev into the outbox table inside the transaction and returns its id. Nothing
// is sent until the transaction commits; a rollback leaves nothing.
func (t *Tx) Enqueue(ev Event) (uint64, error) {
	ev = withTraceContext(context.Background(), ev)
	ce, err := newCEvent(ev)
	if err != nil {
		return 0, err
	}
	defer ce.free()
	var id C.uint64_t
	err = t.with(func(h *C.outbox_tx) error {
		if sched := ev.schedule(); sched != nil {
			return call(func() C.enum_outbox_result { return C.outbox_enqueue_scheduled_in_tx(h, ce.ev, sched, &id) })
		}
		return call(func() C.enum_outbox_result { return C.outbox_enqueue_in_tx(h, ce.ev, &id) })
	})
	return uint64(id), err
}

// Commit commits the transaction and wakes the relay (its events are dispatched at once).
// The Tx is finished afterwards, whether the commit succeeded or not.
func (t *Tx) Commit() error {
	err := t.with(func(h *C.outbox_tx) error {
		return call(func() C.enum_outbox_result { return C.outbox_tx_commit(h) })
	})
	t.release()
	return err
}

// Rollback rolls the transaction back; nothing it wrote remains. It returns an error matching
// ErrTxFinished after Commit or Rollback, so `defer tx.Rollback()` is safe.
func (t *Tx) Rollback() error {
	err := t.with(func(h *C.outbox_tx) error {
		return call(func() C.enum_outbox_result { return C.outbox_tx_rollback(h) })
	})
	t.release()
	return err
}

// EnqueueTx inserts ev into the relay's outbox table inside the caller's own database/sql
// transaction, with the statement the library provides for the configured table, after
// validating ev with the library's rules. The row commits or rolls back with tx. After
// tx.Commit(), call relay.Notify() so the relay dispatches at once instead of at its next scan.
// It returns the new row's id (the message's eventId). After relay.Stop or relay.Close it fails
// with ErrStopped and writes nothing, like Tx.Enqueue.
func EnqueueTx(ctx context.Context, tx *sql.Tx, relay *Relay, ev Event) (int64, error) {
	if tx == nil || relay == nil {
		return 0, goError(CodeNullArgument, "EnqueueTx needs a transaction and a relay")
	}
	if relay.stopped.Load() {
		return 0, goError(CodeStopped, "the relay is stopped (Stop was called)")
	}
	ev = withTraceContext(ctx, ev)
	// One C copy of the event serves the library's validation and its headers encoding.
	ce, err := newCEvent(ev)
	if err != nil {
		return 0, err
	}
	defer ce.free()
	if err := relay.validate(ce); err != nil {
		return 0, err
	}
	// An event due now takes the INSERT without the due time's expression (cheaper for the
	// database); a scheduled one the INSERT with it.
	ins := relay.insert(ev.schedule() != nil)
	if ins.err != nil {
		return 0, ins.err
	}
	headers, err := headersParam(ce, len(ev.Headers) > 0)
	if err != nil {
		return 0, err
	}
	optional := func(s string) any {
		if s == "" {
			return nil
		}
		return s
	}
	deliverAt, delay, err := scheduleParams(ev)
	if err != nil {
		return 0, err
	}
	names := ins.params
	args := make([]any, len(names))
	for i, name := range names {
		switch name {
		case "biz_no":
			args[i] = ev.BizNo
		case "event_type":
			args[i] = ev.EventType
		case "payload":
			args[i] = ev.Payload
		case "topic":
			args[i] = optional(ev.Topic)
		case "tag":
			args[i] = optional(ev.Tag)
		case "headers":
			args[i] = headers
		case "deliver_at_ms":
			args[i] = deliverAt
		case "delay_ms":
			args[i] = delay
		default:
			return 0, goError(CodeInvalidArgument, "the library's insert statement has a parameter %q this binding does not know; update the binding", name)
		}
	}
	res, err := tx.ExecContext(ctx, ins.sql, args...)
	if err != nil {
		return 0, err
	}
	return res.LastInsertId()
}

// headersParam is the value of the statement's headers parameter for the event, encoded by
// the library exactly as Enqueue stores it: nil (NULL) when it has no headers.
func headersParam(ce *cEvent, hasHeaders bool) (any, error) {
	if !hasHeaders {
		return nil, nil
	}
	js, err := readString(func(buf *C.char, n C.size_t, needed *C.size_t) C.enum_outbox_result {
		return C.outbox_event_headers_json(ce.ev, buf, n, needed)
	})
	if err != nil || js == "" {
		return nil, err
	}
	return js, nil
}
