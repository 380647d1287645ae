package tests

import (
	"bytes"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	outbox "github.com/outbox-rs/outbox/bindings/go"
)

// The Go consumer (outbox.StartConsumer / StartBatchConsumer) against the RocketMQ broker on
// loopback: each test relays orders of a topic of its own with outbox.Start, then consumes them
// with a group of its own, crediting a table of its own through the borrowed transaction.

// order is what the tests publish: a business key and the points it is worth.
type order struct {
	BizNo  string `json:"order"`
	Points int    `json:"points"`
}

// needBroker skips the test when no name server listens on 127.0.0.1:9876.
func needBroker(t testing.TB) {
	t.Helper()
	if !brokerPresent() {
		t.Skip("no RocketMQ name server on 127.0.0.1:9876 (scripts/rocketmq start)")
	}
}

// skipWithoutRocketMQ skips the test when err says the library lacks the rocketmq feature.
func skipWithoutRocketMQ(t testing.TB, err error) {
	t.Helper()
	if errors.Is(err, outbox.ErrPublisher) && strings.Contains(err.Error(), "rocketmq feature") {
		t.Skipf("the library was built without --features rocketmq: %v", err)
	}
	if errors.Is(err, outbox.ErrInvalidValue) && strings.Contains(err.Error(), "publisher") {
		t.Skipf("the library was built without --features rocketmq: %v", err)
	}
}

// consumerTest is one test's topic, group, outbox table, credits table and relay. The outbox
// table is the test's own, so that only its relay sends its rows (a relay sends a row without a
// topic to its own default topic) and it sends no other test's.
type consumerTest struct {
	t       testing.TB
	topic   string
	group   string
	table   string // the outbox table
	credits string // the table the handler credits: order_no, points, n (times credited)
	relay   *outbox.Relay
}

func newConsumerTest(t testing.TB) *consumerTest {
	t.Helper()
	needBroker(t)
	suffix := strings.ReplaceAll(unique("x"), "-", "")[1:]
	ct := &consumerTest{
		t:       t,
		topic:   "outbox_go_c_" + suffix,
		group:   "points-go-" + suffix,
		table:   "outbox_" + suffix,
		credits: "credits_" + suffix,
	}
	if err := outbox.Migrate(outbox.Config{Settings: map[string]string{"db.url": dbURL, "table": ct.table}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS " + ct.table) })
	if _, err := db.Exec("CREATE TABLE " + ct.credits + ` (order_no VARCHAR(64) PRIMARY KEY,
		points BIGINT NOT NULL, n INT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS " + ct.credits) })
	r, err := outbox.Start(outbox.Config{Settings: ct.settings()})
	skipWithoutRocketMQ(t, err)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	ct.relay = r
	return ct
}

// settings are the relay's and the consumer's: one Config serves both.
func (ct *consumerTest) settings(extra ...string) map[string]string {
	s := map[string]string{
		"db.url": dbURL, "publisher": "rocketmq", "rocketmq.namesrv": "127.0.0.1:9876",
		"table": ct.table, "topic": ct.topic, "scan.interval.ms": "100", "send.timeout.ms": "10000",
		"consumer.backoff.initial.ms": "50", "consumer.backoff.max.ms": "200",
		// The tests read the sent rows back (their event keys, a resend): keep them.
		"sent.rows": "keep",
	}
	for i := 0; i+1 < len(extra); i += 2 {
		s[extra[i]] = extra[i+1]
	}
	return s
}

// publish enqueues one ORDER_PAID event per order in one transaction and waits until the relay
// has sent them all. It returns the payload of each order.
func (ct *consumerTest) publish(orders ...order) map[string][]byte {
	t := ct.t
	t.Helper()
	tx, err := ct.relay.Begin()
	if err != nil {
		t.Fatal(err)
	}
	payloads := map[string][]byte{}
	ids := make([]string, 0, len(orders))
	for _, o := range orders {
		body, _ := json.Marshal(o)
		payloads[o.BizNo] = body
		id, err := tx.Enqueue(outbox.Event{BizNo: o.BizNo, EventType: "ORDER_PAID", Payload: body})
		if err != nil {
			tx.Rollback()
			t.Fatal(err)
		}
		ids = append(ids, strconv.FormatUint(id, 10))
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "the relay to send the orders", func() bool {
		// Sent rows are deleted (sent.rows = delete) or SUCCESS.
		return count(t, "SELECT COUNT(*) FROM "+ct.table+" WHERE status <> 'SUCCESS' AND id IN ("+strings.Join(ids, ",")+")") == 0
	})
	return payloads
}

// prefix is the start of every business key of this test.
func (ct *consumerTest) prefix() string { return ct.group + "-" }

func (ct *consumerTest) orders(names ...string) []order {
	os := make([]order, len(names))
	for i, n := range names {
		os[i] = order{BizNo: ct.prefix() + n, Points: 10 * (i + 1)}
	}
	return os
}

// name is an order's short name (its business key without the prefix).
func (ct *consumerTest) name(m *outbox.Message) string {
	return strings.TrimPrefix(m.Properties["bizNo"], ct.prefix())
}

// credit credits m's order through the consumer's transaction.
func (ct *consumerTest) credit(tx *outbox.ConsumerTx, m *outbox.Message) error {
	var o order
	if err := json.Unmarshal(m.Body, &o); err != nil {
		return fmt.Errorf("body %q: %w", m.Body, err)
	}
	_, err := tx.Exec("INSERT INTO "+ct.credits+" (order_no, points, n) VALUES (?, ?, 1) ON DUPLICATE KEY UPDATE n = n + 1",
		o.BizNo, o.Points)
	return err
}

// startConsumer starts a consumer of the test's topic and group, closed at the end.
func (ct *consumerTest) startConsumer(handler func(*outbox.ConsumerTx, *outbox.Message) error, extra ...string) *outbox.Consumer {
	ct.t.Helper()
	c, err := outbox.StartConsumer(outbox.Config{Settings: ct.settings(extra...)}, ct.topic, ct.group, handler)
	skipWithoutRocketMQ(ct.t, err)
	if err != nil {
		ct.t.Fatal(err)
	}
	ct.t.Cleanup(func() { c.Close() })
	return c
}

// stats reads the consumer's stats, failing the test on an error.
func stats(t testing.TB, c *outbox.Consumer) outbox.ConsumerStats {
	t.Helper()
	s, err := c.Stats()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// waitStats waits until cond holds for the consumer's stats.
func waitStats(t testing.TB, c *outbox.Consumer, timeout time.Duration, what string, cond func(outbox.ConsumerStats) bool) outbox.ConsumerStats {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		s := stats(t, c)
		if cond(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s; stats %s", timeout, what, s.Raw)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", timeout, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// creditedOnce checks that every order named was credited exactly once with its points, and
// nothing else.
func (ct *consumerTest) creditedOnce(orders []order) {
	t := ct.t
	t.Helper()
	rows, err := db.Query("SELECT order_no, points, n FROM " + ct.credits)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := map[string][2]int{}
	for rows.Next() {
		var no string
		var points, n int
		if err := rows.Scan(&no, &points, &n); err != nil {
			t.Fatal(err)
		}
		got[no] = [2]int{points, n}
	}
	if len(got) != len(orders) {
		t.Errorf("%d orders credited, want %d: %v", len(got), len(orders), got)
	}
	for _, o := range orders {
		if g, ok := got[o.BizNo]; !ok || g[0] != o.Points || g[1] != 1 {
			t.Errorf("order %s: credited %v (points, times), want (%d, 1)", o.BizNo, g, o.Points)
		}
	}
}

// calls counts handler calls per order, under a mutex (handlers run on several threads).
type calls struct {
	mu sync.Mutex
	n  map[string]int
}

func newCalls() *calls { return &calls{n: map[string]int{}} }

// seen counts a call for name and returns how many calls it had before this one.
func (c *calls) seen(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[name]++
	return c.n[name] - 1
}

func (c *calls) get(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[name]
}

func (c *calls) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, v := range c.n {
		n += v
	}
	return n
}

// Ten orders relayed, consumed with one message per transaction: each credited once through the
// borrowed transaction (one failing on first sight: one failed attempt, its credit rolled back,
// then credited); the messages carry what the relay sent; a kept transaction is refused; the
// relay sending them all again gives ten duplicates and no credit; stats after Stop are final.
func TestConsumerCreditsEachOrderOnceAndCountsDuplicates(t *testing.T) {
	t.Parallel()
	ct := newConsumerTest(t)
	orders := ct.orders("1", "2", "3", "4", "5", "6", "7", "8", "9", "10")
	payloads := ct.publish(orders...)

	seen := newCalls()
	var mu sync.Mutex
	var kept *outbox.ConsumerTx
	messages := map[string]*outbox.Message{}
	var notRefused []error
	c := ct.startConsumer(func(tx *outbox.ConsumerTx, m *outbox.Message) error {
		name := ct.name(m)
		before := seen.seen(name)
		// Only the consumer ends its transaction.
		_, commitErr := tx.Exec("COMMIT")
		mu.Lock()
		messages[name] = m
		if kept == nil {
			kept = tx
		}
		if !errors.Is(commitErr, outbox.ErrInvalidArgument) || !strings.Contains(commitErr.Error(), "COMMIT") {
			notRefused = append(notRefused, commitErr)
		}
		mu.Unlock()
		if err := ct.credit(tx, m); err != nil {
			return err
		}
		if name == "3" && before == 0 {
			return errors.New("points ledger busy") // after the credit: rolled back with it
		}
		return nil
	}, "consumer.batch.max", "1")

	// Counts are checked as at-least-once delivery allows: the broker may deliver a message
	// again (after a broker restart, say), which the inbox makes a duplicate, so every message
	// received is either processed or a duplicate.
	settled := func(s outbox.ConsumerStats) bool { return s.InFlight == 0 && s.Received == s.Processed+s.Duplicates }
	s := waitStats(t, c, 90*time.Second, "10 orders processed", func(s outbox.ConsumerStats) bool { return s.Processed >= 10 && settled(s) })
	if s.Processed != 10 || s.FailedAttempts != 1 || s.DeadLettered != 0 || s.Stopped {
		t.Fatalf("stats %s", s.Raw)
	}
	if s.Duplicates != 0 || !s.Healthy {
		t.Logf("the broker delivered copies, or was unreachable, meanwhile: stats %s", s.Raw)
	}
	ct.creditedOnce(orders)
	if n := count(t, "SELECT COUNT(*) FROM outbox_inbox WHERE consumer_group = ?", ct.group); n != 10 {
		t.Fatalf("%d inbox marks, want 10", n)
	}
	if seen.total() != 11 || seen.get("3") != 2 {
		t.Fatalf("handler calls %v", seen.n)
	}

	// The messages, kept after their handler returned, are Go copies of what the relay sent.
	mu.Lock()
	if len(notRefused) != 0 {
		t.Errorf("COMMIT through the consumer's transaction: %v", notRefused)
	}
	for _, o := range orders {
		m := messages[strings.TrimPrefix(o.BizNo, ct.prefix())]
		var id int64
		var key string
		if err := db.QueryRow("SELECT id, event_key FROM "+ct.table+" WHERE biz_no = ?", o.BizNo).Scan(&id, &key); err != nil {
			t.Fatal(err)
		}
		if m == nil || m.Key != key || m.Properties["eventKey"] != key || m.Properties["eventId"] != strconv.FormatInt(id, 10) ||
			m.Properties["eventType"] != "ORDER_PAID" || m.Topic != ct.topic || m.Broker == "" || m.MsgID == "" ||
			m.Tag != "ORDER_PAID" || !bytes.Equal(m.Body, payloads[o.BizNo]) || m.QueueOffset < 0 {
			t.Errorf("order %s (event %d, key %s): message %+v", o.BizNo, id, key, m)
		}
	}
	// A transaction kept after its handler returned is refused, clearly.
	_, err := kept.Exec("INSERT INTO " + ct.credits + " (order_no, points, n) VALUES ('late', 1, 1)")
	if !errors.Is(err, outbox.ErrTxFinished) || !strings.Contains(err.Error(), "handler") {
		t.Errorf("Exec on a kept ConsumerTx: %v", err)
	}
	if _, _, err := kept.QueryInt64("SELECT 1"); !errors.Is(err, outbox.ErrTxFinished) {
		t.Errorf("QueryInt64 on a kept ConsumerTx: %v", err)
	}
	mu.Unlock()

	// The relay sends every order again (as after a lease expiry): the same eventKey, so the
	// inbox absorbs them all; the handler does not run.
	if _, err := db.Exec("UPDATE " + ct.table + ` SET status = 'WAIT', next_retry_time = NOW(3), claim_owner = NULL,
		claimed_at = NULL, claim_token = NULL`); err != nil {
		t.Fatal(err)
	}
	if err := ct.relay.Notify(); err != nil {
		t.Fatal(err)
	}
	before := s.Duplicates
	s = waitStats(t, c, 60*time.Second, "10 duplicates more", func(s outbox.ConsumerStats) bool { return s.Duplicates >= before+10 && settled(s) })
	if s.Processed != 10 || seen.total() != 11 {
		t.Fatalf("after the resend: stats %s, handler calls %v", s.Raw, seen.n)
	}
	ct.creditedOnce(orders)
	// The lag, once known, is 0: every offset is committed.
	s = waitStats(t, c, 30*time.Second, "the lag to be known and 0", func(s outbox.ConsumerStats) bool { return s.Lag != nil && *s.Lag == 0 })

	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	s = stats(t, c)
	if !s.Stopped || s.Processed != 10 || s.Duplicates < 10 || s.FailedAttempts != 1 || s.Received != s.Processed+s.Duplicates {
		t.Fatalf("stats after Stop %s", s.Raw)
	}
}

// A credit that needs a row the test holds fails with a lock wait timeout (1 s, set through the
// borrowed transaction): the handler returns Exec's error wrapped, and the message is retried
// without using an attempt (max.attempts 2, more failures than that) until the test lets go.
// An error wrapped with outbox.Transient is treated the same way.
func TestConsumerRetriesALockWaitTimeoutWithoutAnAttempt(t *testing.T) {
	t.Parallel()
	ct := newConsumerTest(t)
	lockme := ct.credits + "_lock"
	if _, err := db.Exec("CREATE TABLE " + lockme + " (id INT PRIMARY KEY, n INT NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS " + lockme) })
	if _, err := db.Exec("INSERT INTO " + lockme + " VALUES (1, 0)"); err != nil {
		t.Fatal(err)
	}
	// Hold the row ORD-LOCK's credit needs.
	holder, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback()
	var n int
	if err := holder.QueryRow("SELECT n FROM " + lockme + " WHERE id = 1 FOR UPDATE").Scan(&n); err != nil {
		t.Fatal(err)
	}
	orders := ct.orders("LOCK", "TRANSIENT", "A", "B")
	ct.publish(orders...)

	seen := newCalls()
	var mu sync.Mutex
	var lockErrs []error
	c := ct.startConsumer(func(tx *outbox.ConsumerTx, m *outbox.Message) error {
		name := ct.name(m)
		before := seen.seen(name)
		switch {
		case name == "LOCK":
			if _, err := tx.Exec("SET SESSION innodb_lock_wait_timeout = 1"); err != nil {
				return err
			}
			if _, err := tx.Exec("UPDATE " + lockme + " SET n = n + 1 WHERE id = 1"); err != nil {
				mu.Lock()
				lockErrs = append(lockErrs, err)
				mu.Unlock()
				return fmt.Errorf("crediting %s: %w", m.Properties["bizNo"], err)
			}
		case name == "TRANSIENT" && before < 3:
			return outbox.Transient(errors.New("loyalty service unavailable"))
		}
		return ct.credit(tx, m)
	}, "consumer.batch.max", "1", "consumer.max.attempts", "2")

	waitFor(t, 90*time.Second, "three lock wait timeouts", func() bool { return seen.get("LOCK") >= 3 })
	if err := holder.Rollback(); err != nil {
		t.Fatal(err)
	}
	s := waitStats(t, c, 60*time.Second, "4 orders processed", func(s outbox.ConsumerStats) bool { return s.Processed >= 4 })
	mu.Lock()
	defer mu.Unlock()
	for _, err := range lockErrs {
		var oe *outbox.Error
		if !errors.Is(err, outbox.ErrDatabase) || !errors.As(err, &oe) || !oe.Retriable() || !outbox.IsTransient(err) ||
			!strings.Contains(err.Error(), "Lock wait timeout") {
			t.Errorf("the lock wait's error: %#v", err)
		}
	}
	transient := len(lockErrs) + 3
	if s.Processed != 4 || s.FailedAttempts != 0 || s.DeadLettered != 0 || s.DBErrors != uint64(transient) ||
		seen.get("TRANSIENT") != 4 {
		t.Fatalf("stats %s; %d transient failures, handler calls %v", s.Raw, transient, seen.n)
	}
	ct.creditedOnce(orders)
	if n := count(t, "SELECT n FROM "+lockme+" WHERE id = 1"); n != 1 {
		t.Fatalf("lockme n = %d, want 1", n)
	}
}

// A message whose handler always fails is parked after consumer.max.attempts (3) with the
// error's text, the other orders go on; with batching on (the default), the failing batch is
// handled again one message per transaction, so only the poison message uses attempts.
func TestConsumerParksAPoisonMessageAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	ct := newConsumerTest(t)
	orders := ct.orders("1", "2", "POISON", "3", "4", "5")
	payloads := ct.publish(orders...)
	seen := newCalls()
	c := ct.startConsumer(func(tx *outbox.ConsumerTx, m *outbox.Message) error {
		name := ct.name(m)
		seen.seen(name)
		if err := ct.credit(tx, m); err != nil {
			return err
		}
		if name == "POISON" {
			// Longer than the library's error buffer (512 bytes): cut at a character, with "...".
			return fmt.Errorf("order %s cannot be credited: unknown user; %s", m.Properties["bizNo"], strings.Repeat("é", 400))
		}
		return nil
	}, "consumer.max.attempts", "3", "consumer.threads", "1")

	s := waitStats(t, c, 90*time.Second, "5 processed and 1 parked", func(s outbox.ConsumerStats) bool {
		return s.Processed >= 5 && s.DeadLettered >= 1 && s.InFlight == 0
	})
	// A copy of the parked message delivered again (a broker restart, say) joins its dead letter
	// after one attempt of its own (ParkedCopies).
	if s.Processed != 5 || s.DeadLettered != 1 || s.FailedAttempts != 3+s.ParkedCopies || s.Transactions < 1 {
		t.Fatalf("stats %s", s.Raw)
	}
	if seen.get("POISON") < 3 {
		t.Fatalf("handler calls %v", seen.n)
	}
	var key, lastError, status string
	var attempts int
	var body []byte
	poison := orders[2]
	err := db.QueryRow(`SELECT event_key, attempts, last_error, status, body FROM outbox_inbox_dead_letter
		WHERE consumer_group = ?`, ct.group).Scan(&key, &attempts, &lastError, &status, &body)
	if err != nil {
		t.Fatal(err)
	}
	var want string
	_ = db.QueryRow("SELECT event_key FROM "+ct.table+" WHERE biz_no = ?", poison.BizNo).Scan(&want)
	if key != want || attempts != 3+int(s.ParkedCopies) || status != "DEAD" || !bytes.Equal(body, payloads[poison.BizNo]) ||
		!strings.Contains(lastError, "order "+poison.BizNo+" cannot be credited: unknown user; éé") ||
		!strings.HasSuffix(lastError, "é...") || !utf8.ValidString(lastError) || len(lastError) > 600 {
		t.Fatalf("dead letter: key %s (want %s), %d attempts, %s, %q, body %q", key, want, attempts, status, lastError, body)
	}
	ct.creditedOnce(append(orders[:2:2], orders[3:]...))
}

// Panics are recovered (never crossing into the library) and are failures, not transient: one
// on first sight is one failed attempt then a credit; runtime.Goexit in the handler the same;
// a handler that always panics gets its message parked with the panic's text as last_error.
func TestConsumerRecoversAPanickingHandler(t *testing.T) {
	t.Parallel()
	ct := newConsumerTest(t)
	orders := ct.orders("PANIC-ONCE", "GOEXIT-ONCE", "ALWAYS", "OK")
	ct.publish(orders...)
	seen := newCalls()
	c := ct.startConsumer(func(tx *outbox.ConsumerTx, m *outbox.Message) error {
		name := ct.name(m)
		before := seen.seen(name)
		if err := ct.credit(tx, m); err != nil {
			return err
		}
		switch {
		case name == "PANIC-ONCE" && before == 0:
			var credits map[string]int
			credits["x"]++ // a nil map: a runtime error
		case name == "GOEXIT-ONCE" && before == 0:
			runtime.Goexit()
		case name == "ALWAYS":
			panic(outbox.Transient(errors.New("poison panic"))) // a panic is a failure, whatever its value
		}
		return nil
	}, "consumer.batch.max", "1", "consumer.max.attempts", "2")

	s := waitStats(t, c, 90*time.Second, "3 processed and 1 parked", func(s outbox.ConsumerStats) bool {
		return s.Processed >= 3 && s.DeadLettered >= 1 && s.InFlight == 0
	})
	if s.Processed != 3 || s.DeadLettered != 1 || s.FailedAttempts != 4+s.ParkedCopies || s.DBErrors != 0 {
		t.Fatalf("stats %s; handler calls %v", s.Raw, seen.n)
	}
	var lastError string
	var attempts int
	if err := db.QueryRow("SELECT attempts, last_error FROM outbox_inbox_dead_letter WHERE consumer_group = ?", ct.group).
		Scan(&attempts, &lastError); err != nil {
		t.Fatal(err)
	}
	if attempts != 2+int(s.ParkedCopies) || !strings.Contains(lastError, "the handler panicked: poison panic") {
		t.Fatalf("dead letter: %d attempts, %q", attempts, lastError)
	}
	ct.creditedOnce([]order{orders[0], orders[1], orders[3]})
}

// The batch handler gets the waiting messages at once and credits them in one statement. A
// second round of orders waits while the handler holds the last batch of the first (one handler
// thread), so it comes as one batch; the handler fails it (order 27), and the batch is handled
// again one message per call without using an attempt. Each order is credited once, and each
// successful call was one committed transaction.
func TestConsumerBatchHandlerCreditsABatchInOneStatement(t *testing.T) {
	t.Parallel()
	ct := newConsumerTest(t)
	names := make([]string, 30)
	for i := range names {
		names[i] = strconv.Itoa(i + 1)
	}
	orders := ct.orders(names...)
	ct.publish(orders[:20]...)

	var mu sync.Mutex
	var sizes []int
	failed, succeeded := 0, 0
	gate := make(chan struct{})
	var openOnce sync.Once
	open := func() { openOnce.Do(func() { close(gate) }) }
	held := make(chan struct{}, 1)
	c, err := outbox.StartBatchConsumer(outbox.Config{Settings: ct.settings("consumer.threads", "1")}, ct.topic, ct.group,
		func(tx *outbox.ConsumerTx, ms []*outbox.Message) error {
			mu.Lock()
			sizes = append(sizes, len(ms))
			mu.Unlock()
			var sqlText strings.Builder
			args := make([]any, 0, 2*len(ms))
			sqlText.WriteString("INSERT INTO " + ct.credits + " (order_no, points, n) VALUES ")
			for i, m := range ms {
				var o order
				if err := json.Unmarshal(m.Body, &o); err != nil {
					return err
				}
				if i > 0 {
					sqlText.WriteString(", ")
				}
				sqlText.WriteString("(?, ?, 1)")
				args = append(args, o.BizNo, o.Points)
			}
			sqlText.WriteString(" ON DUPLICATE KEY UPDATE n = n + 1")
			if _, err := tx.Exec(sqlText.String(), args...); err != nil {
				return err
			}
			for _, m := range ms {
				switch ct.name(m) {
				case "20": // the first round's last order: hold its batch until the second round waits
					select {
					case held <- struct{}{}:
						<-gate
					default:
					}
				case "27":
					if len(ms) > 1 {
						mu.Lock()
						failed++
						mu.Unlock()
						return errors.New("order 27 needs a batch of its own")
					}
				}
			}
			mu.Lock()
			succeeded++
			mu.Unlock()
			return nil
		})
	skipWithoutRocketMQ(t, err)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	defer open() // before Close, which waits for the handler
	select {
	case <-held:
	case <-time.After(90 * time.Second):
		open()
		t.Fatalf("the first round's last order never reached the handler; stats %s", stats(t, c).Raw)
	}
	ct.publish(orders[20:]...) // the second round, while the handler holds the first's last batch
	waitStats(t, c, 60*time.Second, "the second round received", func(s outbox.ConsumerStats) bool { return s.Received >= 30 })
	open()
	s := waitStats(t, c, 60*time.Second, "30 processed", func(s outbox.ConsumerStats) bool { return s.Processed >= 30 })
	mu.Lock()
	defer mu.Unlock()
	largest := 0
	for _, n := range sizes {
		if n > largest {
			largest = n
		}
	}
	t.Logf("batch sizes %v; stats %s", sizes, s.Raw)
	if s.Processed != 30 || s.FailedAttempts != 0 || s.DeadLettered != 0 || failed != 1 || s.BatchFallbacks != 1 ||
		largest < 2 || s.Transactions < uint64(succeeded) || (s.Duplicates == 0 && s.Transactions != uint64(succeeded)) ||
		s.Transactions >= 30 {
		t.Fatalf("stats %s; batch sizes %v, %d failed batches, %d successful calls", s.Raw, sizes, failed, succeeded)
	}
	ct.creditedOnce(orders)
}

// Stop waits for a handler in progress (its message is processed, not abandoned), and Stats
// called by that handler meanwhile does not wait for the Stop (which waits for the handler):
// it answers, or says the consumer is being stopped.
func TestConsumerStopWaitsForAHandlerThatAsksForStats(t *testing.T) {
	t.Parallel()
	ct := newConsumerTest(t)
	orders := ct.orders("SLOW")
	ct.publish(orders...)
	consumer := make(chan *outbox.Consumer, 1)
	inHandler := make(chan struct{}, 1)
	stopping := make(chan struct{})
	statsErr := make(chan error, 1)
	c := ct.startConsumer(func(tx *outbox.ConsumerTx, m *outbox.Message) error {
		c := <-consumer
		consumer <- c
		inHandler <- struct{}{}
		<-stopping
		_, err := c.Stats()
		statsErr <- err
		return ct.credit(tx, m)
	})
	consumer <- c
	select {
	case <-inHandler:
	case <-time.After(90 * time.Second):
		t.Fatalf("the order never reached the handler; stats %s", stats(t, c).Raw)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- c.Stop() }()
	time.Sleep(300 * time.Millisecond) // Stop is under way, waiting for the handler
	close(stopping)
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Stop did not return: deadlocked with the handler's Stats?")
	}
	err := <-statsErr
	if err != nil && !errors.Is(err, outbox.ErrStopped) {
		t.Fatalf("Stats from the handler during Stop: %v", err)
	}
	t.Logf("Stats from the handler during Stop: %v", err)
	if s := stats(t, c); !s.Stopped || s.Processed != 1 {
		t.Fatalf("stats after Stop %s", s.Raw)
	}
	ct.creditedOnce(orders)
}

// Bad input is refused before anything starts, with an error naming it.
func TestConsumerRefusesBadInput(t *testing.T) {
	base := map[string]string{"db.url": dbURL, "rocketmq.namesrv": "127.0.0.1:9876"}
	with := func(k, v string) outbox.Config {
		s := map[string]string{}
		for a, b := range base {
			s[a] = b
		}
		s[k] = v
		return outbox.Config{Settings: s}
	}
	ok := func(*outbox.ConsumerTx, *outbox.Message) error { return nil }
	okBatch := func(*outbox.ConsumerTx, []*outbox.Message) error { return nil }
	check := func(what string, c *outbox.Consumer, err error, sentinel error, words ...string) {
		t.Helper()
		if c != nil {
			c.Close()
		}
		var oe *outbox.Error
		if c != nil || !errors.Is(err, sentinel) || !errors.As(err, &oe) {
			t.Errorf("%s: %v, %#v (want %v)", what, c, err, sentinel)
			return
		}
		for _, w := range words {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not name %q", what, err, w)
			}
		}
	}
	cfg := outbox.Config{Settings: base}
	c, err := outbox.StartConsumer(cfg, "orders", "points", nil)
	check("nil handler", c, err, outbox.ErrNullArgument, "handler")
	c, err = outbox.StartBatchConsumer(cfg, "orders", "points", nil)
	check("nil batch handler", c, err, outbox.ErrNullArgument, "handler")
	c, err = outbox.StartConsumer(cfg, "", "points", ok)
	check("empty topic", c, err, outbox.ErrInvalidArgument, "topic")
	c, err = outbox.StartConsumer(cfg, "ord\x00ers", "points", ok)
	check("NUL in the topic", c, err, outbox.ErrInvalidArgument, "topic")
	c, err = outbox.StartConsumer(with("consumer.batch.max", "0"), "orders", "points", ok)
	check("consumer.batch.max=0", c, err, outbox.ErrInvalidValue, "consumer.batch.max", "0")
	c, err = outbox.StartBatchConsumer(with("consumer.max.attempts", "lots"), "orders", "points", okBatch)
	check("consumer.max.attempts=lots", c, err, outbox.ErrInvalidValue, "consumer.max.attempts", "lots")
	c, err = outbox.StartConsumer(with("consumer.no.such.key", "1"), "orders", "points", ok)
	check("an unknown key", c, err, outbox.ErrUnknownKey, "consumer.no.such.key")

	// What the library checks once it starts a consumer: needs the rocketmq feature.
	c, err = outbox.StartConsumer(cfg, "orders", "points group", ok)
	skipWithoutRocketMQ(t, err)
	check("a bad group", c, err, outbox.ErrInvalidEvent, "points group")
	c, err = outbox.StartBatchConsumer(with("inbox.table", "no_such_inbox"), "orders", "points", okBatch)
	if c != nil || err == nil || !strings.Contains(err.Error(), "no_such_inbox") {
		t.Errorf("a missing inbox table: %v, %v", c, err)
	}
	if c != nil {
		c.Close()
	}
}

// Stop blocks until stopped and may be called again; Stats then gives the final counts; Close
// after Stop, and again, is harmless; afterwards Stats and Stop say the consumer is closed.
// Stats racing with Stop and Close fails only with ErrStopped (run with -race).
func TestConsumerStopTwiceCloseAfterStopAndStatsAfterStop(t *testing.T) {
	t.Parallel()
	needBroker(t)
	suffix := strings.ReplaceAll(unique("s"), "-", "")[1:]
	c, err := outbox.StartConsumer(outbox.Config{Settings: map[string]string{"db.url": dbURL, "rocketmq.namesrv": "127.0.0.1:9876"}},
		"outbox_go_stop_"+suffix, "stop-"+suffix, func(*outbox.ConsumerTx, *outbox.Message) error { return nil })
	skipWithoutRocketMQ(t, err)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := stats(t, c)
	if s.Stopped || s.Received != 0 || len(s.Raw) == 0 {
		t.Fatalf("stats of a running consumer %s", s.Raw)
	}
	var wg sync.WaitGroup
	done := make(chan struct{})
	for g := 0; g < 3; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				if _, err := c.Stats(); err != nil && !errors.Is(err, outbox.ErrStopped) {
					t.Error(err)
				}
				time.Sleep(time.Millisecond)
			}
		}()
	}
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	s = stats(t, c)
	if !s.Stopped || s.Processed != 0 {
		t.Fatalf("stats after Stop %s", s.Raw)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close after Stop: %v", err)
	}
	close(done)
	wg.Wait()
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := c.Stats(); !errors.Is(err, outbox.ErrStopped) {
		t.Fatalf("Stats after Close: %v", err)
	}
	if err := c.Stop(); !errors.Is(err, outbox.ErrStopped) {
		t.Fatalf("Stop after Close: %v", err)
	}
}

// Which handler errors are transient (no broker needed).
func TestConsumerTransientErrors(t *testing.T) {
	base := errors.New("loyalty service unavailable")
	tr := outbox.Transient(base)
	if !errors.Is(tr, outbox.ErrTransient) || !errors.Is(tr, base) || !outbox.IsTransient(tr) || tr.Error() != base.Error() {
		t.Fatalf("Transient: %v", tr)
	}
	if !outbox.IsTransient(fmt.Errorf("crediting: %w", tr)) || outbox.Transient(nil) != nil {
		t.Fatal("Transient wrapped, or of nil")
	}
	lockWait := &outbox.Error{Code: outbox.CodeDatabase, Message: "Lock wait timeout exceeded"}
	if !outbox.IsTransient(fmt.Errorf("crediting: %w", lockWait)) || !outbox.IsTransient(&outbox.Error{Code: outbox.CodePoolTimeout}) {
		t.Fatal("a retriable *Error is transient")
	}
	for _, err := range []error{nil, base, &outbox.Error{Code: outbox.CodeStatement}, fmt.Errorf("x: %w", outbox.ErrTxFinished)} {
		if outbox.IsTransient(err) {
			t.Errorf("%v is not transient", err)
		}
	}
	if errors.Is(outbox.ErrDatabase, outbox.ErrTransient) || errors.Is(outbox.ErrTransient, outbox.ErrDatabase) {
		t.Fatal("ErrTransient is a sentinel of its own")
	}
}

// A points service whose handler also adds to the user's balance (a row every order of the user
// updates), routed by the user (consumer.route = property:userId, the userId header): 400
// orders of 20 users over four handler threads. No batch meets another's locks (no batch
// retried or handled one at a time), every balance adds up, each order credited once.
func TestConsumerRoutedByUserUpdatesSharedBalancesWithoutLockConflicts(t *testing.T) {
	t.Parallel()
	ct := newConsumerTest(t)
	balances := "balances_" + strings.TrimPrefix(ct.credits, "credits_")
	if _, err := db.Exec("CREATE TABLE " + balances + " (user_id VARCHAR(16) PRIMARY KEY, points BIGINT NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS " + balances) })
	for u := 0; u < 20; u++ {
		if _, err := db.Exec("INSERT INTO "+balances+" VALUES (?, 0)", fmt.Sprintf("u%d", u)); err != nil {
			t.Fatal(err)
		}
	}
	c := ct.startConsumer(func(tx *outbox.ConsumerTx, m *outbox.Message) error {
		if err := ct.credit(tx, m); err != nil {
			return err
		}
		res, err := tx.Exec("UPDATE "+balances+" SET points = points + 1 WHERE user_id = ?", m.Properties["userId"])
		if err != nil {
			return err
		}
		// database/sql's reading of the result.
		if n, err := res.RowsAffected(); n != 1 || err != nil {
			return fmt.Errorf("the balance of %s: %d rows, %v", m.Properties["userId"], n, err)
		}
		if id, err := res.LastInsertId(); id != 0 || err != nil {
			return fmt.Errorf("an UPDATE's last insert id: %d, %v", id, err)
		}
		return nil
	}, "consumer.route", "property:userId", "consumer.threads", "4")
	tx, err := ct.relay.Begin()
	if err != nil {
		t.Fatal(err)
	}
	orders := make([]order, 400)
	for i := range orders {
		orders[i] = order{BizNo: fmt.Sprintf("%s%d", ct.prefix(), i), Points: 1}
		body, _ := json.Marshal(orders[i])
		ev := outbox.Event{BizNo: orders[i].BizNo, EventType: "ORDER_PAID", Payload: body,
			Headers: map[string]string{"userId": fmt.Sprintf("u%d", i%20)}}
		if _, err := tx.Enqueue(ev); err != nil {
			tx.Rollback()
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	s := waitStats(t, c, 120*time.Second, "400 orders processed", func(s outbox.ConsumerStats) bool {
		return s.Processed >= 400 && s.InFlight == 0
	})
	if s.Processed != 400 || s.BatchRetries != 0 || s.BatchFallbacks != 0 || s.FailedAttempts != 0 {
		t.Fatalf("stats %s", s.Raw)
	}
	ct.creditedOnce(orders)
	if n := count(t, "SELECT COUNT(*) FROM "+balances+" WHERE points = 20"); n != 20 {
		t.Fatalf("%d of 20 balances at 20 points", n)
	}
}

// MigrateConsumer on an empty database creates the consumer's tables alone (the inbox and its
// dead letters; none of the relay's), then has nothing to do; without db.url it says so.
func TestMigrateConsumerCreatesTheConsumersTablesAlone(t *testing.T) {
	t.Parallel()
	name := "outbox_go_c_" + strings.ReplaceAll(unique("x"), "-", "")[1:]
	admin, err := sql.Open("mysql", serverDSN)
	if err != nil {
		t.Fatal(err)
	}
	// Dropped, then closed, after the test (a deferred Close would run first).
	t.Cleanup(func() {
		_, _ = admin.Exec("DROP DATABASE IF EXISTS " + name)
		admin.Close()
	})
	if _, err := admin.Exec("CREATE DATABASE " + name); err != nil {
		t.Fatal(err)
	}
	url := dbURL[:strings.LastIndex(dbURL, "/")+1] + name
	for i := 0; i < 2; i++ { // the second run has nothing to do
		if err := outbox.MigrateConsumer(outbox.Config{Settings: map[string]string{"db.url": url}}); err != nil {
			t.Fatal(err)
		}
	}
	rows, err := admin.Query("SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? ORDER BY 1", name)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var tables []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		tables = append(tables, n)
	}
	if strings.Join(tables, ",") != "outbox_inbox,outbox_inbox_dead_letter,outbox_schema_history" {
		t.Fatalf("tables %v", tables)
	}
	err = outbox.MigrateConsumer(outbox.Config{Settings: map[string]string{}})
	if !errors.Is(err, outbox.ErrInvalidValue) || !strings.Contains(err.Error(), "db.url") {
		t.Fatalf("without db.url: %v", err)
	}
}

// A handler waiting on something slow sees its context cancelled when Stop begins and gives
// up: Stop returns, no attempt is charged, nothing of the message is committed (its credit and
// its inbox mark rolled back together).
func TestConsumerStopCancelsTheHandlersContext(t *testing.T) {
	t.Parallel()
	ct := newConsumerTest(t)
	orders := ct.orders("slow")
	ct.publish(orders...)
	waiting := make(chan struct{})
	var once sync.Once
	c := ct.startConsumer(func(tx *outbox.ConsumerTx, m *outbox.Message) error {
		if err := ct.credit(tx, m); err != nil {
			return err
		}
		once.Do(func() { close(waiting) })
		select {
		case <-tx.Context().Done():
			return fmt.Errorf("the points service gave up: %w", tx.Context().Err())
		case <-time.After(2 * time.Minute):
			return errors.New("the context was never cancelled")
		}
	}, "consumer.batch.max", "1")
	select {
	case <-waiting:
	case <-time.After(90 * time.Second):
		t.Fatal("the handler was never called")
	}
	done := make(chan error, 1)
	go func() { done <- c.Stop() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Stop did not return: the handler's context was not cancelled")
	}
	s := stats(t, c)
	if s.FailedAttempts != 0 || s.Processed != 0 || s.DeadLettered != 0 {
		t.Fatalf("stats %s", s.Raw)
	}
	if n := count(t, "SELECT COUNT(*) FROM "+ct.credits); n != 0 {
		t.Fatalf("%d credits committed", n)
	}
	if n := count(t, "SELECT COUNT(*) FROM outbox_inbox WHERE consumer_group = ?", ct.group); n != 0 {
		t.Fatalf("%d inbox marks committed", n)
	}
}
