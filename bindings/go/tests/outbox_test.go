package tests

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"

	outbox "github.com/outbox-rs/outbox/bindings/go"
)

// One database per test run, outbox_go_<random>, migrated through the library, dropped at the end.
var (
	dbName    string
	dbURL     string // for the library: mysql://user@host:port/db
	db        *sql.DB
	serverDSN string // for database/sql, without a database
)

func TestMain(m *testing.M) {
	server := os.Getenv("OUTBOX_TEST_MYSQL")
	if server == "" {
		server = "mysql://root@127.0.0.1:3306"
	}
	u, err := url.Parse(server)
	if err != nil {
		fmt.Fprintf(os.Stderr, "OUTBOX_TEST_MYSQL=%s: %v\n", server, err)
		os.Exit(2)
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	dbName = "outbox_go_" + hex.EncodeToString(b)
	serverDSN = fmt.Sprintf("%s@tcp(%s)/", u.User.String(), u.Host)
	admin, err := sql.Open("mysql", serverDSN)
	if err == nil {
		_, err = admin.Exec("CREATE DATABASE " + dbName)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "MariaDB at %s: %v\n", server, err)
		os.Exit(2)
	}
	dbURL = strings.TrimRight(server, "/") + "/" + dbName
	db, err = sql.Open("mysql", serverDSN+dbName)
	if err == nil {
		err = outbox.Migrate(outbox.Config{Settings: map[string]string{"db.url": dbURL}})
	}
	if err == nil {
		_, err = db.Exec(`CREATE TABLE t_order (id BIGINT AUTO_INCREMENT PRIMARY KEY,
			order_no VARCHAR(64) NOT NULL UNIQUE, qty BIGINT, price DOUBLE, note VARCHAR(200),
			paid BOOLEAN, blob_col VARBINARY(64), created DATETIME(6))`)
	}
	code := 2
	if err != nil {
		fmt.Fprintf(os.Stderr, "setting up %s: %v\n", dbName, err)
	} else {
		code = m.Run()
	}
	db.Close()
	_, _ = admin.Exec("DROP DATABASE IF EXISTS " + dbName)
	admin.Close()
	os.Exit(code)
}

func settings(extra ...string) map[string]string {
	s := map[string]string{"db.url": dbURL, "publisher": "none"}
	for i := 0; i+1 < len(extra); i += 2 {
		s[extra[i]] = extra[i+1]
	}
	return s
}

func start(t *testing.T, extra ...string) *outbox.Relay {
	t.Helper()
	r, err := outbox.Start(outbox.Config{Settings: settings(extra...)})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func count(t testing.TB, query string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

func unique(prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

func orderEvent(bizNo string) outbox.Event {
	return outbox.Event{BizNo: bizNo, EventType: "ORDER_CREATED", Payload: []byte(`{"order":"` + bizNo + `"}`)}
}

func TestVersionAndInsertParams(t *testing.T) {
	if outbox.Version() == "" {
		t.Fatal("empty version")
	}
	want := []string{"biz_no", "event_type", "payload", "topic", "tag", "headers"}
	if got := outbox.InsertParams(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("InsertParams = %v, want %v", got, want)
	}
	wantScheduled := append(want, "deliver_at_ms", "delay_ms")
	if got := outbox.InsertScheduledParams(); strings.Join(got, ",") != strings.Join(wantScheduled, ",") {
		t.Fatalf("InsertScheduledParams = %v, want %v", got, wantScheduled)
	}
	r := start(t)
	stmt, err := r.InsertStatement()
	if err != nil || !strings.HasPrefix(stmt, "INSERT INTO t_event_record") || strings.Count(stmt, "?") != len(want) ||
		strings.Contains(stmt, "next_retry_time") {
		t.Fatalf("InsertStatement = %q, %v", stmt, err)
	}
	scheduled, err := r.InsertScheduledStatement()
	if err != nil || !strings.Contains(scheduled, "next_retry_time") || strings.Count(scheduled, "?") != len(wantScheduled) {
		t.Fatalf("InsertScheduledStatement = %q, %v", scheduled, err)
	}
}

func TestLibraryOwnedTxCommitEnqueuesWithTheBusinessRow(t *testing.T) {
	r := start(t)
	order := unique("GO-LIB")
	tx, err := r.Begin()
	if err != nil {
		t.Fatal(err)
	}
	created := time.Date(2024, 5, 6, 7, 8, 9, 123456000, time.UTC)
	res, err := tx.Exec("INSERT INTO t_order (order_no, qty, price, note, paid, blob_col, created) VALUES (?, ?, ?, ?, ?, ?, ?)",
		order, 3, 9.5, sql.NullString{}, true, []byte{0, 1, 0xff}, created)
	if err != nil {
		t.Fatal(err)
	}
	var sqlRes sql.Result = res // read as database/sql's
	if n, err := sqlRes.RowsAffected(); n != 1 || err != nil {
		t.Fatalf("RowsAffected = %d, %v", n, err)
	}
	if id, err := sqlRes.LastInsertId(); id <= 0 || err != nil {
		t.Fatalf("LastInsertId = %d, %v", id, err)
	}
	ev := orderEvent(order)
	ev.Topic, ev.Tag = "GO_TOPIC", "created"
	ev.Headers = map[string]string{"traceId": "t-1", "source": "go <test>"}
	id, err := tx.Enqueue(ev)
	if err != nil || id == 0 {
		t.Fatalf("Enqueue = %d, %v", id, err)
	}
	n, found, err := tx.QueryInt64("SELECT COUNT(*) FROM t_event_record WHERE biz_no = ?", order)
	if err != nil || !found || n != 1 {
		t.Fatalf("inside the tx: %d %v %v", n, found, err)
	}
	if c := count(t, "SELECT COUNT(*) FROM t_event_record WHERE biz_no = ?", order); c != 0 {
		t.Fatalf("visible before commit: %d", c)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	var status, topic, tag, headers, payload string
	err = db.QueryRow("SELECT status, topic, tag, headers, payload FROM t_event_record WHERE id = ?", id).
		Scan(&status, &topic, &tag, &headers, &payload)
	if err != nil {
		t.Fatal(err)
	}
	var h map[string]string
	_ = json.Unmarshal([]byte(headers), &h)
	if status != "WAIT" || topic != "GO_TOPIC" || tag != "created" || h["source"] != "go <test>" || payload != string(ev.Payload) {
		t.Fatalf("row: %s %s %s %s %s", status, topic, tag, headers, payload)
	}
	var qty int
	var price float64
	var paid bool
	var blob []byte
	var createdBack string // the driver runs without parseTime: DATETIME reads as text
	var note sql.NullString
	err = db.QueryRow("SELECT qty, price, note, paid, blob_col, created FROM t_order WHERE order_no = ?", order).
		Scan(&qty, &price, &note, &paid, &blob, &createdBack)
	if err != nil || qty != 3 || price != 9.5 || note.Valid || !paid || string(blob) != "\x00\x01\xff" ||
		createdBack != "2024-05-06 07:08:09.123456" {
		t.Fatalf("order row: %v %d %v %v %v %x %s", err, qty, price, note, paid, blob, createdBack)
	}
	// Finished: further use is ErrTxFinished, Rollback after Commit too (so defer is safe).
	if _, err := tx.Exec("SELECT 1"); !errors.Is(err, outbox.ErrTxFinished) {
		t.Fatalf("Exec after Commit: %v", err)
	}
	if err := tx.Rollback(); !errors.Is(err, outbox.ErrTxFinished) {
		t.Fatalf("Rollback after Commit: %v", err)
	}
}

func TestLibraryOwnedTxRollbackLeavesNothing(t *testing.T) {
	r := start(t)
	order := unique("GO-RB")
	tx, err := r.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec("INSERT INTO t_order (order_no) VALUES (?)", order); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Enqueue(orderEvent(order)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if c := count(t, "SELECT COUNT(*) FROM t_event_record WHERE biz_no = ?", order); c != 0 {
		t.Fatalf("%d events after rollback", c)
	}
	if c := count(t, "SELECT COUNT(*) FROM t_order WHERE order_no = ?", order); c != 0 {
		t.Fatalf("%d orders after rollback", c)
	}
	if err := tx.Commit(); !errors.Is(err, outbox.ErrTxFinished) {
		t.Fatalf("Commit after Rollback: %v", err)
	}
}

func TestHostOwnedTxEnqueuesWithTheCallersDriver(t *testing.T) {
	r := start(t)
	ctx := context.Background()

	order := unique("GO-HOST")
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO t_order (order_no, qty) VALUES (?, ?)", order, 1); err != nil {
		t.Fatal(err)
	}
	ev := orderEvent(order)
	ev.Headers = map[string]string{"via": "database/sql"}
	id, err := outbox.EnqueueTx(ctx, tx, r, ev)
	if err != nil || id <= 0 {
		t.Fatalf("EnqueueTx = %d, %v", id, err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := r.Notify(); err != nil {
		t.Fatal(err)
	}
	var status, headers, payload string
	var topic, tag sql.NullString
	if err := db.QueryRow("SELECT status, topic, tag, headers, payload FROM t_event_record WHERE id = ?", id).
		Scan(&status, &topic, &tag, &headers, &payload); err != nil {
		t.Fatal(err)
	}
	if status != "WAIT" || topic.Valid || tag.Valid || headers != `{"via":"database/sql"}` || payload != string(ev.Payload) {
		t.Fatalf("row: %s %v %v %s %s", status, topic, tag, headers, payload)
	}

	// Rolled back with the caller's transaction.
	order = unique("GO-HOST-RB")
	tx, err = db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO t_order (order_no) VALUES (?)", order); err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.EnqueueTx(ctx, tx, r, orderEvent(order)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if c := count(t, "SELECT COUNT(*) FROM t_event_record WHERE biz_no = ?", order); c != 0 {
		t.Fatalf("%d events after rollback", c)
	}

	// The library's validation applies to this path too; nothing is written.
	tx, _ = db.BeginTx(ctx, nil)
	defer tx.Rollback()
	bad := orderEvent(unique("GO-HOST-BAD"))
	bad.Headers = map[string]string{"eventId": "forged"}
	if _, err := outbox.EnqueueTx(ctx, tx, r, bad); !errors.Is(err, outbox.ErrInvalidEvent) {
		t.Fatalf("reserved header: %v", err)
	}
	if _, err := outbox.EnqueueTx(ctx, tx, nil, bad); !errors.Is(err, outbox.ErrNullArgument) {
		t.Fatalf("nil relay: %v", err)
	}
}

// Scheduled events through both enqueue paths: the row is due when the schedule says (the
// database's clock), and a bad schedule is refused naming the value, writing nothing.
func TestScheduledEventsThroughBothPaths(t *testing.T) {
	r := start(t)
	ctx := context.Background()
	prefix := unique("GO-SCHED")
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	later := orderEvent(prefix + "-1")
	later.DeliverAfter = time.Hour
	past := orderEvent(prefix + "-2")
	past.DeliverAt = time.Now().Add(-time.Minute)
	for _, ev := range []outbox.Event{later, past} {
		if _, err := outbox.EnqueueTx(ctx, tx, r, ev); err != nil {
			t.Fatalf("EnqueueTx %s: %v", ev.BizNo, err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	ltx, err := r.Begin()
	if err != nil {
		t.Fatal(err)
	}
	at := orderEvent(prefix + "-3")
	at.DeliverAt = time.Now().Add(time.Hour)
	if _, err := ltx.Enqueue(at); err != nil {
		t.Fatalf("Tx.Enqueue: %v", err)
	}
	if err := ltx.Commit(); err != nil {
		t.Fatal(err)
	}
	hourAhead := "TIMESTAMPDIFF(SECOND, NOW(3), next_retry_time) BETWEEN 3590 AND 3600 AND retry_count = 0"
	for _, biz := range []string{prefix + "-1", prefix + "-3"} {
		if c := count(t, "SELECT COUNT(*) FROM t_event_record WHERE biz_no = ? AND "+hourAhead, biz); c != 1 {
			t.Fatalf("%s is not due in an hour", biz)
		}
	}
	if c := count(t, "SELECT COUNT(*) FROM t_event_record WHERE biz_no = ? AND next_retry_time <= NOW(3)", prefix+"-2"); c != 1 {
		t.Fatal("a time already past is not due now")
	}

	before := count(t, "SELECT COUNT(*) FROM t_event_record")
	tx, _ = db.BeginTx(ctx, nil)
	defer tx.Rollback()
	far := orderEvent(prefix + "-bad")
	far.DeliverAfter = 400 * 24 * time.Hour
	if _, err := outbox.EnqueueTx(ctx, tx, r, far); !errors.Is(err, outbox.ErrInvalidEvent) || !strings.Contains(err.Error(), "34560000000 ms") {
		t.Fatalf("400 days: %v", err)
	}
	both := orderEvent(prefix + "-bad")
	both.DeliverAt = time.Now().Add(time.Hour)
	both.DeliverAfter = time.Minute
	if _, err := outbox.EnqueueTx(ctx, tx, r, both); !errors.Is(err, outbox.ErrInvalidEvent) || !strings.Contains(err.Error(), "both set") {
		t.Fatalf("both set: %v", err)
	}
	ltx, _ = r.Begin()
	negative := orderEvent(prefix + "-bad")
	negative.DeliverAfter = -time.Second
	if _, err := ltx.Enqueue(negative); !errors.Is(err, outbox.ErrInvalidEvent) || !strings.Contains(err.Error(), "delay_ms -1000") {
		t.Fatalf("negative: %v", err)
	}
	_ = ltx.Rollback()
	if after := count(t, "SELECT COUNT(*) FROM t_event_record"); after != before {
		t.Fatalf("%d rows written by refused schedules", after-before)
	}
}

// Cancelling from Go: a scheduled event is cancelled, a second cancel says so, an id never
// issued is an invalid-event error; by business key and type.
func TestCancel(t *testing.T) {
	r := start(t)
	prefix := unique("GO-CANCEL")
	tx, err := r.Begin()
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]uint64, 3)
	for i, typ := range []string{"A", "B", "B"} {
		ev := orderEvent(prefix)
		ev.EventType = "ORDER_" + typ
		ev.DeliverAfter = time.Hour
		if ids[i], err = tx.Enqueue(ev); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if o, err := r.Cancel(ids[0]); err != nil || o != outbox.Cancelled {
		t.Fatalf("Cancel = %v, %v", o, err)
	}
	if o, err := r.Cancel(ids[0]); err != nil || o != outbox.CancelAlreadyCancelled || o.String() != "already cancelled" {
		t.Fatalf("second Cancel = %v, %v", o, err)
	}
	if _, err := r.Cancel(ids[2] + 1000); !errors.Is(err, outbox.ErrInvalidEvent) || !strings.Contains(err.Error(), "is not an event of") {
		t.Fatalf("unknown id: %v", err)
	}
	if n, err := r.CancelByBizNo(prefix, "ORDER_B"); err != nil || n != 2 {
		t.Fatalf("CancelByBizNo = %d, %v", n, err)
	}
	if c := count(t, "SELECT COUNT(*) FROM t_event_record WHERE biz_no = ?", prefix); c != 0 {
		t.Fatalf("%d rows left", c)
	}
	if _, err := r.CancelByBizNo("bad\x00key", ""); !errors.Is(err, outbox.ErrInvalidEvent) {
		t.Fatalf("NUL: %v", err)
	}
}

func TestErrorsMapToGoErrors(t *testing.T) {
	_, err := outbox.Start(outbox.Config{Settings: settings("scan.intervall.ms", "5")})
	var oe *outbox.Error
	if !errors.Is(err, outbox.ErrUnknownKey) || errors.Is(err, outbox.ErrInvalidValue) || !errors.As(err, &oe) ||
		oe.Code != outbox.CodeUnknownKey || !strings.Contains(oe.Message, "scan.intervall.ms") {
		t.Fatalf("unknown key: %#v", err)
	}
	_, err = outbox.Start(outbox.Config{Settings: settings("batch.size", "lots")})
	if !errors.Is(err, outbox.ErrInvalidValue) || !strings.Contains(err.Error(), "batch.size") || !strings.Contains(err.Error(), "lots") {
		t.Fatalf("invalid value: %v", err)
	}
	_, err = outbox.Start(outbox.Config{Settings: settings("lease.ms", "1000", "send.timeout.ms", "1000")})
	if !errors.Is(err, outbox.ErrInconsistentConfig) {
		t.Fatalf("inconsistent: %v", err)
	}
	_, err = outbox.Start(outbox.Config{Settings: settings("topic", "a\x00b")})
	if !errors.Is(err, outbox.ErrInvalidValue) {
		t.Fatalf("NUL in a value: %v", err)
	}
	_, err = outbox.Start(outbox.Config{Settings: settings("table", "t_missing_outbox")})
	if !errors.Is(err, outbox.ErrStatement) || err.(*outbox.Error).Retriable() {
		t.Fatalf("missing table: %v", err)
	}
	_, err = outbox.Start(outbox.Config{Settings: map[string]string{"db.url": "mysql://root@127.0.0.1:1/x", "publisher": "none"}})
	if !errors.Is(err, outbox.ErrDatabase) || !err.(*outbox.Error).Retriable() {
		t.Fatalf("unreachable database: %v", err)
	}

	r := start(t)
	tx, err := r.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.Exec("INSERT INTO t_order (nope) VALUES (1)"); !errors.Is(err, outbox.ErrStatement) || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("bad column: %v", err)
	}
	if _, err := tx.Exec("SELECT ?, ?", 1); !errors.Is(err, outbox.ErrInvalidArgument) {
		t.Fatalf("parameter count: %v", err)
	}
	if _, err := tx.Exec("SELECT ?", struct{}{}); !errors.Is(err, outbox.ErrInvalidArgument) {
		t.Fatalf("unsupported type: %v", err)
	}
	if _, err := tx.Exec("SELECT ?", uint64(1<<63)); !errors.Is(err, outbox.ErrInvalidArgument) {
		t.Fatalf("uint64 overflow: %v", err)
	}
	if _, err := tx.Exec("SELECT ?", "bad\xffutf8"); !errors.Is(err, outbox.ErrInvalidUTF8) {
		t.Fatalf("bad UTF-8: %v", err)
	}
	for name, ev := range map[string]outbox.Event{
		"empty payload": {BizNo: "X", EventType: "T"},
		"no biz_no":     {EventType: "T", Payload: []byte("x")},
		"NUL":           {BizNo: "a\x00b", EventType: "T", Payload: []byte("x")},
		"bad topic":     {BizNo: "X", EventType: "T", Payload: []byte("x"), Topic: "no spaces"},
	} {
		if _, err := tx.Enqueue(ev); !errors.Is(err, outbox.ErrInvalidEvent) {
			t.Errorf("%s: %v", name, err)
		}
		if err := r.Validate(ev); !errors.Is(err, outbox.ErrInvalidEvent) {
			t.Errorf("Validate %s: %v", name, err)
		}
	}
	// The tx survived all of that.
	if _, found, err := tx.QueryInt64("SELECT 1"); err != nil || !found {
		t.Fatalf("tx unusable after errors: %v", err)
	}
}

func TestStopCloseAndUseAfter(t *testing.T) {
	r, err := outbox.Start(outbox.Config{Settings: settings(), OnDeadLetter: func(outbox.DeadLetter) {}})
	if err != nil {
		t.Fatal(err)
	}
	open, err := r.Begin()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.Stop(ctx); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	if err := r.Notify(); !errors.Is(err, outbox.ErrStopped) {
		t.Fatalf("Notify after Stop: %v", err)
	}
	if _, err := r.Begin(); !errors.Is(err, outbox.ErrStopped) {
		t.Fatalf("Begin after Stop: %v", err)
	}
	if _, err := open.Enqueue(orderEvent("GO-STOPPED")); !errors.Is(err, outbox.ErrStopped) {
		t.Fatalf("Enqueue after Stop: %v", err)
	}
	if _, err := r.Stats(); err != nil {
		t.Fatalf("Stats after Stop: %v", err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := r.Notify(); !errors.Is(err, outbox.ErrStopped) {
		t.Fatalf("Notify after Close: %v", err)
	}
	if _, err := r.Stats(); !errors.Is(err, outbox.ErrStopped) {
		t.Fatalf("Stats after Close: %v", err)
	}
	if err := r.Stop(ctx); !errors.Is(err, outbox.ErrStopped) {
		t.Fatalf("Stop after Close: %v", err)
	}
	// A tx begun before outlives the relay handle.
	if err := open.Commit(); err != nil {
		t.Fatalf("Commit after Close: %v", err)
	}
}

func TestStats(t *testing.T) {
	r := start(t)
	s, err := r.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if s.InstanceID == "" || s.Gauges == nil || s.BreakerState == "" || len(s.Raw) == 0 {
		t.Fatalf("stats %+v", s)
	}
	if want := count(t, "SELECT COUNT(*) FROM t_event_record WHERE status = 'WAIT'"); s.Gauges.Wait != uint64(want) {
		t.Logf("wait gauge %d, table %d (other tests may run concurrently)", s.Gauges.Wait, want)
	}
}

// Many goroutines share one relay; Close races with them at the end (run with -race).
func TestConcurrentUseAndClose(t *testing.T) {
	r, err := outbox.Start(outbox.Config{Settings: settings("db.pool.max", "4")})
	if err != nil {
		t.Fatal(err)
	}
	biz := unique("GO-CONC")
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 5; i++ {
				tx, err := r.Begin()
				if err != nil {
					errs <- err
					return
				}
				if _, err := tx.Enqueue(orderEvent(biz)); err != nil {
					tx.Rollback()
					errs <- err
					return
				}
				if err := tx.Commit(); err != nil {
					errs <- err
					return
				}
				if _, err := r.Stats(); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if c := count(t, "SELECT COUNT(*) FROM t_event_record WHERE biz_no = ?", biz); c != 20 {
		t.Fatalf("%d events, want 20", c)
	}
	// Close while others still call: they see ErrStopped, never a crash.
	var wg2 sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg2.Add(1)
		go func() {
			defer wg2.Done()
			for i := 0; i < 50; i++ {
				if err := r.Notify(); err != nil && !errors.Is(err, outbox.ErrStopped) {
					t.Error(err)
				}
			}
		}()
	}
	r.Close()
	wg2.Wait()
}

func brokerPresent() bool {
	c, err := net.DialTimeout("tcp", "127.0.0.1:9876", 500*time.Millisecond)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

func TestRelayPublishesToTheBroker(t *testing.T) {
	if !brokerPresent() {
		t.Skip("no RocketMQ name server on 127.0.0.1:9876 (scripts/rocketmq start)")
	}
	topic := strings.ReplaceAll(unique("outbox_go"), "-", "_")
	r, err := outbox.Start(outbox.Config{Settings: map[string]string{
		"db.url": dbURL, "publisher": "rocketmq", "rocketmq.namesrv": "127.0.0.1:9876",
		"topic": topic, "scan.interval.ms": "100", "send.timeout.ms": "10000",
	}})
	if errors.Is(err, outbox.ErrInvalidValue) && strings.Contains(err.Error(), "publisher") {
		t.Skipf("the library was built without --features rocketmq: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx := context.Background()
	order := unique("GO-MQ")
	// Host-owned path, then Notify.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	id1, err := outbox.EnqueueTx(ctx, tx, r, orderEvent(order))
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := r.Notify(); err != nil {
		t.Fatal(err)
	}
	// Library-owned path.
	ltx, err := r.Begin()
	if err != nil {
		t.Fatal(err)
	}
	id2, err := ltx.Enqueue(orderEvent(order))
	if err != nil {
		t.Fatal(err)
	}
	if err := ltx.Commit(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		// Sent rows are deleted (sent.rows = delete) or SUCCESS: none of the two is left otherwise.
		n := count(t, "SELECT COUNT(*) FROM t_event_record WHERE id IN (?, ?) AND status <> 'SUCCESS'", id1, id2)
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			s, _ := r.Stats()
			t.Fatalf("%d of 2 events not sent after 60 s; stats %s", n, s.Raw)
		}
		time.Sleep(100 * time.Millisecond)
	}
	s, err := r.Stats()
	if err != nil || s.Sent < 2 {
		t.Fatalf("stats %+v %v", s, err)
	}
	ctx2, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := r.Stop(ctx2); err != nil {
		t.Fatal(err)
	}
}

// A 5 MiB incompressible message passes enqueue, but the broker refuses it (maxMessageSize 4 MiB):
// with max.retry=0 it ends FAIL at once and OnDeadLetter is called once, on a relay thread.
func TestDeadLetterCallback(t *testing.T) {
	if !brokerPresent() {
		t.Skip("no RocketMQ name server on 127.0.0.1:9876 (scripts/rocketmq start)")
	}
	letters := make(chan outbox.DeadLetter, 10)
	r, err := outbox.Start(outbox.Config{
		Settings: map[string]string{
			"db.url": dbURL, "publisher": "rocketmq", "rocketmq.namesrv": "127.0.0.1:9876",
			"topic": strings.ReplaceAll(unique("outbox_go_dl"), "-", "_"), "scan.interval.ms": "100",
			"send.timeout.ms": "10000", "payload.max.bytes": "8388608", "max.retry": "0",
		},
		OnDeadLetter: func(d outbox.DeadLetter) { letters <- d },
	})
	if errors.Is(err, outbox.ErrInvalidValue) && strings.Contains(err.Error(), "publisher") {
		t.Skipf("the library was built without --features rocketmq: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	tx, err := r.Begin()
	if err != nil {
		t.Fatal(err)
	}
	// Incompressible, so the client's body compression cannot bring it under the limit.
	payload := make([]byte, 5<<20)
	_, _ = rand.Read(payload)
	ev := outbox.Event{BizNo: unique("GO-DL"), EventType: "ORDER_CREATED", Payload: payload}
	id, err := tx.Enqueue(ev)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-letters:
		if d.ID != id || d.BizNo != ev.BizNo || d.RetryCount != 1 || d.LastError == "" {
			t.Fatalf("dead letter %+v, want id %d", d, id)
		}
	case <-time.After(60 * time.Second):
		s, _ := r.Stats()
		t.Fatalf("no dead letter after 60 s; stats %s", s.Raw)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if len(letters) != 0 {
		t.Fatalf("%d more dead letters", len(letters))
	}
}

// A Stop whose deadline has passed returns ErrTimedOut (the relay threads are still ending);
// a later Stop with time to spare waits for them; after that, Stop is a no-op.
func TestStopPastItsDeadlineTimesOut(t *testing.T) {
	if !brokerPresent() {
		t.Skip("no RocketMQ name server on 127.0.0.1:9876 (scripts/rocketmq start)")
	}
	r, err := outbox.Start(outbox.Config{Settings: map[string]string{
		"db.url": dbURL, "publisher": "rocketmq", "rocketmq.namesrv": "127.0.0.1:9876",
	}})
	if errors.Is(err, outbox.ErrInvalidValue) && strings.Contains(err.Error(), "publisher") {
		t.Skipf("the library was built without --features rocketmq: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	if err := r.Stop(ctx); !errors.Is(err, outbox.ErrTimedOut) {
		t.Fatalf("Stop past its deadline: %v", err)
	}
	wait, cancelWait := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancelWait()
	if err := r.Stop(wait); err != nil {
		t.Fatalf("second Stop, with time for the threads to end: %v", err)
	}
	if err := r.Stop(ctx); err != nil {
		t.Fatalf("Stop once everything has ended: %v", err)
	}
}
