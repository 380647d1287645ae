package tests

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	outbox "github.com/outbox-rs/outbox/bindings/go"
)

// BenchmarkConsumerCrossings: the points handler (a credit INSERT and an upsert of the user's
// row) over one topic of 20 000 relayed events, read by StartConsumer (a per-message handler)
// and by StartBatchConsumer calling the same function on each message of the batch, each with a
// group of its own, twice each, in the same run. Both cross from the library into Go once per
// batch: the two should match. (When StartConsumer crossed once per message, with a goroutine
// per message, it did 2 587 and 2 677 msg/s against 4 418 and 4 491 per batch in one run of this
// benchmark on the debug library.) Not part of the suite:
//
//	bindings/go/run-tests.sh -run '^$' -bench ConsumerCrossings -benchtime 1x
//
// benches/by-language.sh runs it beside the C and Java consumers (OUTBOX_BENCH_EVENTS events).
func BenchmarkConsumerCrossings(b *testing.B) {
	n := 20000
	if s := os.Getenv("OUTBOX_BENCH_EVENTS"); s != "" { // benches/by-language.sh
		if v, err := strconv.Atoi(s); err == nil && v > 0 {
			n = v
		}
	}
	ct := newConsumerTest(b)
	tx, err := ct.relay.Begin()
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; i < n; i++ {
		ev := outbox.Event{BizNo: fmt.Sprintf("%s%d", ct.prefix(), i), EventType: "ORDER_PAID",
			Payload: []byte(fmt.Sprintf(`{"BizNo":"%s%d","Points":1}`, ct.prefix(), i)),
			Headers: map[string]string{"userId": fmt.Sprintf("u%d", i%200)}}
		if _, err := tx.Enqueue(ev); err != nil {
			b.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		b.Fatal(err)
	}
	// Every event on the topic before the consumers start.
	for left := n; left > 0; time.Sleep(100 * time.Millisecond) {
		if err := db.QueryRow("SELECT COUNT(*) FROM " + ct.table + " WHERE status <> 'SUCCESS'").Scan(&left); err != nil {
			b.Fatal(err)
		}
	}
	// The relay's work is done: the consumers run alone, as in the C and Java benches.
	if err := ct.relay.Stop(context.Background()); err != nil {
		b.Fatal(err)
	}
	for _, shape := range []string{"StartConsumer", "StartBatchConsumer", "StartConsumer", "StartBatchConsumer"} {
		group := unique("bench")
		credits := "bcredits_" + group[len("bench-"):]
		if _, err := db.Exec("CREATE TABLE " + credits + " (order_no VARCHAR(64) PRIMARY KEY, points BIGINT NOT NULL, n INT NOT NULL)"); err != nil {
			b.Fatal(err)
		}
		handler := func(tx *outbox.ConsumerTx, m *outbox.Message) error {
			if _, err := tx.Exec("INSERT INTO "+credits+" (order_no, points, n) VALUES (?, 1, 1)", m.Properties["bizNo"]); err != nil {
				return err
			}
			_, err := tx.Exec("INSERT INTO "+credits+" (order_no, points, n) VALUES (?, 1, 1) ON DUPLICATE KEY UPDATE n = n + 1", "user-"+m.Properties["userId"])
			return err
		}
		settings := outbox.Config{Settings: ct.settings()}
		var c *outbox.Consumer
		if shape == "StartConsumer" {
			c, err = outbox.StartConsumer(settings, ct.topic, group, handler)
		} else {
			c, err = outbox.StartBatchConsumer(settings, ct.topic, group, func(tx *outbox.ConsumerTx, ms []*outbox.Message) error {
				for _, m := range ms {
					if err := handler(tx, m); err != nil {
						return err
					}
				}
				return nil
			})
		}
		if err != nil {
			b.Fatal(err)
		}
		var t0 time.Time
		for {
			s, err := c.Stats()
			if err != nil {
				b.Fatal(err)
			}
			if s.Processed > 0 && t0.IsZero() {
				t0 = time.Now()
			}
			if s.Processed+s.Duplicates >= uint64(n) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		rate := float64(n) / time.Since(t0).Seconds()
		s, _ := c.Stats()
		c.Close()
		_, _ = db.Exec("DROP TABLE " + credits)
		fmt.Printf("  %-18s %8.0f msg/s  (%d transactions, %d batch retries)\n", shape, rate, s.Transactions, s.BatchRetries)
	}
}
