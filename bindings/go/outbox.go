// Package outbox is the Go binding of the outbox relay: a transactional outbox from MySQL/MariaDB
// to Apache RocketMQ. It is a thin cgo layer over the C ABI (include/outbox.h, liboutbox.so).
//
// An order service writes its order and an event row in one local transaction; relays (in this
// process, in other instances, or outboxd) send committed rows to the broker. Two ways to enqueue:
//
//   - a library-owned transaction: relay.Begin(), tx.Exec(...) for the business statements,
//     tx.Enqueue(event), tx.Commit() (which wakes the relay at once);
//   - your own database/sql transaction: EnqueueTx(ctx, sqlTx, relay, event) inserts the row with
//     your driver using the library's statement; after sqlTx.Commit() call relay.Notify().
//
// On the consuming side, StartConsumer runs the library's consumer runtime with a Go handler: it
// subscribes a topic with a consumer group and runs the handler once per new event key inside
// the consumer's transaction (ConsumerTx), which also holds the key's inbox mark; offsets are
// committed after the database commit, failures retried, poison messages parked. A service with
// its own RocketMQ client uses Inbox instead (pure Go, on its own *sql.Tx, any driver):
// inbox.ProcessTx(ctx, tx, group, key, msg, handler), the key from EventKey(message properties).
//
// Linking: the package carries its C header (outbox.h, the library's include/outbox.h). On
// linux/amd64 the released module (go get github.com/outbox-rs/outbox/bindings/go) also
// carries the library, built with RocketMQ support (lib/linux-amd64/liboutbox.a), and links it
// statically by default: no Rust toolchain and no flags are needed. To link a library you built
// yourself (any platform; a checkout of the repository, which has no lib/), point the linker at
// it and choose with a build tag:
//
//	CGO_LDFLAGS="-L$LIB -Wl,-rpath,$LIB" go build -tags outbox_dynamic ./...
//	CGO_LDFLAGS="-L$LIB" go build -tags outbox_static ./...
//
// with LIB the cargo output directory holding liboutbox.so / liboutbox.a (the rpath lets the
// program find the shared library without LD_LIBRARY_PATH). On a platform the module has no
// library for, -loutbox (outbox_dynamic) is the default.
package outbox

/*
#cgo CFLAGS: -I${SRCDIR}
#include <stdlib.h>
#include <stdint.h>
#include "outbox.h"

// Declared by callback.go (//export); the trampoline turns the void* back into the handle.
extern void outboxGoDeadLetter(uintptr_t handle, outbox_dead_letter *letter);

static void outbox_go_dead_letter_trampoline(void *user_data, const outbox_dead_letter *letter) {
	outboxGoDeadLetter((uintptr_t)user_data, (outbox_dead_letter *)letter);
}

static enum outbox_result outbox_go_set_dead_letter(outbox_conf *conf, uintptr_t handle) {
	return outbox_conf_set_dead_letter_cb(conf, outbox_go_dead_letter_trampoline, (void *)handle);
}
*/
import "C"

import (
	"context"
	"encoding/json"
	"runtime"
	"runtime/cgo"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// Config configures a relay.
type Config struct {
	// Settings are the library's configuration keys and values, as in the Rust Config and
	// outbox_conf_set: "db.url" (required), "publisher" ("rocketmq" or "none"), "table",
	// "scan.interval.ms", "rocketmq.namesrv", ...
	Settings map[string]string
	// OnDeadLetter, if set, is called once per event that ends dead-lettered. It runs on a relay
	// thread, possibly several at once; keep it short. It is never called after Close returns.
	OnDeadLetter func(DeadLetter)
}

// DeadLetter is an event that ended FAIL after its last attempt.
type DeadLetter struct {
	ID         uint64
	BizNo      string
	EventType  string
	RetryCount uint32
	LastError  string
}

// DefaultStopTimeout is the deadline of Stop when its context has none.
const DefaultStopTimeout = 30 * time.Second

// Version is the version of the linked library.
func Version() string { return C.GoString(C.outbox_version()) }

// InsertParams names the parameters of Relay.InsertStatement, in order.
func InsertParams() []string {
	return paramNames(int(C.outbox_insert_param_count()))
}

// InsertScheduledParams names the parameters of Relay.InsertScheduledStatement, in order: those
// of InsertParams, then deliver_at_ms and delay_ms.
func InsertScheduledParams() []string {
	return paramNames(int(C.outbox_insert_scheduled_param_count()))
}

// paramNames is the first n names of the scheduled INSERT's parameters (the plain INSERT's are
// its first ones).
func paramNames(n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = C.GoString(C.outbox_insert_param_name(C.size_t(i)))
	}
	return names
}

// cString copies s into C memory; what names it in errors. Strings with a NUL byte cannot be
// passed to the C ABI.
func cString(s, what string, code Code) (*C.char, error) {
	if strings.IndexByte(s, 0) >= 0 {
		return nil, goError(code, "%s contains a NUL byte", what)
	}
	return C.CString(s), nil
}

// newConf builds an outbox_conf from the settings; the caller frees or consumes it.
func newConf(settings map[string]string) (*C.outbox_conf, error) {
	conf := C.outbox_conf_new()
	if conf == nil {
		return nil, goError(CodePanic, "outbox_conf_new failed")
	}
	if u, ok := settings["db.url"]; ok && u != "" && !strings.Contains(u, "://") {
		// A Go MySQL driver DSN (user:pass@tcp(host:port)/db): the library's spelling derived.
		converted, err := URLFromDSN(u)
		if err != nil {
			C.outbox_conf_free(conf)
			return nil, err
		}
		copied := make(map[string]string, len(settings))
		for k, v := range settings {
			copied[k] = v
		}
		copied["db.url"] = converted
		settings = copied
	}
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		ck, err := cString(k, "configuration key "+k, CodeUnknownKey)
		if err != nil {
			C.outbox_conf_free(conf)
			return nil, err
		}
		cv, err := cString(settings[k], "value of "+k, CodeInvalidValue)
		if err != nil {
			C.free(unsafe.Pointer(ck))
			C.outbox_conf_free(conf)
			return nil, err
		}
		err = call(func() C.enum_outbox_result { return C.outbox_conf_set(conf, ck, cv, nil, 0) })
		C.free(unsafe.Pointer(ck))
		C.free(unsafe.Pointer(cv))
		if err != nil {
			C.outbox_conf_free(conf)
			return nil, err
		}
	}
	return conf, nil
}

// Migrate applies the pending schema migrations to the configured table (its database must
// exist). Call it before Start, which fails when the table is missing. Safe to run from several
// processes at once.
func Migrate(cfg Config) error {
	conf, err := newConf(cfg.Settings)
	if err != nil {
		return err
	}
	defer C.outbox_conf_free(conf)
	return call(func() C.enum_outbox_result { return C.outbox_migrate(conf, nil, 0) })
}

// Relay is a started relay (or, with publisher=none, an enqueue-only instance). Its methods are
// safe for concurrent use. Stop it, then Close it; Close alone also stops it.
type Relay struct {
	// stopped is set by the first Stop: from then on no path enqueues through this relay.
	stopped atomic.Bool
	mu      sync.RWMutex
	h       *C.outbox_relay
	dl      cgo.Handle
	inserts [2]insert // due now, scheduled
}

// insert is one of a relay's INSERTs and its parameter names, read once from the library.
type insert struct {
	once   sync.Once
	sql    string
	params []string
	err    error
}

// Start starts a relay.
func Start(cfg Config) (*Relay, error) {
	conf, err := newConf(cfg.Settings)
	if err != nil {
		return nil, err
	}
	var dl cgo.Handle
	if cfg.OnDeadLetter != nil {
		dl = cgo.NewHandle(cfg.OnDeadLetter)
		if err := call(func() C.enum_outbox_result { return C.outbox_go_set_dead_letter(conf, C.uintptr_t(dl)) }); err != nil {
			dl.Delete()
			C.outbox_conf_free(conf)
			return nil, err
		}
	}
	var h *C.outbox_relay
	// outbox_start consumes the conf whether it succeeds or not.
	if err := call(func() C.enum_outbox_result { return C.outbox_start(conf, &h, nil, 0) }); err != nil {
		if dl != 0 {
			dl.Delete()
		}
		return nil, err
	}
	r := &Relay{h: h, dl: dl}
	runtime.SetFinalizer(r, (*Relay).Close)
	return r, nil
}

// with runs f with the live handle under the read lock, or returns ErrStopped after Close.
func (r *Relay) with(f func(h *C.outbox_relay) error) error {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.h == nil {
		return goError(CodeStopped, "the relay is closed")
	}
	err := f(r.h)
	runtime.KeepAlive(r)
	return err
}

// Notify wakes the relay so committed events are dispatched now rather than at the next scan.
// Call it after committing a database/sql transaction that used EnqueueTx. Never blocks.
func (r *Relay) Notify() error {
	return r.with(func(h *C.outbox_relay) error {
		return call(func() C.enum_outbox_result { return C.outbox_notify(h) })
	})
}

// Stop stops claiming, lets sends in flight finish, returns unsent claimed events and ends the
// relay threads, waiting at most until ctx's deadline (DefaultStopTimeout if it has none; the
// wait cannot be cut short by cancellation alone). It returns an error matching ErrTimedOut when
// the deadline passed first; a later Stop waits for the threads still running, up to its own
// deadline. Once they have ended, later calls return nil at once. After it, Notify, Begin,
// BeginTx, Tx.Enqueue and EnqueueTx fail with ErrStopped (as after Close: a stopped relay
// enqueues nothing, whichever path); Stats and InsertStatement still work. Transactions begun
// before can still commit or roll back.
func (r *Relay) Stop(ctx context.Context) error {
	r.stopped.Store(true)
	timeout := DefaultStopTimeout
	if d, ok := ctx.Deadline(); ok {
		timeout = time.Until(d)
		if timeout < 0 {
			timeout = 0
		}
	}
	return r.with(func(h *C.outbox_relay) error {
		return call(func() C.enum_outbox_result { return C.outbox_stop(h, C.uint64_t(timeout.Milliseconds())) })
	})
}

// Close stops the relay if needed and frees it. Idempotent and safe to call concurrently with
// other methods (they then fail with ErrStopped). After it returns OnDeadLetter is never called.
// Transactions begun earlier remain usable until they end. A finalizer calls it for a relay
// that becomes unreachable, but do not rely on it.
func (r *Relay) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.h == nil {
		return nil
	}
	C.outbox_free(r.h)
	r.h = nil
	if r.dl != 0 {
		r.dl.Delete()
		r.dl = 0
	}
	runtime.SetFinalizer(r, nil)
	return nil
}

// Stats is a snapshot of a relay's counters and, when the database answered, its gauges.
type Stats struct {
	InstanceID     string  `json:"instance_id"`
	Claimed        uint64  `json:"claimed"`
	ClaimConflicts uint64  `json:"claim_conflicts"`
	ClaimRounds    uint64  `json:"claim_rounds"`
	Sent           uint64  `json:"sent"`
	Retried        uint64  `json:"retried"`
	DeadLettered   uint64  `json:"dead_lettered"`
	Reclaimed      uint64  `json:"reclaimed"`
	Renewed        uint64  `json:"renewed"`
	ReleasedUnsent uint64  `json:"released_unsent"`
	StaleAcks      uint64  `json:"stale_acks"`
	PublishCalls   uint64  `json:"publish_calls"`
	PublishPanics  uint64  `json:"publish_panics"`
	BreakerState   string  `json:"breaker_state"`
	BreakerOpened  uint64  `json:"breaker_opened"`
	BreakerClosed  uint64  `json:"breaker_closed"`
	DBErrors       uint64  `json:"db_errors"`
	InFlight       uint64  `json:"in_flight"`
	Gauges         *Gauges `json:"gauges"`
	// Latency of this relay's deliveries, from the row's commit to the broker's ack.
	Latency Latency `json:"latency"`
	// Raw is the JSON as the library wrote it (it may hold fields newer than this struct).
	Raw json.RawMessage `json:"-"`
}

// Gauges are counts read from the outbox table.
type Gauges struct {
	Wait            uint64 `json:"wait"`
	Sending         uint64 `json:"sending"`
	Fail            uint64 `json:"fail"`
	OldestWaitAgeMs uint64 `json:"oldest_wait_age_ms"`
}

// Latency aggregates commit → broker-ack times. P50Ms and P99Ms are upper bounds (powers of
// two, in ms) of the histogram buckets holding those percentiles; all zero before the first
// delivery.
type Latency struct {
	Count  uint64  `json:"count"`
	MeanMs float64 `json:"mean_ms"`
	MaxMs  float64 `json:"max_ms"`
	P50Ms  uint64  `json:"p50_ms"`
	P99Ms  uint64  `json:"p99_ms"`
}

// readString calls a C function following the library's buffer convention (out_needed, and
// OUTBOX_ERR_BUFFER_TOO_SMALL), growing the buffer as needed.
func readString(f func(buf *C.char, n C.size_t, needed *C.size_t) C.enum_outbox_result) (string, error) {
	size := C.size_t(4096)
	for attempt := 0; ; attempt++ {
		buf := (*C.char)(C.malloc(size))
		var needed C.size_t
		err := call(func() C.enum_outbox_result { return f(buf, size, &needed) })
		if err == nil {
			s := C.GoString(buf)
			C.free(unsafe.Pointer(buf))
			return s, nil
		}
		C.free(unsafe.Pointer(buf))
		if e, ok := err.(*Error); !ok || e.Code != CodeBufferTooSmall || attempt == 3 {
			return "", err
		}
		size = needed + 1024 // a later snapshot may be a little longer
	}
}

// Stats returns a snapshot of the counters (and database gauges).
func (r *Relay) Stats() (Stats, error) {
	var s Stats
	err := r.with(func(h *C.outbox_relay) error {
		js, err := readString(func(buf *C.char, n C.size_t, needed *C.size_t) C.enum_outbox_result {
			return C.outbox_stats(h, buf, n, needed)
		})
		if err != nil {
			return err
		}
		if err := json.Unmarshal([]byte(js), &s); err != nil {
			return goError(CodePanic, "the library's stats are not the expected JSON: %v", err)
		}
		s.Raw = json.RawMessage(js)
		return nil
	})
	return s, err
}

// InsertStatement is the parameterised INSERT that enqueues one event due now into the
// relay's table; its parameters are named by InsertParams. EnqueueTx uses it.
func (r *Relay) InsertStatement() (string, error) {
	ins := r.insert(false)
	return ins.sql, ins.err
}

// InsertScheduledStatement is the parameterised INSERT that enqueues one scheduled event into
// the relay's table; its parameters are named by InsertScheduledParams. EnqueueTx uses it for
// events with DeliverAt or DeliverAfter.
func (r *Relay) InsertScheduledStatement() (string, error) {
	ins := r.insert(true)
	return ins.sql, ins.err
}

func (r *Relay) insert(scheduled bool) *insert {
	i := 0
	if scheduled {
		i = 1
	}
	ins := &r.inserts[i]
	ins.once.Do(func() {
		ins.err = r.with(func(h *C.outbox_relay) error {
			var err error
			ins.sql, err = readString(func(buf *C.char, n C.size_t, needed *C.size_t) C.enum_outbox_result {
				if scheduled {
					return C.outbox_insert_scheduled_statement(h, buf, n, needed)
				}
				return C.outbox_insert_statement(h, buf, n, needed)
			})
			return err
		})
		if scheduled {
			ins.params = InsertScheduledParams()
		} else {
			ins.params = InsertParams()
		}
	})
	return ins
}

// Validate checks an event as Enqueue would (required fields, lengths, the relay's
// payload.max.bytes, topic characters, reserved headers), without writing anything.
func (r *Relay) Validate(ev Event) error {
	ce, err := newCEvent(ev)
	if err != nil {
		return err
	}
	defer ce.free()
	return r.validate(ce)
}

func (r *Relay) validate(ce *cEvent) error {
	return r.with(func(h *C.outbox_relay) error {
		return call(func() C.enum_outbox_result { return C.outbox_validate_event(h, ce.ev, nil, 0) })
	})
}
