package tests

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	outbox "github.com/outbox-rs/outbox/bindings/go"
)

// The trace context from a Go host (docs/tracing.md): the registered function's context of the
// enqueue's ctx is added when the event has none, an event's own wins, a malformed one is refused
// naming the header, and the consumer sees it unchanged through the broker.

type traceKey struct{}

func newTraceparent() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	b[0] |= 1
	b[16] |= 1
	return "00-" + hex.EncodeToString(b[:16]) + "-" + hex.EncodeToString(b[16:]) + "-01"
}

// fromContext is what an OpenTelemetry adapter does: the trace context current in ctx.
func fromContext(ctx context.Context) (string, string) {
	tp, _ := ctx.Value(traceKey{}).(string)
	return tp, "vendor=go"
}

func headersOf(t *testing.T, id int64) sql.NullString {
	t.Helper()
	var h sql.NullString
	if err := db.QueryRow("SELECT headers FROM t_event_record WHERE id = ?", id).Scan(&h); err != nil {
		t.Fatal(err)
	}
	return h
}

func enqueueIn(t *testing.T, ctx context.Context, r *outbox.Relay, ev outbox.Event) (int64, error) {
	t.Helper()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	id, err := outbox.EnqueueTx(ctx, tx, r, ev)
	if err != nil {
		_ = tx.Rollback()
		return 0, err
	}
	return id, tx.Commit()
}

func TestTraceContextOfTheEnqueuesContextIsStoredAndAnEventsOwnWins(t *testing.T) {
	r := start(t)
	outbox.SetTraceContext(fromContext)
	defer outbox.SetTraceContext(nil)
	current := newTraceparent()
	ctx := context.WithValue(context.Background(), traceKey{}, current)

	id, err := enqueueIn(t, ctx, r, orderEvent(unique("GO-TRACE")))
	if err != nil {
		t.Fatal(err)
	}
	h := headersOf(t, id).String
	if !strings.Contains(h, `"traceparent":"`+current+`"`) || !strings.Contains(h, `"tracestate":"vendor=go"`) {
		t.Fatalf("headers %s", h)
	}
	own := newTraceparent()
	ev := orderEvent(unique("GO-TRACE"))
	ev.Headers = map[string]string{"traceparent": own}
	id, err = enqueueIn(t, ctx, r, ev)
	if err != nil {
		t.Fatal(err)
	}
	if h := headersOf(t, id).String; !strings.Contains(h, own) || strings.Contains(h, current) {
		t.Fatalf("an event's own context wins: %s", h)
	}
	// No current trace in ctx: no header.
	id, err = enqueueIn(t, context.Background(), r, orderEvent(unique("GO-TRACE")))
	if err != nil {
		t.Fatal(err)
	}
	if h := headersOf(t, id); h.Valid {
		t.Fatalf("no trace, yet headers %s", h.String)
	}
}

func TestAMalformedTraceContextIsRefusedNamingTheHeader(t *testing.T) {
	r := start(t)
	outbox.SetTraceContext(func(context.Context) (string, string) { return "00-not-a-trace-01", "" })
	defer outbox.SetTraceContext(nil)
	order := unique("GO-BADTRACE")
	_, err := enqueueIn(t, context.Background(), r, orderEvent(order))
	if !errors.Is(err, outbox.ErrInvalidEvent) || !strings.Contains(err.Error(), "traceparent") ||
		!strings.Contains(err.Error(), "00-not-a-trace-01") {
		t.Fatalf("want an invalid event naming traceparent, got %v", err)
	}
	// A function that panics is not the event's fault: written without a context.
	outbox.SetTraceContext(func(context.Context) (string, string) { panic("no tracer") })
	id, err := enqueueIn(t, context.Background(), r, orderEvent(order))
	if err != nil {
		t.Fatal(err)
	}
	if h := headersOf(t, id); h.Valid {
		t.Fatalf("headers %s", h.String)
	}
	var n int
	_ = db.QueryRow("SELECT COUNT(*) FROM t_event_record WHERE biz_no = ?", order).Scan(&n)
	if n != 1 {
		t.Fatalf("%d rows of %s: the refused event was written", n, order)
	}
}

func TestTheConsumerSeesTheOrderServicesTraceContextThroughTheBroker(t *testing.T) {
	ct := newConsumerTest(t)
	current := newTraceparent()
	outbox.SetTraceContext(func(context.Context) (string, string) { return current, "" })
	defer outbox.SetTraceContext(nil)
	var mu sync.Mutex
	seen := map[string]string{}
	c, err := outbox.StartConsumer(outbox.Config{Settings: ct.settings()}, ct.topic, ct.group,
		func(tx *outbox.ConsumerTx, m *outbox.Message) error {
			mu.Lock()
			defer mu.Unlock()
			seen[m.Properties["bizNo"]] = m.Properties["traceparent"]
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ct.publish(order{BizNo: "GO-TRACED", Points: 1})
	deadline := time.Now().Add(120 * time.Second)
	for time.Now().Before(deadline) {
		mu.Lock()
		got, ok := seen["GO-TRACED"]
		mu.Unlock()
		if ok {
			if got != current {
				t.Fatalf("the consumer saw traceparent %q, want %q", got, current)
			}
			return
		}
		time.Sleep(50 * time.Millisecond) // polling for the handler, not standing in for a result
	}
	t.Fatal("the traced order never reached the consumer")
}
