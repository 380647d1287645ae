//! The consumer runtime on a real MariaDB, fed by an in-memory source (the RocketMQ source has
//! its own end-to-end tests): handled once per key, offsets only after the commit, per-queue
//! order, retries, dead letters and their replay.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use mysql::prelude::Queryable;
use parking_lot::Mutex;

use crate::support::{wait_until, TestDb};
use outbox::consumer::dead_letter::{self, Selection};
use outbox::consumer::{Consumer, ConsumerConfig, HandlerError, KeySource, Message, QueueRef, Source};

const LONG: Duration = Duration::from_secs(30);

/// Messages handed out in order; commits recorded.
#[derive(Default)]
pub(crate) struct MemSource {
    pending: Mutex<VecDeque<Message>>,
    commits: Mutex<Vec<(QueueRef, u64, bool)>>,
    persisted: AtomicUsize,
    shut: AtomicBool,
    /// Polls that found nothing pending: the poller comes back to poll only after it handed
    /// every message of the previous poll to a handler thread.
    empty_polls: AtomicUsize,
    /// What `lag` answers.
    lag: Mutex<Option<u64>>,
}

impl MemSource {
    pub(crate) fn with(messages: Vec<Message>) -> Arc<MemSource> {
        let s = MemSource::default();
        s.pending.lock().extend(messages);
        Arc::new(s)
    }

    /// The highest offset committed per queue.
    fn committed(&self) -> HashMap<QueueRef, u64> {
        let mut out = HashMap::new();
        for (q, o, _) in self.commits.lock().iter() {
            let e = out.entry(q.clone()).or_insert(0);
            *e = (*e).max(*o);
        }
        out
    }
}

impl Source for MemSource {
    fn poll(&self, timeout: Duration) -> outbox::Result<Vec<Message>> {
        let batch: Vec<Message> = {
            let mut p = self.pending.lock();
            let n = p.len().min(16);
            p.drain(..n).collect()
        };
        if batch.is_empty() {
            self.empty_polls.fetch_add(1, SeqCst);
            std::thread::sleep(timeout.min(Duration::from_millis(20)));
        }
        Ok(batch)
    }

    fn commit(&self, next_offsets: &[(QueueRef, u64)], persist: bool) {
        if persist {
            self.persisted.fetch_add(1, SeqCst);
        }
        let mut c = self.commits.lock();
        for (q, o) in next_offsets {
            c.push((q.clone(), *o, persist));
        }
    }

    fn lag(&self) -> Option<u64> {
        *self.lag.lock()
    }

    fn shutdown(&self) {
        self.shut.store(true, SeqCst);
    }
}

fn queue(id: u32) -> QueueRef {
    QueueRef {
        topic: "orders".into(),
        broker: "broker-a".into(),
        queue_id: id,
    }
}

/// An order event as the relay sends it: `eventKey`, `eventId`, `bizNo`, the order in the body.
pub(crate) fn order_message(q: u32, offset: u64, key: &str, order: &str, amount: i64) -> Message {
    let mut p = BTreeMap::new();
    p.insert("eventKey".to_string(), key.to_string());
    p.insert("eventId".to_string(), offset.to_string());
    p.insert("bizNo".to_string(), order.to_string());
    p.insert("eventType".to_string(), "ORDER_PAID".to_string());
    Message::new(
        queue(q),
        offset,
        Some(format!("MSG{q}-{offset}")),
        Some("ORDER_PAID".into()),
        p,
        format!("{{\"order\":\"{order}\",\"amount\":{amount}}}").into_bytes(),
    )
}

pub(crate) fn points_table(db: &TestDb) {
    db.conn()
        .query_drop(
            "CREATE TABLE credits (order_no VARCHAR(32) NOT NULL, amount BIGINT NOT NULL, seq BIGINT AUTO_INCREMENT PRIMARY KEY)",
        )
        .unwrap();
}

/// The points service's handler: credits the order (one row per credit, so a double credit shows).
pub(crate) fn credit(tx: &mut mysql::Transaction<'_>, msg: &Message) -> Result<(), HandlerError> {
    let body: serde_json::Value = serde_json::from_slice(&msg.body)?;
    tx.exec_drop(
        "INSERT INTO credits (order_no, amount) VALUES (?, ?)",
        (
            body["order"].as_str().unwrap_or_default(),
            body["amount"].as_i64().unwrap_or_default(),
        ),
    )?;
    Ok(())
}

pub(crate) fn credits(db: &TestDb) -> Vec<(String, i64)> {
    db.conn()
        .query("SELECT order_no, amount FROM credits ORDER BY seq")
        .unwrap()
}

pub(crate) fn config(group: &str) -> ConsumerConfig {
    let mut c = ConsumerConfig::new(group);
    c.threads = 3;
    c.backoff_initial = Duration::from_millis(10);
    c.backoff_max = Duration::from_millis(50);
    c.replay_interval = Duration::from_millis(50);
    c
}

#[test]
fn every_key_is_handled_once_duplicates_are_counted_and_offsets_follow_the_commits() {
    let db = TestDb::new("cons_once");
    points_table(&db);
    let mut msgs = Vec::new();
    for q in 0..4u32 {
        for o in 0..25u64 {
            let order = format!("ORD-{q}-{o}");
            msgs.push(order_message(q, o, &format!("key-{q}-{o}"), &order, 10));
        }
    }
    // Copies: the first ten events of queue 0 again, later in the same queue (a redelivery).
    for o in 0..10u64 {
        msgs.push(order_message(
            0,
            25 + o,
            &format!("key-0-{o}"),
            &format!("ORD-0-{o}"),
            10,
        ));
    }
    let src = MemSource::with(msgs);
    let consumer = Consumer::start(config("points"), db.pool.clone(), src.clone(), Arc::new(credit)).unwrap();
    assert!(wait_until(LONG, || consumer.stats().processed
        + consumer.stats().duplicates
        == 110));
    let stats = consumer.stop();
    assert_eq!(
        (stats.processed, stats.duplicates, stats.received),
        (100, 10, 110),
        "{stats:?}"
    );
    assert_eq!(stats.fallback_keys, 0);
    let c = credits(&db);
    assert_eq!(c.len(), 100, "one credit per order");
    assert_eq!(c.iter().map(|(_, a)| a).sum::<i64>(), 1000);
    let committed = src.committed();
    assert_eq!(committed[&queue(0)], 35);
    for q in 1..4 {
        assert_eq!(committed[&queue(q)], 25, "queue {q}: next offset after the last");
    }
    assert!(src.persisted.load(SeqCst) > 0, "offsets stored at stop");
    assert!(src.shut.load(SeqCst));
    let marks: u64 = db
        .conn()
        .query_first("SELECT COUNT(*) FROM outbox_inbox")
        .unwrap()
        .unwrap();
    assert_eq!(marks, 100);
    let text = stats.prometheus("points");
    assert!(
        text.contains("outbox_consumer_duplicates_total{group=\"points\"} 10"),
        "{text}"
    );
}

#[test]
fn a_queue_is_handled_in_offset_order_and_a_message_is_committed_only_after_its_transaction() {
    let db = TestDb::new("cons_order");
    points_table(&db);
    // One key per order, each order's events in one queue: created, paid, shipped.
    let mut msgs = Vec::new();
    for q in 0..2u32 {
        for o in 0..60u64 {
            msgs.push(order_message(q, o, &format!("k{q}-{o}"), &format!("ORD-{q}"), o as i64));
        }
    }
    let src = MemSource::with(msgs);
    let seen: Arc<Mutex<HashMap<u32, Vec<u64>>>> = Arc::default();
    let committed_when_handled: Arc<Mutex<Vec<(u32, u64, u64)>>> = Arc::default();
    let (s2, c2, src2) = (seen.clone(), committed_when_handled.clone(), src.clone());
    let handler = move |tx: &mut mysql::Transaction<'_>, m: &Message| -> Result<(), HandlerError> {
        s2.lock().entry(m.queue.queue_id).or_default().push(m.offset);
        let already = src2.committed().get(&m.queue).copied().unwrap_or(0);
        c2.lock().push((m.queue.queue_id, m.offset, already));
        credit(tx, m)
    };
    let consumer = Consumer::start(config("ordered"), db.pool.clone(), src.clone(), Arc::new(handler)).unwrap();
    assert!(wait_until(LONG, || consumer.stats().processed == 120));
    consumer.stop();
    for (q, offsets) in seen.lock().iter() {
        assert_eq!(offsets, &(0..60).collect::<Vec<u64>>(), "queue {q} in offset order");
    }
    for (q, o, committed) in committed_when_handled.lock().iter() {
        assert!(
            committed <= o,
            "queue {q}: offset {committed} committed before message {o} was handled"
        );
    }
    // Per order, the credits were written in event order.
    for q in 0..2 {
        let amounts: Vec<i64> = db
            .conn()
            .exec(
                "SELECT amount FROM credits WHERE order_no = ? ORDER BY seq",
                (format!("ORD-{q}"),),
            )
            .unwrap();
        assert_eq!(amounts, (0..60).collect::<Vec<i64>>());
    }
}

#[test]
fn a_failing_handler_is_retried_then_parked_and_a_replay_handles_it_once() {
    let db = TestDb::new("cons_dead");
    points_table(&db);
    let msgs = vec![
        order_message(0, 0, "ok-1", "ORD-1", 5),
        order_message(0, 1, "flaky", "ORD-2", 7),
        order_message(0, 2, "poison", "ORD-3", 9),
        order_message(0, 3, "ok-4", "ORD-4", 11),
    ];
    let src = MemSource::with(msgs);
    let flaky_calls = Arc::new(AtomicUsize::new(0));
    let poison_ok = Arc::new(AtomicBool::new(false));
    let (f2, p2) = (flaky_calls.clone(), poison_ok.clone());
    let handler = move |tx: &mut mysql::Transaction<'_>, m: &Message| -> Result<(), HandlerError> {
        // Writes first, then fails: the rollback must undo the write and the mark.
        credit(tx, m)?;
        match m.key.as_str() {
            "flaky" if f2.fetch_add(1, SeqCst) < 2 => Err("points service busy".into()),
            "poison" if !p2.load(SeqCst) => Err(format!("order {} unknown", m.biz_no().unwrap()).into()),
            _ => Ok(()),
        }
    };
    let mut cfg = config("points-dl");
    cfg.max_attempts = 3;
    // One message per transaction: this test counts every call of the handler.
    cfg.batch_max = 1;
    let consumer = Consumer::start(cfg, db.pool.clone(), src.clone(), Arc::new(handler)).unwrap();
    assert!(wait_until(LONG, || {
        let s = consumer.stats();
        s.processed == 3 && s.dead_lettered == 1
    }));
    let s = consumer.stats();
    assert_eq!(s.failed_attempts, 2 + 3, "{s:?}");
    assert_eq!(flaky_calls.load(SeqCst), 3);
    assert!(
        wait_until(LONG, || src.committed().get(&queue(0)) == Some(&4)),
        "the queue moved on past the parked message"
    );
    // (ORD-4 may be credited before ORD-2's retry: another order, so maybe another thread.)
    let mut orders: Vec<String> = credits(&db).into_iter().map(|(o, _)| o).collect();
    orders.sort();
    assert_eq!(
        orders,
        ["ORD-1", "ORD-2", "ORD-4"],
        "failed attempts left nothing behind"
    );
    // Listed with what an operator needs.
    let dl = dead_letter::list(&db.pool, dead_letter::DEFAULT_TABLE, Some("points-dl"), None, 10).unwrap();
    assert_eq!(dl.len(), 1);
    let d = &dl[0];
    assert_eq!(
        (d.key.as_str(), d.attempts, d.queue_offset, d.status.as_str()),
        ("poison", 3, Some(2), "DEAD")
    );
    assert!(d.last_error.contains("order ORD-3 unknown"), "{}", d.last_error);
    // A replay while the handler still fails: back to DEAD with one more attempt.
    assert_eq!(
        dead_letter::request_replay(
            &db.pool,
            dead_letter::DEFAULT_TABLE,
            "points-dl",
            &Selection::All,
            false
        )
        .unwrap(),
        1
    );
    assert!(wait_until(LONG, || {
        let dl = dead_letter::list(&db.pool, dead_letter::DEFAULT_TABLE, Some("points-dl"), None, 10).unwrap();
        dl[0].status == "DEAD" && dl[0].attempts == 4
    }));
    // Fixed: the replay handles it once and removes the row.
    poison_ok.store(true, SeqCst);
    let ids = vec![d.id];
    assert_eq!(
        dead_letter::request_replay(
            &db.pool,
            dead_letter::DEFAULT_TABLE,
            "points-dl",
            &Selection::Ids(ids),
            false
        )
        .unwrap(),
        1
    );
    assert!(wait_until(LONG, || consumer.stats().replayed == 1));
    let stats = consumer.stop();
    assert_eq!(stats.dead_lettered, 1);
    assert!(dead_letter::list(&db.pool, dead_letter::DEFAULT_TABLE, None, None, 10)
        .unwrap()
        .is_empty());
    // The replayed order last, each once.
    let mut orders: Vec<String> = credits(&db).into_iter().map(|(o, _)| o).collect();
    assert_eq!(orders.pop().as_deref(), Some("ORD-3"));
    orders.sort();
    assert_eq!(orders, ["ORD-1", "ORD-2", "ORD-4"]);
}

#[test]
fn two_consumers_given_the_same_messages_at_once_credit_each_order_once() {
    let db = TestDb::new("cons_two");
    points_table(&db);
    let make = || {
        (0..4u32)
            .flat_map(|q| (0..50u64).map(move |o| order_message(q, o, &format!("k-{q}-{o}"), &format!("O{q}-{o}"), 1)))
            .collect::<Vec<_>>()
    };
    let (a, b) = (MemSource::with(make()), MemSource::with(make()));
    let ca = Consumer::start(config("points-2"), db.pool.clone(), a.clone(), Arc::new(credit)).unwrap();
    let cb = Consumer::start(config("points-2"), db.pool.clone(), b.clone(), Arc::new(credit)).unwrap();
    assert!(wait_until(LONG, || {
        let (x, y) = (ca.stats(), cb.stats());
        x.processed + x.duplicates == 200 && y.processed + y.duplicates == 200
    }));
    let (x, y) = (ca.stop(), cb.stop());
    assert_eq!(x.processed + y.processed, 200, "{x:?} {y:?}");
    assert_eq!(x.duplicates + y.duplicates, 200);
    assert_eq!(
        x.dead_lettered + y.dead_lettered + x.failed_attempts + y.failed_attempts,
        0
    );
    let c = credits(&db);
    assert_eq!(c.len(), 200);
    let distinct: std::collections::HashSet<&String> = c.iter().map(|(o, _)| o).collect();
    assert_eq!(distinct.len(), 200);
}

#[test]
fn a_stop_during_retries_leaves_the_message_uncommitted_for_the_next_owner() {
    let db = TestDb::new("cons_stop");
    points_table(&db);
    let src = MemSource::with(vec![order_message(0, 0, "a", "A", 1), order_message(0, 1, "b", "B", 1)]);
    let handler = |tx: &mut mysql::Transaction<'_>, m: &Message| -> Result<(), HandlerError> {
        credit(tx, m)?;
        if m.key == "b" {
            return Err("downstream unavailable".into());
        }
        Ok(())
    };
    let mut cfg = config("points-stop");
    cfg.max_attempts = 1000;
    let consumer = Consumer::start(cfg, db.pool.clone(), src.clone(), Arc::new(handler)).unwrap();
    assert!(wait_until(LONG, || consumer.stats().failed_attempts >= 3));
    let stats = consumer.stop();
    assert_eq!(stats.processed, 1);
    assert_eq!(src.committed()[&queue(0)], 1, "only the handled message's offset");
    assert_eq!(credits(&db).len(), 1);
}

#[test]
fn messages_without_an_event_key_fall_back_and_are_counted() {
    let mut p = BTreeMap::new();
    p.insert("eventId".to_string(), "42".to_string());
    let m = Message::new(queue(1), 7, Some("M1".into()), None, p, b"x".to_vec());
    assert_eq!((m.key.as_str(), m.key_source), ("orders#42", KeySource::EventId));
    let m = Message::new(queue(1), 7, Some("M1".into()), None, BTreeMap::new(), b"x".to_vec());
    assert_eq!((m.key.as_str(), m.key_source), ("msg:M1", KeySource::MessageId));
}

#[test]
fn bad_settings_are_refused_naming_the_field() {
    let db = TestDb::new("cons_cfg");
    let src = MemSource::with(Vec::new());
    let mut c = ConsumerConfig::new("points group");
    let e = Consumer::start(c.clone(), db.pool.clone(), src.clone(), Arc::new(credit)).unwrap_err();
    assert!(
        e.to_string().contains("consumer_group") && e.to_string().contains("points group"),
        "{e}"
    );
    c.group = "points".into();
    c.threads = 0;
    let e = Consumer::start(c.clone(), db.pool.clone(), src.clone(), Arc::new(credit)).unwrap_err();
    assert!(e.to_string().contains("consumer.threads"), "{e}");
    c.threads = 2;
    for bad in [0, 4097] {
        c.batch_max = bad;
        let e = Consumer::start(c.clone(), db.pool.clone(), src.clone(), Arc::new(credit)).unwrap_err();
        assert!(
            e.to_string().contains("consumer.batch.max") && e.to_string().contains(&bad.to_string()),
            "{e}"
        );
    }
    c.batch_max = 64;
    c.dead_letter_table = "dl; DROP TABLE x".into();
    let e = Consumer::start(c.clone(), db.pool.clone(), src.clone(), Arc::new(credit)).unwrap_err();
    assert!(e.to_string().contains("inbox.dead_letter.table"), "{e}");
    c.dead_letter_table = "no_such_table".into();
    let e = Consumer::start(c, db.pool.clone(), src, Arc::new(credit)).unwrap_err();
    assert!(e.to_string().contains("no_such_table"), "{e}");
}

#[test]
fn the_runtime_deletes_marks_past_their_retention_and_keeps_the_others() {
    let db = TestDb::new("cons_ret");
    points_table(&db);
    db.conn()
        .query_drop(
            "INSERT INTO outbox_inbox (consumer_group, event_key, processed_at) VALUES \
             ('points-ret', 'old-1', NOW(3) - INTERVAL 8 DAY), ('points-ret', 'old-2', NOW(3) - INTERVAL 30 DAY), \
             ('points-ret', 'recent', NOW(3) - INTERVAL 6 DAY)",
        )
        .unwrap();
    let src = MemSource::with(vec![order_message(0, 0, "new", "ORD-N", 1)]);
    let consumer = Consumer::start(config("points-ret"), db.pool.clone(), src, Arc::new(credit)).unwrap();
    let keys = || -> Vec<String> {
        db.conn()
            .query("SELECT CAST(event_key AS CHAR) FROM outbox_inbox ORDER BY event_key")
            .unwrap()
    };
    assert!(wait_until(LONG, || keys() == ["new", "recent"]), "{:?}", keys());
    consumer.stop();
    let mut short = config("points-ret");
    short.retention = Some(Duration::from_secs(60));
    let e = Consumer::start(short, db.pool.clone(), MemSource::with(Vec::new()), Arc::new(credit)).unwrap_err();
    assert!(e.to_string().contains("inbox.retention"), "{e}");
}

#[test]
fn a_handler_that_panics_is_retried_and_parked_while_its_queue_goes_on() {
    let db = TestDb::new("cons_panic");
    points_table(&db);
    let src = MemSource::with(vec![
        order_message(0, 0, "boom", "ORD-P", 1),
        order_message(0, 1, "fine", "ORD-F", 2),
    ]);
    let handler = |tx: &mut mysql::Transaction<'_>, m: &Message| -> Result<(), HandlerError> {
        if m.key == "boom" {
            panic!("bug in the handler for {}", m.key);
        }
        credit(tx, m)
    };
    let mut cfg = config("points-panic");
    cfg.max_attempts = 2;
    let consumer = Consumer::start(cfg, db.pool.clone(), src.clone(), Arc::new(handler)).unwrap();
    assert!(wait_until(LONG, || {
        let s = consumer.stats();
        s.dead_lettered == 1 && s.processed == 1
    }));
    let stats = consumer.stop();
    assert_eq!(stats.failed_attempts, 2);
    let dl = dead_letter::list(&db.pool, dead_letter::DEFAULT_TABLE, Some("points-panic"), None, 10).unwrap();
    assert!(
        dl[0]
            .last_error
            .contains("the handler panicked: bug in the handler for boom"),
        "{}",
        dl[0].last_error
    );
    assert_eq!(credits(&db), [("ORD-F".to_string(), 2)]);
}

/// Holds a handler thread on a first message (the gate) until `rest` has been handed to it, so
/// that the next batch takes what is waiting, deterministically. The source starts with the gate
/// alone; the gate's handler pushes `rest`, waits until the source has been drained and polled
/// empty once more (the poller polls again only after it queued every message it took), then
/// lets the gate's transaction commit.
struct Gate {
    src: Arc<MemSource>,
    rest: Mutex<Option<Vec<Message>>>,
}

impl Gate {
    const KEY: &'static str = "gate";

    fn new(rest: Vec<Message>) -> (Arc<MemSource>, Arc<Gate>) {
        let src = MemSource::with(vec![order_message(99, 0, Gate::KEY, "GATE", 0)]);
        let gate = Arc::new(Gate {
            src: src.clone(),
            rest: Mutex::new(Some(rest)),
        });
        (src, gate)
    }

    /// Called by the handler on every message: waits on the gate's own.
    fn pass(&self, m: &Message) {
        if m.key != Gate::KEY {
            return;
        }
        let Some(rest) = self.rest.lock().take() else { return };
        self.src.pending.lock().extend(rest);
        assert!(wait_until(LONG, || self.src.pending.lock().is_empty()));
        let polls = self.src.empty_polls.load(SeqCst);
        assert!(wait_until(LONG, || self.src.empty_polls.load(SeqCst) > polls));
    }
}

/// One handler thread, batches of up to `batch_max`.
fn batch_config(group: &str, batch_max: usize) -> ConsumerConfig {
    let mut c = config(group);
    c.threads = 1;
    c.batch_max = batch_max;
    c
}

#[test]
fn waiting_messages_commit_as_one_batch_each_key_handled_once_and_offsets_after_the_commit() {
    let db = TestDb::new("cons_batch");
    points_table(&db);
    // A key the group processed before this run.
    let mut conn = db.conn();
    let mut tx = conn.start_transaction(mysql::TxOpts::default()).unwrap();
    assert!(outbox::inbox::Inbox::default()
        .mark(&mut tx, "points-b", "old", &Default::default())
        .unwrap());
    tx.commit().unwrap();
    // 100 messages over 3 queues, in offset order per queue; "dup" twice, "old" once.
    let mut rest = Vec::new();
    let mut next = [0u64; 3];
    for i in 0..100u64 {
        let q = (i % 3) as u32;
        let key = match i {
            40 | 70 => "dup".to_string(),
            55 => "old".to_string(),
            _ => format!("k{i}"),
        };
        rest.push(order_message(q, next[q as usize], &key, &format!("ORD-{i}"), 1));
        next[q as usize] += 1;
    }
    let (src, gate) = Gate::new(rest.clone());
    let seen: Arc<Mutex<Vec<(u32, u64, u64)>>> = Arc::default();
    let (seen2, src2, gate2) = (seen.clone(), src.clone(), gate.clone());
    let handler = move |tx: &mut mysql::Transaction<'_>, m: &Message| -> Result<(), HandlerError> {
        gate2.pass(m);
        let committed = src2.committed().get(&m.queue).copied().unwrap_or(0);
        seen2.lock().push((m.queue.queue_id, m.offset, committed));
        credit(tx, m)
    };
    let consumer = Consumer::start(
        batch_config("points-b", 64),
        db.pool.clone(),
        src.clone(),
        Arc::new(handler),
    )
    .unwrap();
    assert!(wait_until(LONG, || {
        let s = consumer.stats();
        s.processed + s.duplicates == 101
    }));
    let stats = consumer.stop();
    assert_eq!((stats.processed, stats.duplicates), (99, 2), "{stats:?}");
    // The gate alone (a lone message is not held back to fill a batch), then 64, then 36.
    assert_eq!(stats.transactions, 3, "{stats:?}");
    assert_eq!(stats.batch_fallbacks, 0);
    // The handler ran once per new key, each batch in the order of its route values (its
    // queues, by default; each queue in offset order), each before its batch committed.
    let expected: Vec<(u32, u64)> = rest
        .chunks(64)
        .flat_map(|batch| {
            let mut batch = batch.to_vec();
            batch.sort_by_key(|m| m.queue.queue_id);
            batch
        })
        .filter(|m| m.key != "old" && !(m.key == "dup" && m.biz_no() == Some("ORD-70")))
        .map(|m| (m.queue.queue_id, m.offset))
        .collect();
    let seen = seen.lock().clone();
    assert_eq!(
        seen.iter().skip(1).map(|(q, o, _)| (*q, *o)).collect::<Vec<_>>(),
        expected
    );
    for (q, o, committed) in &seen {
        assert!(
            committed <= o,
            "queue {q}: offset {committed} committed before message {o} was handled"
        );
    }
    let c = credits(&db);
    assert_eq!(c.len(), 99);
    assert!(!c.iter().any(|(o, _)| o == "ORD-70" || o == "ORD-55"));
    let committed = src.committed();
    for q in 0..3u32 {
        assert_eq!(
            committed[&queue(q)],
            next[q as usize],
            "queue {q}: next offset after the last"
        );
    }
    assert_eq!(marks_of(&db, "points-b"), 100, "old, the gate and 98 new keys");
}

fn marks_of(db: &TestDb, group: &str) -> u64 {
    db.conn()
        .exec_first("SELECT COUNT(*) FROM outbox_inbox WHERE consumer_group = ?", (group,))
        .unwrap()
        .unwrap_or(0)
}

#[test]
fn a_failure_in_a_batch_is_retried_alone_and_charges_no_other_message() {
    let db = TestDb::new("cons_batch_fail");
    points_table(&db);
    let rest: Vec<Message> = (0..10u64)
        .map(|i| {
            let key = if i == 5 { "poison".to_string() } else { format!("k{i}") };
            order_message((i % 2) as u32, i / 2, &key, &format!("ORD-{i}"), 1)
        })
        .collect();
    let (src, gate) = Gate::new(rest);
    let g = gate.clone();
    let handler = move |tx: &mut mysql::Transaction<'_>, m: &Message| -> Result<(), HandlerError> {
        g.pass(m);
        // Writes first, then fails: the batch's rollback undoes the others' credits too.
        credit(tx, m)?;
        if m.key == "poison" {
            return Err("order ORD-5 unknown".into());
        }
        Ok(())
    };
    let mut cfg = batch_config("points-bf", 64);
    cfg.max_attempts = 3;
    let consumer = Consumer::start(cfg, db.pool.clone(), src.clone(), Arc::new(handler)).unwrap();
    assert!(wait_until(LONG, || {
        let s = consumer.stats();
        s.processed == 10 && s.dead_lettered == 1
    }));
    let stats = consumer.stop();
    assert_eq!(stats.batch_fallbacks, 1, "{stats:?}");
    assert_eq!(
        stats.failed_attempts, 3,
        "only the failing message was charged, and its attempts only"
    );
    assert_eq!(stats.transactions, 1 + 9, "the gate, then one transaction per message");
    let c = credits(&db);
    assert_eq!(c.len(), 10, "the gate and nine orders, each once");
    assert!(!c.iter().any(|(o, _)| o == "ORD-5"));
    let dl = dead_letter::list(&db.pool, dead_letter::DEFAULT_TABLE, Some("points-bf"), None, 10).unwrap();
    assert_eq!((dl.len(), dl[0].key.as_str(), dl[0].attempts), (1, "poison", 3));
    assert_eq!(
        src.committed()[&queue(1)],
        5,
        "the queue moved on past the parked message"
    );
}

#[test]
fn a_batch_handler_gets_each_batch_s_new_messages_and_one_at_a_time_after_a_failure() {
    let db = TestDb::new("cons_batch_h");
    points_table(&db);
    let rest: Vec<Message> = (0..20u64)
        .map(|i| {
            let key = match i {
                7 => "k3".to_string(),
                12 => "poison".to_string(),
                _ => format!("k{i}"),
            };
            order_message(0, i, &key, &format!("ORD-{i}"), 1)
        })
        .collect();
    let (src, gate) = Gate::new(rest.clone());
    let calls: Arc<Mutex<Vec<Vec<String>>>> = Arc::default();
    let fail_poison = Arc::new(AtomicBool::new(true));
    struct Multi {
        gate: Arc<Gate>,
        calls: Arc<Mutex<Vec<Vec<String>>>>,
        fail_poison: Arc<AtomicBool>,
    }
    impl outbox::consumer::BatchHandler for Multi {
        fn handle_batch(&self, tx: &mut mysql::Transaction<'_>, msgs: &[Message]) -> Result<(), HandlerError> {
            msgs.iter().for_each(|m| self.gate.pass(m));
            self.calls.lock().push(msgs.iter().map(|m| m.key.clone()).collect());
            // One multi-row INSERT for the whole batch.
            let values: Vec<String> = msgs.iter().map(|m| format!("('{}', 1)", m.biz_no().unwrap())).collect();
            tx.query_drop(format!(
                "INSERT INTO credits (order_no, amount) VALUES {}",
                values.join(", ")
            ))?;
            if self.fail_poison.load(SeqCst) && msgs.iter().any(|m| m.key == "poison") {
                return Err("a poison order in the batch".into());
            }
            Ok(())
        }
    }
    let handler = Arc::new(Multi {
        gate,
        calls: calls.clone(),
        fail_poison,
    });
    let mut cfg = batch_config("points-bh", 64);
    cfg.max_attempts = 2;
    let consumer = Consumer::start_batch(cfg, db.pool.clone(), src.clone(), handler).unwrap();
    assert!(wait_until(LONG, || {
        let s = consumer.stats();
        s.processed + s.duplicates + s.dead_lettered == 21
    }));
    let stats = consumer.stop();
    assert_eq!(
        (stats.processed, stats.duplicates, stats.dead_lettered),
        (19, 1, 1),
        "{stats:?}"
    );
    let calls = calls.lock().clone();
    let new_keys: Vec<String> = rest.iter().filter(|m| m.offset != 7).map(|m| m.key.clone()).collect();
    assert_eq!(calls[0], ["gate"]);
    assert_eq!(
        calls[1], new_keys,
        "the batch's new messages, in order, the duplicate left out"
    );
    // Then one message per call; the poison one twice (its two attempts).
    let singles: Vec<&[String]> = calls[2..].iter().map(|c| c.as_slice()).collect();
    assert!(singles.iter().all(|c| c.len() == 1), "{calls:?}");
    assert_eq!(singles.iter().filter(|c| c[0] == "poison").count(), 2);
    assert_eq!(credits(&db).len(), 19, "the gate and 18 orders");
}

#[test]
fn with_batches_off_each_message_is_its_own_transaction() {
    let db = TestDb::new("cons_batch_off");
    points_table(&db);
    let msgs: Vec<Message> = (0..30u64)
        .map(|o| order_message(0, o, &format!("k{o}"), &format!("O{o}"), 1))
        .collect();
    let src = MemSource::with(msgs);
    let consumer = Consumer::start(batch_config("points-off", 1), db.pool.clone(), src, Arc::new(credit)).unwrap();
    assert!(wait_until(LONG, || consumer.stats().processed == 30));
    let stats = consumer.stop();
    assert_eq!(stats.transactions, 30);
    assert_eq!(stats.batch_fallbacks, 0);
}

/// Regression: a later copy of a parked key (a resend, a redelivery) was parked again after all
/// its attempts, one dead letter per copy (one order seen parked three times in three seconds).
#[test]
fn a_copy_of_a_parked_key_joins_its_dead_letter_after_one_attempt() {
    let db = TestDb::new("cons_parked_copy");
    points_table(&db);
    let src = MemSource::with(vec![order_message(0, 0, "poison", "ORD-P", 1)]);
    let handler = |tx: &mut mysql::Transaction<'_>, m: &Message| -> Result<(), HandlerError> {
        credit(tx, m)?;
        if m.key == "poison" {
            return Err("order ORD-P unknown".into());
        }
        Ok(())
    };
    let mut cfg = config("points-copies");
    cfg.max_attempts = 3;
    cfg.batch_max = 1;
    let consumer = Consumer::start(cfg, db.pool.clone(), src.clone(), Arc::new(handler)).unwrap();
    assert!(wait_until(LONG, || consumer.stats().dead_lettered == 1));
    // Two later copies of the same event, and another event after them.
    src.pending.lock().extend([
        order_message(0, 1, "poison", "ORD-P", 1),
        order_message(1, 0, "poison", "ORD-P", 1),
        order_message(0, 2, "fine", "ORD-F", 2),
    ]);
    assert!(wait_until(LONG, || {
        let s = consumer.stats();
        s.parked_copies == 2 && s.processed == 1
    }));
    let stats = consumer.stop();
    assert_eq!(stats.dead_lettered, 1, "{stats:?}");
    assert_eq!(stats.failed_attempts, 3 + 1 + 1, "each copy used one attempt");
    let dl = dead_letter::list(&db.pool, dead_letter::DEFAULT_TABLE, Some("points-copies"), None, 10).unwrap();
    assert_eq!(dl.len(), 1, "one dead letter for the key: {dl:?}");
    assert_eq!(dl[0].attempts, 5, "the copies' attempts added to it");
    assert!(dl[0].last_error.contains("a later copy"), "{}", dl[0].last_error);
    assert_eq!(src.committed()[&queue(0)], 3, "the queue moved on past the copies");
    assert_eq!(credits(&db), [("ORD-F".to_string(), 2)]);
}

/// The points service's tables with a shared row per user: a credit per order and a balance.
fn balances_table(db: &TestDb, users: u32) {
    let mut c = db.conn();
    c.query_drop("CREATE TABLE balances (user_id VARCHAR(16) PRIMARY KEY, points BIGINT NOT NULL)")
        .unwrap();
    for u in 0..users {
        c.exec_drop("INSERT INTO balances VALUES (?, 0)", (format!("u{u}"),))
            .unwrap();
    }
}

/// An order event of user `u{user}` (the `userId` header the order service sets).
fn user_message(q: u32, offset: u64, user: u32) -> Message {
    let mut m = order_message(q, offset, &format!("k{q}-{offset}"), &format!("ORD-{q}-{offset}"), 1);
    m.properties.insert("userId".into(), format!("u{user}"));
    m
}

/// Credits the order and adds its amount to the user's balance: the row every order of the
/// user updates.
fn credit_and_add(tx: &mut mysql::Transaction<'_>, msg: &Message) -> Result<(), HandlerError> {
    credit(tx, msg)?;
    tx.exec_drop(
        "UPDATE balances SET points = points + 1 WHERE user_id = ?",
        (msg.property("userId").unwrap(),),
    )?;
    Ok(())
}

fn balances(db: &TestDb) -> Vec<(String, i64)> {
    db.conn()
        .query("SELECT user_id, points FROM balances ORDER BY user_id")
        .unwrap()
}

#[test]
fn handler_threads_routed_by_user_never_wait_on_each_other_s_balances() {
    let db = TestDb::new("cons_route");
    points_table(&db);
    balances_table(&db, 20);
    // 2 400 orders of 20 users over 8 queues: every queue holds every user.
    let msgs: Vec<Message> = (0..2400u64)
        .map(|i| user_message((i % 8) as u32, i / 8, (i % 20) as u32))
        .collect();
    let src = MemSource::with(msgs);
    let mut cfg = config("points-route");
    cfg.threads = 4;
    cfg.route = outbox::config::Route::Property("userId".into());
    let consumer = Consumer::start(cfg, db.pool.clone(), src.clone(), Arc::new(credit_and_add)).unwrap();
    assert!(wait_until(LONG, || consumer.stats().processed == 2400));
    let stats = consumer.stop();
    // One user's orders in one thread: no batch met another's locks, none went one at a time.
    assert_eq!(
        (stats.batch_retries, stats.batch_fallbacks, stats.db_errors),
        (0, 0, 0),
        "{stats:?}"
    );
    assert!(stats.transactions < 2400, "batches: {stats:?}");
    let expected: Vec<(String, i64)> = {
        let mut v: Vec<(String, i64)> = (0..20).map(|u| (format!("u{u}"), 120)).collect();
        v.sort();
        v
    };
    assert_eq!(balances(&db), expected);
    assert_eq!(credits(&db).len(), 2400);
    for q in 0..8 {
        assert_eq!(
            src.committed()[&queue(q)],
            300,
            "queue {q} committed past its last message"
        );
    }
}

#[test]
fn a_batch_that_meets_a_lock_wait_timeout_runs_again_as_a_batch() {
    let db = TestDb::new("cons_conflict");
    points_table(&db);
    balances_table(&db, 4);
    // The service itself holds user u0's balance row (an open transaction elsewhere).
    let mut blocker = db.conn();
    blocker.query_drop("START TRANSACTION").unwrap();
    blocker
        .query_drop("SELECT points FROM balances WHERE user_id = 'u0' FOR UPDATE")
        .unwrap();
    let msgs: Vec<Message> = (0..40u64).map(|i| user_message(0, i, (i % 4) as u32)).collect();
    let (src, gate) = Gate::new(msgs);
    let gate2 = gate.clone();
    let handler = move |tx: &mut mysql::Transaction<'_>, m: &Message| -> Result<(), HandlerError> {
        gate2.pass(m);
        if m.key == Gate::KEY {
            return credit(tx, m);
        }
        // A short lock wait for the test (the server's default is 50 s).
        tx.query_drop("SET SESSION innodb_lock_wait_timeout = 1")?;
        credit_and_add(tx, m)
    };
    let mut cfg = batch_config("points-conflict", 64);
    cfg.threads = 1;
    let consumer = Consumer::start(cfg, db.pool.clone(), src.clone(), Arc::new(handler)).unwrap();
    // The batch times out on u0's row, is rolled back and runs again as a batch; once the
    // blocker is gone it commits whole.
    assert!(wait_until(LONG, || consumer.stats().batch_retries >= 1));
    blocker.query_drop("COMMIT").unwrap();
    assert!(wait_until(LONG, || consumer.stats().processed == 41));
    let stats = consumer.stop();
    assert_eq!(stats.batch_fallbacks, 0, "{stats:?}");
    assert_eq!(stats.failed_attempts, 0, "a lock conflict uses no attempt: {stats:?}");
    // The gate alone, then the 40 in one transaction.
    assert_eq!(stats.transactions, 2, "{stats:?}");
    assert_eq!(balances(&db).iter().map(|(_, p)| p).sum::<i64>(), 40);
}

#[test]
fn the_final_stats_report_the_lag_as_it_is_at_stop() {
    let db = TestDb::new("cons_lag");
    points_table(&db);
    let src = MemSource::with(
        (0..10)
            .map(|o| order_message(0, o, &format!("k{o}"), "ORD-L", 1))
            .collect(),
    );
    *src.lag.lock() = Some(500);
    let consumer = Consumer::start(config("points-lag"), db.pool.clone(), src.clone(), Arc::new(credit)).unwrap();
    // The first check reads the lag at once; the next would be 5 s later.
    assert!(wait_until(LONG, || consumer.stats().lag == Some(500)));
    assert!(wait_until(LONG, || consumer.stats().processed == 10));
    *src.lag.lock() = Some(0);
    let stats = consumer.stop();
    assert_eq!(stats.lag, Some(0), "read at stop, not 5 s before: {stats:?}");
}
