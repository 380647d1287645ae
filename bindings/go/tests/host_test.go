package tests

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	outbox "github.com/outbox-rs/outbox/bindings/go"
)

// logCapture keeps the library's records while a test runs (SetLogFunc is process-wide, so these
// tests do not run in parallel).
type logCapture struct {
	mu      sync.Mutex
	records []outbox.LogRecord
}

func captureLogs(t *testing.T) *logCapture {
	c := &logCapture{}
	outbox.SetLogFunc(func(r outbox.LogRecord) {
		c.mu.Lock()
		c.records = append(c.records, r)
		c.mu.Unlock()
	})
	t.Cleanup(func() {
		outbox.SetLogFunc(nil)
		_ = outbox.SetLogLevel(outbox.LogInfo)
	})
	return c
}

func (c *logCapture) find(target, text string) (outbox.LogRecord, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range c.records {
		if r.Target == target && strings.Contains(r.Message, text) {
			return r, true
		}
	}
	return outbox.LogRecord{}, false
}

func TestLogRecordsReachTheHostWithLevelAndTarget(t *testing.T) {
	logs := captureLogs(t)
	if got := outbox.GetLogLevel(); got != outbox.LogInfo {
		t.Fatalf("default level %v", got)
	}
	r := start(t, "service.name", "golog")
	// outbox_start logs before it returns, on the calling thread.
	rec, ok := logs.find("outbox::relay", "enqueue-only")
	if !ok {
		t.Fatalf("no start record in %+v", logs.records)
	}
	if rec.Level != outbox.LogInfo || !strings.Contains(rec.Message, "golog-") {
		t.Fatalf("start record %+v", rec)
	}
	r.Close()
}

func TestLogRecordsFromAForeignThreadReachGo(t *testing.T) {
	logs := captureLogs(t)
	if err := StartOnAForeignThread(dbURL); err != nil {
		t.Fatal(err)
	}
	rec, ok := logs.find("outbox::relay", "cthread-")
	if !ok || rec.Level != outbox.LogInfo {
		t.Fatalf("no start record from the C thread in %+v", logs.records)
	}
}

func TestLogLevelSettingAndOff(t *testing.T) {
	logs := captureLogs(t)
	r := start(t, "log.level", "warn")
	if got := outbox.GetLogLevel(); got != outbox.LogWarn {
		t.Fatalf("level after log.level=warn: %v", got)
	}
	if rec, ok := logs.find("outbox::relay", "enqueue-only"); ok {
		t.Fatalf("INFO record below the threshold: %+v", rec)
	}
	r.Close()
	if err := outbox.SetLogLevel(outbox.LogOff); err != nil {
		t.Fatal(err)
	}
	start(t).Close()
	if n := len(logs.records); n != 0 {
		t.Fatalf("records with logging off: %+v", logs.records)
	}
	if err := outbox.SetLogLevel(outbox.LogLevel(9)); !errors.Is(err, outbox.ErrInvalidArgument) {
		t.Fatalf("level 9: %v", err)
	}
}

func TestPanickingLogFuncIsContained(t *testing.T) {
	captureLogs(t)
	outbox.SetLogFunc(func(outbox.LogRecord) { panic("a log handler that panics") })
	r := start(t)
	if err := r.Notify(); err != nil {
		t.Fatal(err)
	}
	r.Close()
}

func TestAccessDeniedAndUnknownDatabaseAreNotRetriable(t *testing.T) {
	denied := strings.Replace(dbURL, "mysql://root", "mysql://outbox_nobody:wrong", 1)
	_, err := outbox.Start(outbox.Config{Settings: map[string]string{"db.url": denied, "publisher": "none"}})
	var e *outbox.Error
	if !errors.As(err, &e) || !errors.Is(err, outbox.ErrDatabaseRefused) || e.Retriable() {
		t.Fatalf("access denied: %v", err)
	}
	if !strings.Contains(e.Message, "access denied") || strings.Contains(e.Message, "MySqlError") || strings.Contains(e.Message, "wrong") {
		t.Fatalf("access denied message: %q", e.Message)
	}
	_, err = outbox.Start(outbox.Config{Settings: map[string]string{"db.url": dbURL + "_missing", "publisher": "none"}})
	if !errors.Is(err, outbox.ErrDatabaseRefused) || err.(*outbox.Error).Retriable() {
		t.Fatalf("unknown database: %v", err)
	}
	if !strings.Contains(err.Error(), "unknown database") {
		t.Fatalf("unknown database message: %v", err)
	}
	_, err = outbox.Start(outbox.Config{Settings: map[string]string{"db.url": "mysql://root@127.0.0.1:99999/x"}})
	if !errors.Is(err, outbox.ErrInvalidValue) || strings.Contains(err.Error(), "ParseError {") {
		t.Fatalf("bad URL: %v", err)
	}
}

func TestBeginTxHonoursContextAndPoolWait(t *testing.T) {
	r := start(t, "db.pool.max", "1", "db.pool.wait.ms", "300")
	held, err := r.Begin()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := r.BeginTx(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("BeginTx past its context: %v", err)
	}
	_, err = r.Begin()
	if !errors.Is(err, outbox.ErrPoolTimeout) || !err.(*outbox.Error).Retriable() || !strings.Contains(err.Error(), "db.pool.max") {
		t.Fatalf("Begin on an exhausted pool: %v", err)
	}
	if err := held.Rollback(); err != nil {
		t.Fatal(err)
	}
	tx, err := r.BeginTx(context.Background())
	if err != nil {
		t.Fatalf("BeginTx once the connection is back: %v", err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	cancelled, cancelNow := context.WithCancel(context.Background())
	cancelNow()
	if _, err := r.BeginTx(cancelled); !errors.Is(err, context.Canceled) {
		t.Fatalf("BeginTx with a cancelled context: %v", err)
	}
}

func TestEnqueueTxAfterStopAndAfterCloseFailsTheSameWay(t *testing.T) {
	for _, how := range []string{"stop", "close"} {
		r, err := outbox.Start(outbox.Config{Settings: settings()})
		if err != nil {
			t.Fatal(err)
		}
		if how == "stop" {
			if err := r.Stop(context.Background()); err != nil {
				t.Fatal(err)
			}
		} else {
			r.Close()
		}
		tx, err := db.BeginTx(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		biz := "ORD-after-" + how
		_, err = outbox.EnqueueTx(context.Background(), tx, r, outbox.Event{BizNo: biz, EventType: "T", Payload: []byte("{}")})
		if !errors.Is(err, outbox.ErrStopped) {
			t.Fatalf("EnqueueTx after %s: %v", how, err)
		}
		if _, err := r.Begin(); !errors.Is(err, outbox.ErrStopped) {
			t.Fatalf("Begin after %s: %v", how, err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if n := count(t, "SELECT COUNT(*) FROM t_event_record WHERE biz_no = ?", biz); n != 0 {
			t.Fatalf("%d rows enqueued after %s", n, how)
		}
		r.Close()
	}
}

func TestStatsCarryLatency(t *testing.T) {
	r := start(t)
	s, err := r.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if s.Latency.Count != 0 || s.Latency.P99Ms != 0 || !strings.Contains(string(s.Raw), `"latency"`) {
		t.Fatalf("latency before any delivery: %+v in %s", s.Latency, s.Raw)
	}
}

func TestOneDatabaseSettingForDriverAndLibrary(t *testing.T) {
	dsn, err := outbox.DSNFromURL(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.Ping(); err != nil {
		t.Fatalf("driver with %q: %v", dsn, err)
	}
	// The driver's spelling works as the library's db.url too.
	r, err := outbox.Start(outbox.Config{Settings: map[string]string{"db.url": dsn + "?parseTime=true", "publisher": "none"}})
	if err != nil {
		t.Fatalf("Start with a DSN: %v", err)
	}
	r.Close()
	u, err := outbox.URLFromDSN("app:p@ss:w@rd@tcp(db.internal:3307)/shop?parseTime=true")
	if err != nil || u != "mysql://app:p%40ss%3Aw%40rd@db.internal:3307/shop" {
		t.Fatalf("URLFromDSN: %q %v", u, err)
	}
	back, err := outbox.DSNFromURL(u)
	if err != nil || back != "app:p@ss:w@rd@tcp(db.internal:3307)/shop" {
		t.Fatalf("DSNFromURL: %q %v", back, err)
	}
	if _, err := outbox.URLFromDSN("app:secret@unix(/tmp/x.sock)/shop"); !errors.Is(err, outbox.ErrInvalidValue) || strings.Contains(err.Error(), "secret") {
		t.Fatalf("unix DSN: %v", err)
	}
}

// A fleet's keys from Go: a bad shard list is refused naming the key, never its password, and a
// relay given shards says that a fleet serves them (outboxd).
func TestShardKeysAreCheckedAndARelayPointsToTheFleet(t *testing.T) {
	_, err := outbox.Start(outbox.Config{Settings: map[string]string{
		"db.url": dbURL, "publisher": "none", "shards": "mysql://u:pw1@h/o_{3..1}"}})
	if !errors.Is(err, outbox.ErrInvalidValue) || !strings.Contains(err.Error(), "shards") ||
		!strings.Contains(err.Error(), "runs backwards") || strings.Contains(err.Error(), "pw1") {
		t.Fatalf("bad shard list: %v", err)
	}
	_, err = outbox.Start(outbox.Config{Settings: map[string]string{
		"db.url": dbURL, "publisher": "none", "shard.workers": "2", "shards": "mysql://root@127.0.0.1:3306/o_{0..3}"}})
	if !errors.Is(err, outbox.ErrInvalidValue) || !strings.Contains(err.Error(), "fleet") {
		t.Fatalf("a relay given shards: %v", err)
	}
	// Relays splitting a fleet: the lease is bounded, the coordination URL's password hidden.
	_, err = outbox.Start(outbox.Config{Settings: map[string]string{
		"db.url": dbURL, "publisher": "none", "shard.lease.ms": "999"}})
	if !errors.Is(err, outbox.ErrInvalidValue) || !strings.Contains(err.Error(), "shard.lease.ms") {
		t.Fatalf("a lease under a second: %v", err)
	}
	_, err = outbox.Start(outbox.Config{Settings: map[string]string{
		"db.url": dbURL, "publisher": "none", "shard.coordination.url": "mysql://u:pw9@h:port/x"}})
	if !errors.Is(err, outbox.ErrInvalidValue) || !strings.Contains(err.Error(), "shard.coordination.url") ||
		strings.Contains(err.Error(), "pw9") {
		t.Fatalf("a bad coordination URL: %v", err)
	}
	// A catalog of shards: a Relay given one points to the fleet.
	_, err = outbox.Start(outbox.Config{Settings: map[string]string{
		"db.url": dbURL, "publisher": "none", "shard.catalog.url": "mysql://root@127.0.0.1:3306/catalog"}})
	if !errors.Is(err, outbox.ErrInvalidValue) || !strings.Contains(err.Error(), "shard.catalog.url") ||
		!strings.Contains(err.Error(), "fleet") {
		t.Fatalf("a relay given a catalog: %v", err)
	}
}
