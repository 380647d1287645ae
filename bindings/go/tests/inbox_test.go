package tests

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	outbox "github.com/outbox-rs/outbox/bindings/go"
)

// The consumer inbox on the caller's own *sql.Tx, against MariaDB. The run's database was
// migrated through outbox.Migrate, which creates outbox_inbox from migration V8; the tests that
// need a table of their own create it LIKE outbox_inbox (the same DDL) and drop it at the end.

const pointsGroup = "points-service"

// blockDeadline is how long a test waits for a connection to reach a lock wait before failing.
const blockDeadline = 20 * time.Second

// inboxTables creates <name>_inbox (V8's table, as migrated) and <name>_points (a balance per
// user), both dropped when the test ends.
func inboxTables(t *testing.T, name string) (*outbox.Inbox, string) {
	t.Helper()
	table, points := name+"_inbox", name+"_points"
	for _, ddl := range []string{
		"CREATE TABLE " + table + " LIKE " + outbox.DefaultInboxTable,
		"CREATE TABLE " + points + " (user_id VARCHAR(32) PRIMARY KEY, balance BIGINT NOT NULL)",
	} {
		if _, err := db.Exec(ddl); err != nil {
			t.Fatalf("%s: %v", ddl, err)
		}
	}
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS " + table + ", " + points) })
	inbox, err := outbox.NewInbox(table)
	if err != nil {
		t.Fatal(err)
	}
	return inbox, points
}

func credit(ctx context.Context, tx *sql.Tx, points, user string, amount int64) error {
	_, err := tx.ExecContext(ctx, "INSERT INTO "+points+" (user_id, balance) VALUES (?, ?) "+
		"ON DUPLICATE KEY UPDATE balance = balance + VALUES(balance)", user, amount)
	return err
}

func balance(t *testing.T, points, user string) int64 {
	t.Helper()
	var b int64
	err := db.QueryRow("SELECT balance FROM "+points+" WHERE user_id = ?", user).Scan(&b)
	if err != nil && err != sql.ErrNoRows {
		t.Fatal(err)
	}
	return b
}

func begin(t *testing.T) *sql.Tx {
	t.Helper()
	tx, err := db.BeginTx(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback() })
	return tx
}

func connectionID(t *testing.T, tx *sql.Tx) int64 {
	t.Helper()
	var id int64
	if err := tx.QueryRow("SELECT CONNECTION_ID()").Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// waitForLockWait polls until the connection connID is waiting for a row lock in its INSERT
// IGNORE, up to blockDeadline; it reports whether it was. Two live sources must agree: the
// TRANSACTIONS section of SHOW ENGINE INNODB STATUS has a transaction with a "LOCK WAIT" line for
// that thread id, and information_schema.PROCESSLIST shows the connection running the INSERT
// IGNORE. (information_schema.INNODB_TRX is not used: InnoDB refreshes it only once nobody has
// read it for 100 ms, so a poller can keep seeing a snapshot from before the wait began.)
func waitForLockWait(t *testing.T, connID int64) bool {
	t.Helper()
	thread := fmt.Sprintf(" thread id %d,", connID)
	deadline := time.Now().Add(blockDeadline)
	for time.Now().Before(deadline) {
		var typ, name, status string
		if err := db.QueryRow("SHOW ENGINE INNODB STATUS").Scan(&typ, &name, &status); err != nil {
			t.Fatal(err)
		}
		waiting := false
		for _, trx := range strings.Split(status, "\n---TRANSACTION ") {
			if strings.Contains(trx, "\nLOCK WAIT ") && strings.Contains(trx, thread) {
				waiting = true
			}
		}
		var info sql.NullString
		if err := db.QueryRow("SELECT INFO FROM information_schema.PROCESSLIST WHERE ID = ?", connID).Scan(&info); err != nil {
			t.Fatal(err)
		}
		if waiting && strings.HasPrefix(info.String, "INSERT IGNORE INTO ") {
			return true
		}
		time.Sleep(5 * time.Millisecond) // poll interval
	}
	return false
}

func TestInboxRunsTheHandlerOnceAndCommitsTheMarkWithItsWrites(t *testing.T) {
	ctx := context.Background()
	_, points := inboxTables(t, "inbox_once")
	inbox := outbox.DefaultInbox // outbox_inbox, created by outbox.Migrate
	if inbox.Table() != "outbox_inbox" {
		t.Fatalf("DefaultInbox.Table() = %q", inbox.Table())
	}
	key := unique("orders:ORD")
	msg := outbox.InboxMessage{Topic: "ORDER_EVENT_TOPIC", QueueID: 3, QueueOffset: 1234, MsgID: "7F00000100002A9F0000000000000001"}
	var runs atomic.Int32
	for i, wantDup := range []bool{false, true} {
		tx := begin(t)
		dup, err := inbox.ProcessTx(ctx, tx, pointsGroup, key, msg, func(tx *sql.Tx) error {
			runs.Add(1)
			return credit(ctx, tx, points, "alice", 10)
		})
		if err != nil || dup != wantDup {
			t.Fatalf("copy %d: duplicate = %v, %v; want %v", i+1, dup, err, wantDup)
		}
		// Before the commit the mark and the credit are invisible to others, then both appear.
		if i == 0 {
			seen, err := inbox.IsProcessed(ctx, db, pointsGroup, key)
			if err != nil || seen || balance(t, points, "alice") != 0 {
				t.Fatalf("visible before commit: marked %v (%v), balance %d", seen, err, balance(t, points, "alice"))
			}
			if seen, err := inbox.IsProcessed(ctx, tx, pointsGroup, key); err != nil || !seen {
				t.Fatalf("the transaction does not see its own mark: %v %v", seen, err)
			}
		}
		// A duplicate leaves the transaction usable: a later statement runs and commits.
		if err := credit(ctx, tx, points, "after", 1); err != nil {
			t.Fatalf("copy %d: statement after ProcessTx: %v", i+1, err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times", n)
	}
	if b := balance(t, points, "alice"); b != 10 {
		t.Fatalf("alice's balance %d, want 10", b)
	}
	if b := balance(t, points, "after"); b != 2 {
		t.Fatalf("statements after ProcessTx committed %d times, want 2", b)
	}
	if seen, err := inbox.IsProcessed(ctx, db, pointsGroup, key); err != nil || !seen {
		t.Fatalf("IsProcessed after commit: %v %v", seen, err)
	}

	// The mark keeps where the message came from, stamped by the database clock.
	var topic, msgID string
	var queueID, offset, age int64
	err := db.QueryRow("SELECT topic, queue_id, queue_offset, msg_id, TIMESTAMPDIFF(SECOND, processed_at, NOW(3)) "+
		"FROM outbox_inbox WHERE consumer_group = ? AND event_key = ?", pointsGroup, []byte(key)).
		Scan(&topic, &queueID, &offset, &msgID, &age)
	if err != nil || topic != msg.Topic || queueID != 3 || offset != 1234 || msgID != msg.MsgID || age < 0 || age > 60 {
		t.Fatalf("mark: %v %q %d %d %q %d s", err, topic, queueID, offset, msgID, age)
	}

	// Keys are per consumer group and compared byte for byte (case and trailing spaces count);
	// without a topic nothing of the message is stored.
	for _, c := range []struct{ group, key string }{
		{"audit-service", key}, {pointsGroup, strings.ToUpper(key)}, {pointsGroup, key + " "},
	} {
		tx := begin(t)
		isNew, err := inbox.MarkTx(ctx, tx, c.group, c.key, outbox.InboxMessage{QueueID: 7, QueueOffset: 8})
		if err != nil || !isNew {
			t.Fatalf("MarkTx(%q, %q) = %v, %v; want a new key", c.group, c.key, isNew, err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	if n := count(t, "SELECT COUNT(*) FROM outbox_inbox WHERE event_key = ? AND consumer_group = 'audit-service' "+
		"AND topic IS NULL AND queue_id IS NULL AND queue_offset IS NULL AND msg_id IS NULL", []byte(key)); n != 1 {
		t.Fatalf("a mark without topic stores NULLs: %d rows", n)
	}

	// The longest values are stored whole.
	long := outbox.InboxMessage{Topic: strings.Repeat("t", 127), QueueID: 4294967295, QueueOffset: 1<<63 - 1,
		MsgID: strings.Repeat("é", 128)}
	longGroup, longKey := strings.Repeat("g", 255), unique("k")
	longKey += strings.Repeat("k", 255-len(longKey))
	tx := begin(t)
	if isNew, err := inbox.MarkTx(ctx, tx, longGroup, longKey, long); err != nil || !isNew {
		t.Fatalf("longest values: %v %v", isNew, err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	var gotTopic, gotMsgID string
	var gotQueue, gotOffset uint64
	err = db.QueryRow("SELECT topic, queue_id, queue_offset, msg_id FROM outbox_inbox WHERE consumer_group = ? AND event_key = ?",
		longGroup, []byte(longKey)).Scan(&gotTopic, &gotQueue, &gotOffset, &gotMsgID)
	if err != nil || gotTopic != long.Topic || gotQueue != 4294967295 || gotOffset != 1<<63-1 || gotMsgID != long.MsgID {
		t.Fatalf("longest values read back: %v %q %d %d %q", err, gotTopic, gotQueue, gotOffset, gotMsgID)
	}
}

// concurrentCopies handles one key on two transactions at once: A marks it and its handler
// credits, and stays open; B's ProcessTx runs in another goroutine and must be seen waiting on
// A's mark; then A ends (commit or rollback) and B's outcome is returned with the number of
// handler runs.
func concurrentCopies(t *testing.T, name string, commitFirst bool) (bDup bool, runs int32, points string) {
	ctx := context.Background()
	inbox, points := inboxTables(t, name)
	key := unique("orders:ORD")
	var n atomic.Int32
	handler := func(tx *sql.Tx) error {
		n.Add(1)
		return credit(ctx, tx, points, "alice", 10)
	}

	a := begin(t)
	if dup, err := inbox.ProcessTx(ctx, a, pointsGroup, key, outbox.InboxMessage{}, handler); err != nil || dup {
		t.Fatalf("A: %v %v", dup, err)
	}
	b := begin(t)
	bConn := connectionID(t, b)
	type outcome struct {
		dup bool
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		dup, err := inbox.ProcessTx(ctx, b, pointsGroup, key, outbox.InboxMessage{}, handler)
		if err == nil {
			err = b.Commit()
		}
		done <- outcome{dup, err}
	}()
	if !waitForLockWait(t, bConn) {
		select {
		case o := <-done:
			t.Fatalf("B did not wait on A's mark: it returned %v, %v", o.dup, o.err)
		default:
			t.Fatalf("B (connection %d) never seen waiting on A's mark within %v", bConn, blockDeadline)
		}
	}
	select {
	case o := <-done:
		t.Fatalf("B returned while waiting: %v, %v", o.dup, o.err)
	default:
	}
	if n.Load() != 1 {
		t.Fatalf("B's handler ran while A's mark was uncommitted (%d runs)", n.Load())
	}
	var err error
	if commitFirst {
		err = a.Commit()
	} else {
		err = a.Rollback()
	}
	if err != nil {
		t.Fatal(err)
	}
	o := <-done
	if o.err != nil {
		t.Fatalf("B: %v", o.err)
	}
	if c := count(t, "SELECT COUNT(*) FROM "+inbox.Table()+" WHERE consumer_group = ? AND event_key = ?", pointsGroup, []byte(key)); c != 1 {
		t.Fatalf("%d marks of the key", c)
	}
	return o.dup, n.Load(), points
}

func TestInboxSecondCopyWaitsForTheFirstAndIsADuplicateWhenItCommits(t *testing.T) {
	dup, runs, points := concurrentCopies(t, "inbox_race_commit", true)
	if !dup || runs != 1 {
		t.Fatalf("B duplicate = %v, handler runs %d; want true, 1", dup, runs)
	}
	if b := balance(t, points, "alice"); b != 10 {
		t.Fatalf("balance %d, want 10", b)
	}
}

func TestInboxSecondCopyRunsTheHandlerWhenTheFirstRollsBack(t *testing.T) {
	dup, runs, points := concurrentCopies(t, "inbox_race_rollback", false)
	// Two runs, one committed credit: A's run was rolled back with its mark.
	if dup || runs != 2 {
		t.Fatalf("B duplicate = %v, handler runs %d; want false, 2", dup, runs)
	}
	if b := balance(t, points, "alice"); b != 10 {
		t.Fatalf("balance %d, want 10", b)
	}
}

type creditRefused struct{ user string }

func (e *creditRefused) Error() string { return "credit refused for " + e.user }

func TestInboxHandlerErrorIsReturnedAndARollbackUndoesTheMark(t *testing.T) {
	ctx := context.Background()
	inbox, points := inboxTables(t, "inbox_handler_error")
	key := unique("orders:ORD")
	refused := &creditRefused{"alice"}

	tx := begin(t)
	dup, err := inbox.ProcessTx(ctx, tx, pointsGroup, key, outbox.InboxMessage{}, func(tx *sql.Tx) error {
		if err := credit(ctx, tx, points, "alice", 10); err != nil {
			return err
		}
		return fmt.Errorf("points: %w", refused)
	})
	var ce *creditRefused
	if dup || err == nil || !errors.Is(err, refused) || !errors.As(err, &ce) || ce.user != "alice" ||
		err.Error() != "points: credit refused for alice" {
		t.Fatalf("ProcessTx = %v, %v; want the handler's error as is", dup, err)
	}
	// The mark is still in the transaction: the caller rolls back.
	if seen, err := inbox.IsProcessed(ctx, tx, pointsGroup, key); err != nil || !seen {
		t.Fatalf("the mark is not in the failed transaction: %v %v", seen, err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if seen, err := inbox.IsProcessed(ctx, db, pointsGroup, key); err != nil || seen {
		t.Fatalf("marked after the rollback: %v %v", seen, err)
	}
	if b := balance(t, points, "alice"); b != 0 {
		t.Fatalf("balance %d after the rollback", b)
	}

	// The next copy runs the handler.
	tx = begin(t)
	ran := false
	dup, err = inbox.ProcessTx(ctx, tx, pointsGroup, key, outbox.InboxMessage{}, func(tx *sql.Tx) error {
		ran = true
		return credit(ctx, tx, points, "alice", 10)
	})
	if err != nil || dup || !ran {
		t.Fatalf("next copy: duplicate %v, ran %v, %v", dup, ran, err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if b := balance(t, points, "alice"); b != 10 {
		t.Fatalf("balance %d, want 10", b)
	}
}

func TestInboxRefusesBadInputNamingFieldAndValueBeforeTheDatabase(t *testing.T) {
	ctx := context.Background()
	for _, name := range []string{"inbox; DROP TABLE x", "", "1inbox", strings.Repeat("t", 65), "inbox-1"} {
		in, err := outbox.NewInbox(name)
		if in != nil || !errors.Is(err, outbox.ErrInvalidValue) || !strings.Contains(err.Error(), "inbox.table") ||
			!strings.Contains(err.Error(), fmt.Sprintf("%q", name)) {
			t.Fatalf("NewInbox(%q) = %v, %v", name, in, err)
		}
	}
	if in, err := outbox.NewInbox(strings.Repeat("t", 64)); err != nil || in.Table() != strings.Repeat("t", 64) {
		t.Fatalf("a 64-character name: %v", err)
	}

	inbox, _ := inboxTables(t, "inbox_bad_input")
	ok := outbox.InboxMessage{Topic: "ORDER_EVENT_TOPIC"}
	cases := []struct {
		group, key string
		msg        outbox.InboxMessage
		field      string
		mentions   []string
	}{
		{"", "k", ok, "consumer_group", []string{"must not be empty"}},
		{"points group", "k", ok, "consumer_group", []string{`"points group"`, "[A-Za-z0-9_%|-]"}},
		{"points;DROP", "k", ok, "consumer_group", []string{`"points;DROP"`}},
		{strings.Repeat("g", 256), "k", ok, "consumer_group", []string{`"gggg`, "…", "255"}},
		{pointsGroup, "", ok, "event_key", []string{"must not be empty"}},
		{pointsGroup, strings.Repeat("k", 256), ok, "event_key", []string{`"kkkk`, "256 bytes", "255"}},
		{pointsGroup, "k", outbox.InboxMessage{Topic: strings.Repeat("t", 128)}, "topic", []string{`"tttt`, "128 characters", "127"}},
		{pointsGroup, "k", outbox.InboxMessage{Topic: "T\xff"}, "topic", []string{`"T\xff"`, "UTF-8"}},
		{pointsGroup, "k", outbox.InboxMessage{MsgID: strings.Repeat("m", 129)}, "msg_id", []string{`"mmmm`, "129 characters", "128"}},
		{pointsGroup, "k", outbox.InboxMessage{MsgID: "\xc3"}, "msg_id", []string{"UTF-8"}},
		{pointsGroup, "k", outbox.InboxMessage{Topic: "T", QueueOffset: -1}, "queue_offset", []string{"-1", "negative"}},
	}
	// A finished transaction: had anything been sent, the error would be sql.ErrTxDone.
	done := begin(t)
	_ = done.Rollback()
	live := begin(t)
	for _, c := range cases {
		for _, tx := range []*sql.Tx{done, live} {
			ran := false
			dup, err := inbox.ProcessTx(ctx, tx, c.group, c.key, c.msg, func(*sql.Tx) error { ran = true; return nil })
			if dup || ran || !errors.Is(err, outbox.ErrInvalidEvent) || !strings.Contains(err.Error(), "invalid event: "+c.field+" ") {
				t.Fatalf("ProcessTx with a bad %s = %v, ran %v, %v; want ErrInvalidEvent naming it", c.field, dup, ran, err)
			}
			for _, m := range c.mentions {
				if !strings.Contains(err.Error(), m) {
					t.Fatalf("%s: %q does not mention %q", c.field, err, m)
				}
			}
			if _, err := inbox.MarkTx(ctx, tx, c.group, c.key, c.msg); !errors.Is(err, outbox.ErrInvalidEvent) {
				t.Fatalf("MarkTx %s: %v", c.field, err)
			}
			if c.field == "consumer_group" || c.field == "event_key" {
				if _, err := inbox.IsProcessed(ctx, tx, c.group, c.key); !errors.Is(err, outbox.ErrInvalidEvent) {
					t.Fatalf("IsProcessed %s: %v", c.field, err)
				}
			}
		}
	}
	var oe *outbox.Error
	if _, err := inbox.MarkTx(ctx, nil, pointsGroup, "k", ok); !errors.Is(err, outbox.ErrNullArgument) || !errors.As(err, &oe) {
		t.Fatalf("nil tx: %v", err)
	}
	if _, err := inbox.ProcessTx(ctx, live, pointsGroup, "k", ok, nil); !errors.Is(err, outbox.ErrNullArgument) {
		t.Fatalf("nil handler: %v", err)
	}
	// A done context: the statement is not run, the handler neither.
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	ran := false
	if _, err := inbox.ProcessTx(cancelled, live, pointsGroup, "k", ok, func(*sql.Tx) error { ran = true; return nil }); !errors.Is(err, context.Canceled) || ran {
		t.Fatalf("cancelled context: %v, ran %v", err, ran)
	}
	// Nothing was written, and the live transaction is still usable.
	var n int
	if err := live.QueryRow("SELECT COUNT(*) FROM " + inbox.Table()).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d marks written by refused calls (%v)", n, err)
	}
	if err := live.Commit(); err != nil {
		t.Fatal(err)
	}
	if c := count(t, "SELECT COUNT(*) FROM "+inbox.Table()); c != 0 {
		t.Fatalf("%d marks after commit", c)
	}
}

func TestEventKeyIsTheEventKeyPropertyWithoutFallback(t *testing.T) {
	key, err := outbox.EventKey(map[string]string{"eventKey": "shop.t_event_record:42", "eventId": "42", "KEYS": "42"})
	if err != nil || key != "shop.t_event_record:42" {
		t.Fatalf("EventKey = %q, %v", key, err)
	}
	if outbox.EventKeyProperty != "eventKey" {
		t.Fatalf("EventKeyProperty = %q", outbox.EventKeyProperty)
	}
	for _, props := range []map[string]string{
		nil,
		{},
		{"eventId": "42", "KEYS": "42", "UNIQ_KEY": "7F0000010001"},
		{"eventKey": ""},
		{"eventkey": "shop.t_event_record:42"},
	} {
		key, err := outbox.EventKey(props)
		if key != "" || !errors.Is(err, outbox.ErrInvalidEvent) || !strings.Contains(err.Error(), "eventKey") {
			t.Fatalf("EventKey(%v) = %q, %v; want an error naming eventKey", props, key, err)
		}
	}
}
