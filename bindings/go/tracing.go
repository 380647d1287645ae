//go:build cgo

package outbox

import (
	"context"
	"fmt"
	"sync/atomic"
)

// The header (and message property) names of the W3C trace context an event carries from the
// order service to its consumers (docs/tracing.md).
const (
	TraceParentHeader = "traceparent"
	TraceStateHeader  = "tracestate"
)

// TraceContextFunc returns the W3C trace context current in ctx ("" for traceparent when there
// is none).
type TraceContextFunc func(ctx context.Context) (traceparent, tracestate string)

var traceContext atomic.Pointer[TraceContextFunc]

// SetTraceContext registers where the current trace context comes from (nil removes it). At
// enqueue, an event without a "traceparent" header gets f's context: EnqueueTx asks f with its
// ctx, Tx.Enqueue with context.Background(). The library checks the values (a malformed one is
// an error with CodeInvalidEvent naming the header), stores them with the row and sends them
// unchanged as the message properties "traceparent" and "tracestate".
//
// This binding does not depend on OpenTelemetry; with its Go API the adapter is:
//
//	outbox.SetTraceContext(func(ctx context.Context) (string, string) {
//		c := propagation.MapCarrier{}
//		propagation.TraceContext{}.Inject(ctx, c)
//		return c["traceparent"], c["tracestate"]
//	})
func SetTraceContext(f TraceContextFunc) {
	if f == nil {
		traceContext.Store(nil)
		return
	}
	traceContext.Store(&f)
}

// withTraceContext returns ev with the registered function's context of ctx added, when ev has
// none of its own. A function that panics is not the event's fault: ev goes without a context
// and the panic is logged.
func withTraceContext(ctx context.Context, ev Event) Event {
	p := traceContext.Load()
	if p == nil {
		return ev
	}
	if _, ok := ev.Headers[TraceParentHeader]; ok {
		return ev
	}
	tp, ts := func() (tp, ts string) {
		defer func() {
			if r := recover(); r != nil {
				logFromGo(LogWarn, "outbox::go::tracing", fmt.Sprintf("the trace context function panicked (%v); the event is written without a trace context", r))
				tp, ts = "", ""
			}
		}()
		return (*p)(ctx)
	}()
	if tp == "" {
		return ev
	}
	h := make(map[string]string, len(ev.Headers)+2)
	for k, v := range ev.Headers {
		h[k] = v
	}
	h[TraceParentHeader] = tp
	if ts != "" {
		h[TraceStateHeader] = ts
	}
	ev.Headers = h
	return ev
}
