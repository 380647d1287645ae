package outbox

/*
#include <stdlib.h>
#include <stdint.h>
#include "outbox.h"

// Declared by callback.go (//export); the trampoline turns the void* back into the handle.
extern int outboxGoConsumeBatch(uintptr_t handle, outbox_tx *tx, outbox_message *messages, size_t count,
                                char *err, size_t err_size);

static int outbox_go_consume_batch_trampoline(void *user_data, outbox_tx *tx, const outbox_message *messages,
                                              size_t count, char *err, size_t err_size) {
	return outboxGoConsumeBatch((uintptr_t)user_data, tx, (outbox_message *)messages, count, err, err_size);
}

// Every Go consumer starts with the batch callback: a per-message handler is run on each message
// of the call on the Go side (one cgo crossing per batch, not per message).
static enum outbox_result outbox_go_consumer_start(const outbox_conf *conf, const char *topic, const char *group,
                                                   uintptr_t handle, outbox_consumer **out) {
	return outbox_consumer_start_batch(conf, topic, group, outbox_go_consume_batch_trampoline, (void *)handle, out,
	                                   NULL, 0);
}
*/
import "C"

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"runtime/cgo"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"
	"unsafe"
)

// The consumer runtime (docs/inbox.md, "The consumer runtime") over the C ABI's
// outbox_consumer_*: the library subscribes a topic with a consumer group, and for each message
// begins a transaction, marks the message's key in the inbox, runs the Go handler in that same
// transaction, and commits; offsets are committed to the broker only after the database commit.

// Message is a message as a consumer's handler receives it. Everything is copied into Go memory:
// a Message may be kept after the handler returns (its ConsumerTx may not).
type Message struct {
	// Key is the dedup key the consumer marked in the inbox: the eventKey property the relay
	// sets (for a message without one, the fallback docs/inbox.md describes).
	Key string
	// Topic, Broker and QueueID name the queue the message was taken from; QueueOffset is its
	// position there.
	Topic       string
	Broker      string
	QueueID     uint32
	QueueOffset int64
	// MsgID is the broker's message id ("" when none): for tracing only, never a dedup key.
	MsgID string
	// Tag is the message tag (the event type unless the event set one); "" when none.
	Tag string
	// Properties are the message's user properties: eventId, eventKey, eventType, bizNo and the
	// event's headers. Never nil.
	Properties map[string]string
	// Body is the message body (the event's payload). Never nil.
	Body []byte
}

// ConsumerTx is the consumer's transaction, lent to a handler for the duration of one call: the
// inbox mark of the message's key is already in it, and what the handler writes through it
// commits (or rolls back) together with the mark. The consumer commits or rolls it back when
// the handler returns: there is no Commit or Rollback, and a statement that would end the
// transaction (COMMIT, ROLLBACK, BEGIN, SET autocommit, DDL, ...) is refused with
// ErrInvalidArgument. It must not be kept: once the handler has returned, every call fails with
// ErrTxFinished. One call at a time (calls from several goroutines of a handler are serialised).
type ConsumerTx struct {
	mu  sync.Mutex
	h   *C.outbox_tx
	ctx context.Context
}

// Context is the handler call's context: cancelled when the consumer's Stop (or Close) begins,
// so a handler waiting on something slow (an HTTP call, a channel) can give up. A handler that
// returns the context's error (errors.Is(err, context.Canceled)) is not charged an attempt: the
// message is rolled back and left to the next owner of its queue.
func (t *ConsumerTx) Context() context.Context {
	if t.ctx == nil {
		return context.Background()
	}
	return t.ctx
}

func (t *ConsumerTx) with(f func(h *C.outbox_tx) error) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.h == nil {
		return goError(CodeTxFinished, "the consumer's transaction is no longer usable: the handler call it was lent to "+
			"has returned and the consumer committed or rolled it back (do not keep a ConsumerTx)")
	}
	err := f(t.h)
	runtime.KeepAlive(t)
	return err
}

// end makes the transaction unusable; it waits for a call in progress on another goroutine.
func (t *ConsumerTx) end() {
	t.mu.Lock()
	t.h = nil
	t.mu.Unlock()
}

// Exec runs a statement with ? placeholders bound to args (never interpolated; the parameter
// types of Tx.Exec). A statement the database refuses fails with ErrStatement and the
// transaction goes on; a transient failure (lock wait timeout, deadlock, lost connection) fails
// with ErrDatabase, whose Retriable() is true: return it (wrapped or not) and the message is
// retried without using an attempt.
func (t *ConsumerTx) Exec(query string, args ...any) (Result, error) {
	return txExec(t.with, query, args)
}

// QueryInt64 runs a query in the transaction and reads the first column of its first row as an
// integer; found is false when there was no row or the value was NULL.
func (t *ConsumerTx) QueryInt64(query string, args ...any) (value int64, found bool, err error) {
	return txQueryInt64(t.with, query, args)
}

// ErrTransient marks a handler's error as transient: the consumer rolls back and retries the
// message after a backoff without using an attempt (see Transient). Match it with errors.Is.
var ErrTransient = errors.New("outbox: transient failure")

// Transient wraps err (nil stays nil) so that a consumer treats it as transient: rolled back
// and retried after a backoff, without using one of consumer.max.attempts, however often it
// happens. For conditions that are not the message's fault (a downstream service briefly
// unavailable). errors.Is(Transient(err), ErrTransient) is true; errors.Is/As also see err.
func Transient(err error) error {
	if err == nil {
		return nil
	}
	return &transientError{err}
}

type transientError struct{ err error }

func (e *transientError) Error() string        { return e.err.Error() }
func (e *transientError) Unwrap() error        { return e.err }
func (e *transientError) Is(target error) bool { return target == ErrTransient }

// IsTransient reports whether a consumer treats a handler's error as transient: it matches
// ErrTransient (Transient), or an *Error in its chain is Retriable() (what ConsumerTx.Exec
// returns on a lock wait timeout, a deadlock or a lost connection).
func IsTransient(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, ErrTransient) {
		return true
	}
	var oe *Error
	return errors.As(err, &oe) && oe.Retriable()
}

// handlerPanic is the failure reported for a handler that panicked (never transient).
type handlerPanic struct{ value any }

func (p *handlerPanic) Error() string { return fmt.Sprintf("the handler panicked: %v", p.value) }

// codeHandlerFailed is returned to the library for a handler's error that is neither transient
// nor an *Error: not a result code, so never retriable (the dead letter's last_error reads
// "handler returned -1: <the error>").
const codeHandlerFailed = -1

// outcome is what the callback returns to the library for a handler's error (see
// outbox_consume_cb): a retriable result code for a transient error (no attempt used), a
// non-retriable one otherwise (an attempt).
func outcome(err error) C.int {
	var p *handlerPanic
	if errors.As(err, &p) {
		return C.int(CodePanic)
	}
	var oe *Error
	hasCode := errors.As(err, &oe) && oe.Code != CodeOK
	// A handler giving up because the consumer stops: no attempt (the next owner handles it).
	if IsTransient(err) || errors.Is(err, context.Canceled) {
		if hasCode && oe.Code.Retriable() {
			return C.int(oe.Code)
		}
		return C.int(CodeDatabase)
	}
	if hasCode && !oe.Code.Retriable() {
		return C.int(oe.Code)
	}
	return codeHandlerFailed
}

// consumerState is what the library's callbacks reach through the consumer's cgo.Handle: the
// handler, and names for the log.
type consumerState struct {
	each         func(*ConsumerTx, *Message) error
	batch        func(*ConsumerTx, []*Message) error
	topic, group string
	// ctx is every handler call's context (ConsumerTx.Context), cancelled by Stop.
	ctx context.Context
}

// run calls the handler on msgs in the lent transaction h and returns the callback's result,
// with the error's text in errBuf.
func (s *consumerState) run(h *C.outbox_tx, msgs []*Message, errBuf *C.char, errSize C.size_t) C.int {
	tx := &ConsumerTx{h: h, ctx: s.ctx}
	err := s.call(tx, msgs)
	tx.end()
	if err == nil {
		return 0
	}
	writeCString(errBuf, errSize, err.Error())
	return outcome(err)
}

// call runs the handler on a goroutine of its own and waits for it, so that neither a panic nor
// runtime.Goexit (t.FailNow, ...) in the handler can reach the library's frames: both end as a
// failure of the call. A per-message handler runs on each message of the call in turn (the
// library calls once per batch: one cgo crossing and one goroutine per batch, not per message;
// the first error ends the call, and the runtime handles the batch again one message per call).
func (s *consumerState) call(tx *ConsumerTx, msgs []*Message) error {
	done := make(chan error, 1)
	go func() {
		returned := false
		current := msgs[0]
		defer func() {
			if returned {
				return
			}
			p := recover()
			if p == nil {
				done <- errors.New("the handler did not return: it called runtime.Goexit (t.FailNow, ...) or panicked with nil")
				return
			}
			logFromGo(LogError, "outbox::go::consumer", fmt.Sprintf("consumer %s (topic %s): the handler panicked on key %q: %v\n%s",
				s.group, s.topic, current.Key, p, debug.Stack()))
			done <- &handlerPanic{value: p}
		}()
		var err error
		if s.batch != nil {
			err = s.batch(tx, msgs)
		} else {
			for _, m := range msgs {
				current = m
				if err = s.each(tx, m); err != nil {
					break
				}
			}
		}
		returned = true
		done <- err
	}()
	return <-done
}

// writeCString writes text into the C buffer buf of size bytes, NUL-terminated, cut at a
// character boundary (ending with "...") when it does not fit; NUL bytes become "\0".
func writeCString(buf *C.char, size C.size_t, text string) {
	if buf == nil || size == 0 {
		return
	}
	max := int(size) - 1
	text = strings.ReplaceAll(text, "\x00", `\0`)
	if len(text) > max {
		cut := max - 3
		if cut < 0 {
			cut = 0
		}
		for cut > 0 && !utf8.RuneStart(text[cut]) {
			cut--
		}
		text = text[:cut] + "..."
		if len(text) > max {
			text = text[:max]
		}
	}
	dst := unsafe.Slice((*byte)(unsafe.Pointer(buf)), int(size))
	copy(dst, text)
	dst[len(text)] = 0
}

// goMessage copies a message view of the library into Go memory.
func goMessage(m *C.outbox_message) (*Message, error) {
	msg := &Message{
		Key:         C.GoString(m.key),
		Topic:       C.GoString(m.topic),
		Broker:      C.GoString(m.broker),
		QueueID:     uint32(m.queue_id),
		QueueOffset: int64(m.queue_offset),
		MsgID:       C.GoString(m.msg_id),
		Tag:         C.GoString(m.tag),
		Properties:  map[string]string{},
		Body:        []byte{},
	}
	if n := int(m.body_len); n > 0 && m.body != nil {
		msg.Body = make([]byte, n)
		copy(msg.Body, unsafe.Slice((*byte)(unsafe.Pointer(m.body)), n))
	}
	if m.properties_json != nil {
		if err := json.Unmarshal([]byte(C.GoString(m.properties_json)), &msg.Properties); err != nil {
			return nil, goError(CodeInvalidArgument, "the properties of the message at %s queue %d offset %d are not a JSON object of strings: %v",
				msg.Topic, msg.QueueID, msg.QueueOffset, err)
		}
		if msg.Properties == nil { // "null"
			msg.Properties = map[string]string{}
		}
	}
	return msg, nil
}

// Consumer is a running consumer (StartConsumer, StartBatchConsumer), or a stopped one that
// still reports its final counts. Its methods are safe for concurrent use, except that Stop and
// Close must not be called from its own handler (they wait for the handlers to return).
type Consumer struct {
	// busy counts the Stop and Close calls under way (Stats does not wait for them).
	busy    atomic.Int32
	mu      sync.RWMutex
	h       *C.outbox_consumer
	stopped bool
	handle  cgo.Handle
	// cancel cancels the handlers' context (ConsumerTx.Context) when a stop begins.
	cancel context.CancelFunc
}

// MigrateConsumer applies the consuming half's pending migrations alone: the inbox and the
// consumer dead-letter tables, none of the relay's (Migrate is for a database that relays). Only
// "db.url" is read; its database must exist. Safe to run from several processes at once.
func MigrateConsumer(cfg Config) error {
	conf, err := newConf(cfg.Settings)
	if err != nil {
		return err
	}
	defer C.outbox_conf_free(conf)
	return call(func() C.enum_outbox_result { return C.outbox_migrate_consumer(conf, nil, 0) })
}

// StartConsumer starts a consumer of topic for the consumer group, running handler once per
// new event key in the consumer's transaction:
//
//   - nil commits the handler's writes with the key's inbox mark; the message is done;
//   - a transient error (IsTransient: an *Error whose Retriable() is true, as ConsumerTx.Exec
//     returns on a lock wait timeout, a deadlock or a lost connection, or an error wrapped with
//     Transient) rolls back and retries after a backoff without using an attempt;
//   - any other error, or a panic (recovered, never crossing into the library), rolls back and
//     uses an attempt: retried with backoff, and after consumer.max.attempts the message is
//     parked in the dead-letter table (inbox.dead_letter.table) with the error's text as
//     last_error, and its queue moves on.
//
// A copy of an event the group already processed does not run the handler (a duplicate,
// counted). The handler runs on the consumer's threads (consumer.threads, default 4), several
// at once: it must be safe for concurrent use. The messages of one route value (consumer.route;
// by default, of one queue) are handled in order.
//
// cfg.Settings holds the library's keys: "db.url" (the database of the inbox and of the
// handler's transaction; run MigrateConsumer first), "rocketmq.namesrv", and the consumer.* and inbox.*
// keys (threads, batch.max, max.attempts, backoff, start.from, tables, retention).
// cfg.OnDeadLetter is not used by a consumer. A name server or broker that cannot be reached
// does not fail the start: the consumer keeps trying and Stats says why (Healthy false). Errors
// are *Error: ErrNullArgument for a nil handler, ErrInvalidArgument for an empty topic,
// ErrInvalidEvent for a bad group, ErrUnknownKey / ErrInvalidValue for a bad setting (named),
// ErrPublisher when the library was built without the rocketmq feature, database errors when
// the inbox tables are missing or the database cannot be reached.
//
// Stop it, then Close it (Close alone also stops it). A Consumer that becomes unreachable is
// closed by a finalizer: keep a reference for as long as it should run (defer c.Close()).
func StartConsumer(cfg Config, topic, group string, handler func(tx *ConsumerTx, m *Message) error) (*Consumer, error) {
	if handler == nil {
		return nil, goError(CodeNullArgument, "StartConsumer: the handler is nil")
	}
	return startConsumer(cfg, topic, group, &consumerState{each: handler, topic: topic, group: group})
}

// StartBatchConsumer is StartConsumer with a handler given a batch's new messages at once, in
// route order (consumer.route; by default queue order), in one transaction (for handlers that
// write many rows in one statement): with consumer.batch.max above 1 (default 128) a handler
// thread takes the messages waiting for it, marks their keys, and calls handler with the new
// ones (duplicates left out). An error rolls
// the whole batch back and the batch is handled again one message per call, so that only the
// failing message is retried and parked; the outcome rules of StartConsumer apply to those
// calls.
func StartBatchConsumer(cfg Config, topic, group string, handler func(tx *ConsumerTx, ms []*Message) error) (*Consumer, error) {
	if handler == nil {
		return nil, goError(CodeNullArgument, "StartBatchConsumer: the handler is nil")
	}
	return startConsumer(cfg, topic, group, &consumerState{batch: handler, topic: topic, group: group})
}

func startConsumer(cfg Config, topic, group string, st *consumerState) (*Consumer, error) {
	if topic == "" {
		return nil, goError(CodeInvalidArgument, "the consumer's topic is empty")
	}
	ct, err := cString(topic, "the consumer's topic", CodeInvalidArgument)
	if err != nil {
		return nil, err
	}
	defer C.free(unsafe.Pointer(ct))
	cg, err := cString(group, "consumer_group", CodeInvalidEvent)
	if err != nil {
		return nil, err
	}
	defer C.free(unsafe.Pointer(cg))
	conf, err := newConf(cfg.Settings)
	if err != nil {
		return nil, err
	}
	// outbox_consumer_start only reads the conf.
	defer C.outbox_conf_free(conf)
	var cancel context.CancelFunc
	st.ctx, cancel = context.WithCancel(context.Background())
	handle := cgo.NewHandle(st)
	var h *C.outbox_consumer
	err = call(func() C.enum_outbox_result {
		return C.outbox_go_consumer_start(conf, ct, cg, C.uintptr_t(handle), &h)
	})
	if err != nil {
		cancel()
		handle.Delete()
		return nil, err
	}
	c := &Consumer{h: h, handle: handle, cancel: cancel}
	runtime.SetFinalizer(c, (*Consumer).Close)
	return c, nil
}

// Stop stops the consumer: no new messages, each handler thread finishes the messages in hand,
// offsets are committed and stored with the broker, the consumer leaves its group. It blocks
// until then (the broker side's shutdown is given a few seconds; a handler still running is
// waited for; its ConsumerTx.Context is cancelled first). Afterwards Stats reports the final
// counts (Stopped true). Stopping again returns nil; after Close it fails with ErrStopped. Do
// not call it from the handler.
func (c *Consumer) Stop() error {
	c.busy.Add(1)
	defer c.busy.Add(-1)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.h == nil {
		return goError(CodeStopped, "the consumer is closed")
	}
	if c.stopped {
		return nil
	}
	c.cancel()
	err := call(func() C.enum_outbox_result { return C.outbox_consumer_stop(c.h) })
	runtime.KeepAlive(c)
	c.stopped = true
	if errors.Is(err, ErrStopped) {
		err = nil
	}
	return err
}

// Close stops the consumer if needed (returning that Stop's error, if any) and frees it.
// Idempotent: later calls return nil. Afterwards Stats and Stop fail with ErrStopped. A finalizer
// calls it for a consumer that becomes unreachable, but do not rely on it. Do not call it from
// the handler.
func (c *Consumer) Close() error {
	c.busy.Add(1)
	defer c.busy.Add(-1)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.h == nil {
		return nil
	}
	var err error
	if !c.stopped {
		c.cancel()
		err = call(func() C.enum_outbox_result { return C.outbox_consumer_stop(c.h) })
		if errors.Is(err, ErrStopped) {
			err = nil
		}
		c.stopped = true
	}
	C.outbox_consumer_free(c.h)
	runtime.KeepAlive(c)
	c.h = nil
	// No callback runs any more: the library joined the handler threads.
	c.handle.Delete()
	runtime.SetFinalizer(c, nil)
	return err
}

// ConsumerStats is a snapshot of a consumer's counters (totals since its start), as
// outbox_consumer_stats writes them.
type ConsumerStats struct {
	// Received: messages taken from the broker.
	Received uint64 `json:"received"`
	// Processed: messages whose handler ran and whose transaction committed.
	Processed uint64 `json:"processed"`
	// Duplicates: copies of keys the group had already processed (the handler did not run).
	Duplicates uint64 `json:"duplicates"`
	// FailedAttempts: handler attempts that failed (each retried or, the last, parked).
	// Transient failures are not attempts: they count in DBErrors.
	FailedAttempts uint64 `json:"failed_attempts"`
	// DeadLettered: messages parked in the dead-letter table.
	DeadLettered uint64 `json:"dead_lettered"`
	// ParkedCopies: later copies of a parked key, added to its dead letter.
	ParkedCopies uint64 `json:"parked_copies"`
	// Replayed: dead letters handled again after a replay request.
	Replayed uint64 `json:"replayed"`
	// DBErrors: transient failures (database, or a handler's transient error) retried without
	// using an attempt.
	DBErrors uint64 `json:"db_errors"`
	// FallbackKeys: messages without the eventKey property (keyed by a fallback).
	FallbackKeys uint64 `json:"fallback_keys"`
	// Transactions: handler transactions committed (one per batch, or per message).
	Transactions uint64 `json:"transactions"`
	// BatchFallbacks: batches rolled back and handled again one message per transaction.
	BatchFallbacks uint64 `json:"batch_fallbacks"`
	// BatchRetries: batches rolled back by a deadlock or a lock wait timeout and run again as
	// a batch (no attempt used).
	BatchRetries uint64 `json:"batch_retries"`
	// InFlight: messages handed to handler threads and not yet done.
	InFlight uint64 `json:"in_flight"`
	// Lag: messages on the assigned queues not yet committed; nil until known (no queue
	// assigned yet, or the broker not answering).
	Lag *uint64 `json:"lag"`
	// Healthy says whether the consumer can take messages now; Unhealthy says why not ("" when
	// healthy): the name server or broker unreachable, no queue of the topic assigned, ...
	Healthy   bool   `json:"healthy"`
	Unhealthy string `json:"unhealthy"`
	// Stopped: the consumer was stopped; these are its final counts.
	Stopped bool `json:"stopped"`
	// Raw is the JSON as the library wrote it (it may hold fields newer than this struct).
	Raw json.RawMessage `json:"-"`
}

// Stats returns a snapshot of the counters; after Stop, the final counts (Stopped true). While
// a Stop or Close is under way it does not wait (a handler may be what Stop waits for): it
// fails with ErrStopped, as it does after Close.
func (c *Consumer) Stats() (ConsumerStats, error) {
	var s ConsumerStats
	if !c.mu.TryRLock() {
		if c.busy.Load() > 0 {
			return s, goError(CodeStopped, "the consumer is being stopped or closed (Stats answers again once Stop has returned)")
		}
		c.mu.RLock()
	}
	defer c.mu.RUnlock()
	if c.h == nil {
		return s, goError(CodeStopped, "the consumer is closed")
	}
	js, err := readString(func(buf *C.char, n C.size_t, needed *C.size_t) C.enum_outbox_result {
		return C.outbox_consumer_stats(c.h, buf, n, needed)
	})
	runtime.KeepAlive(c)
	if err != nil {
		return s, err
	}
	if err := json.Unmarshal([]byte(js), &s); err != nil {
		return s, goError(CodePanic, "the library's consumer stats are not the expected JSON: %v", err)
	}
	s.Raw = json.RawMessage(js)
	return s, nil
}
