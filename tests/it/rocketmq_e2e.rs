//! End to end through a real RocketMQ name server and broker on 127.0.0.1 (scripts/rocketmq),
//! with a real MariaDB: events are committed, relayed by `outbox::Relay` with the RocketMQ
//! publisher, and read back from the topic by a consumer.
//!
//! The broker is started once (or reused if running). Tests that stop or kill it hold the
//! broker lock exclusively; the others share it. Each test uses its own database and topic.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mysql::prelude::Queryable;
use parking_lot::{Mutex, RwLock};

use outbox::rocketmq::testing::{read_topic, ReadBack};
use outbox::rocketmq::RocketMqPublisher;
use outbox::{BackoffPolicy, Config, DeadLetter, NewEvent, OutboundEvent, Publisher, Relay, SendOutcome};

use crate::support::{wait_until, TestDb};

const NAMESRV: &str = "127.0.0.1:9876";

/// Shared by tests that only use the broker, taken exclusively by those that kill or pause it.
pub(crate) static BROKER_LOCK: RwLock<()> = RwLock::new(());

/// Runs `scripts/rocketmq` with `args`; its output, or why it failed.
pub(crate) fn script(args: &[&str]) -> Result<String, String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/rocketmq");
    let out = Command::new(path)
        .args(args)
        .output()
        .map_err(|e| format!("{path}: {e}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(format!(
            "scripts/rocketmq {} failed ({}):\n{text}",
            args.join(" "),
            out.status
        ))
    }
}

/// Starts the name server and broker if they are not running (installs them first if missing:
/// the first run builds them, which takes long) and waits until the broker is registered.
///
/// Other programs may share this broker (the demo, the fault runner, the C and Go suites) and
/// kill or restart it themselves, so a start that loses such a race is tried again.
pub(crate) fn ensure_broker() {
    let mut errors = Vec::new();
    for _ in 0..3 {
        match script(&["start"]) {
            Ok(_) => return,
            Err(e) => {
                eprintln!("{e}");
                errors.push(e);
            }
        }
    }
    panic!("the broker did not start: {errors:#?}");
}

/// Restores the broker when a disruptive test ends, even by a panic.
struct BrokerRestorer;

impl Drop for BrokerRestorer {
    fn drop(&mut self) {
        let _ = script(&["resume-broker"]);
        if let Err(e) = script(&["start"]) {
            eprintln!("could not restore the broker: {e}");
        }
    }
}

pub(crate) fn unique(prefix: &str) -> String {
    format!("{prefix}_{:08x}", rand::random::<u32>())
}

/// The test database's config, relaying to `topic` through the local broker.
fn mq_config(db: &TestDb, topic: &str) -> Config {
    let mut c = db.config();
    c.topic = topic.to_string();
    c.rocketmq.namesrv = NAMESRV.into();
    c.rocketmq.producer_group = unique("outbox_e2e");
    c
}

type Hook = Arc<dyn Fn(&DeadLetter) + Send + Sync>;

fn start_relay(config: &Config, hook: Option<Hook>) -> Relay {
    let publisher = RocketMqPublisher::start(config).expect("publisher starts");
    let mut b = Relay::builder(config.clone()).publisher(Arc::new(publisher));
    if let Some(h) = hook {
        b = b.dead_letter_hook(move |d| h(d));
    }
    b.start().expect("relay starts")
}

/// What was committed for one event, to compare with what arrived.
#[derive(Debug, Clone)]
struct Expected {
    biz_no: String,
    event_type: String,
    payload: Vec<u8>,
    tag: Option<String>,
    headers: BTreeMap<String, String>,
}

impl Expected {
    fn of(e: &NewEvent) -> Expected {
        Expected {
            biz_no: e.biz_no.clone(),
            event_type: e.event_type.clone(),
            payload: e.payload.clone(),
            tag: e.tag.clone(),
            headers: e.headers.clone(),
        }
    }
}

/// Checks that every expected event arrived exactly as committed and nothing else did; returns
/// the number of duplicates.
fn verify(read: &ReadBack, expected: &HashMap<u64, Expected>, forbidden: &HashSet<u64>) -> usize {
    let mut by_id: HashMap<u64, Vec<&outbox::rocketmq::testing::Consumed>> = HashMap::new();
    for m in &read.messages {
        let id = m
            .event_id()
            .unwrap_or_else(|| panic!("a message without an eventId: {m:?}"));
        assert!(
            !forbidden.contains(&id),
            "event {id} of a rolled-back transaction arrived"
        );
        assert!(expected.contains_key(&id), "event {id} arrived but was never committed");
        by_id.entry(id).or_default().push(m);
    }
    let missing: Vec<u64> = expected.keys().filter(|id| !by_id.contains_key(id)).copied().collect();
    assert!(
        missing.is_empty(),
        "{} committed events never arrived (first: {:?})",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    for (id, copies) in &by_id {
        let want = &expected[id];
        for m in copies {
            assert_eq!(m.body, want.payload, "body of event {id}");
            assert_eq!(m.keys.as_deref(), Some(id.to_string().as_str()), "key of event {id}");
            let tag = want.tag.clone().unwrap_or_else(|| want.event_type.clone());
            assert_eq!(m.tags.as_deref(), Some(tag.as_str()), "tag of event {id}");
            let p = |k: &str| m.properties.get(k).map(String::as_str);
            assert_eq!(p("eventId"), Some(id.to_string().as_str()), "eventId of event {id}");
            assert_eq!(
                p("eventType"),
                Some(want.event_type.as_str()),
                "eventType of event {id}"
            );
            assert_eq!(p("bizNo"), Some(want.biz_no.as_str()), "bizNo of event {id}");
            for (k, v) in &want.headers {
                assert_eq!(p(k), Some(v.as_str()), "header {k} of event {id}");
            }
        }
    }
    read.messages.len() - by_id.len()
}

fn count_where(db: &TestDb, cond: &str) -> u64 {
    db.conn()
        .query_first(format!("SELECT COUNT(*) FROM t_event_record WHERE {cond}"))
        .unwrap()
        .unwrap_or(0)
}

/// Waits until no row is WAIT or SENDING (or `limit` passes), printing progress now and then.
pub(crate) fn wait_drained(db: &TestDb, limit: Duration, label: &str) -> bool {
    let mut last_print = Instant::now();
    wait_until(limit, || {
        std::thread::sleep(Duration::from_millis(100));
        let open = count_where(db, "status IN ('WAIT', 'SENDING')");
        if last_print.elapsed() > Duration::from_secs(5) {
            eprintln!("[{label}] {open} events not yet sent; SUCCESS {}", db.count("SUCCESS"));
            last_print = Instant::now();
        }
        open == 0
    })
}

/// A payload of `len` bytes; every fifth one carries bytes that are not UTF-8.
fn payload(n: usize, len: usize) -> Vec<u8> {
    let mut p = format!("{{\"order\":{n},\"fill\":\"").into_bytes();
    while p.len() < len.saturating_sub(2) {
        p.push(b'a' + (p.len() % 26) as u8);
    }
    p.extend_from_slice(b"\"}");
    if n.is_multiple_of(5) {
        p.extend_from_slice(&[0xff, 0x00, 0xfe, 0x01]);
    }
    p
}

#[test]
fn ten_thousand_events_from_concurrent_writers_arrive_once_each_through_three_relays() {
    let _shared = BROKER_LOCK.read();
    ensure_broker();
    let db = TestDb::new("mq_bulk");
    let topic = unique("outbox_e2e_bulk");
    let mut cfg = mq_config(&db, &topic);
    cfg.workers = 4;
    db.conn()
        .query_drop("CREATE TABLE t_order (biz_no VARCHAR(64) PRIMARY KEY, amount BIGINT NOT NULL)")
        .unwrap();
    let relays: Vec<Relay> = (0..3).map(|_| start_relay(&cfg, None)).collect();

    const TOTAL: usize = 10_000;
    let remaining = AtomicUsize::new(TOTAL);
    let committed: Mutex<HashMap<u64, Expected>> = Mutex::new(HashMap::new());
    let rolled_back: Mutex<HashSet<u64>> = Mutex::new(HashSet::new());
    let started = Instant::now();
    std::thread::scope(|s| {
        for w in 0..4usize {
            let (db, cfg, relays) = (&db, &cfg, &relays);
            let (remaining, committed, rolled_back) = (&remaining, &committed, &rolled_back);
            s.spawn(move || {
                let mut conn = db.conn();
                let mut n = 0usize;
                loop {
                    let want = 1 + rand::random::<u32>() as usize % 8;
                    let Ok(k) = remaining.fetch_update(SeqCst, SeqCst, |r| (r > 0).then(|| r - want.min(r))) else {
                        break;
                    };
                    let k = want.min(k);
                    let rollback = rand::random::<u32>().is_multiple_of(8);
                    let mut tx = conn.start_transaction(mysql::TxOpts::default()).unwrap();
                    let mut written = Vec::new();
                    for _ in 0..k {
                        n += 1;
                        let types = ["ORDER_CREATED", "ORDER_PAID", "ORDER_SHIPPED"];
                        let mut e = NewEvent::new(
                            format!("ORD-{w}-{n}"),
                            types[n % 3],
                            payload(n, 40 + rand::random::<u32>() as usize % 400),
                        );
                        if n % 5 == 1 {
                            e = e.with_tag("VIP");
                        }
                        if n % 3 == 2 {
                            e = e
                                .with_header("traceId", format!("trace-{w}-{n}"))
                                .with_header("source", "e2e");
                        }
                        // The business write and its event, in one transaction.
                        tx.exec_drop(
                            "INSERT INTO t_order (biz_no, amount) VALUES (?, ?)",
                            (&e.biz_no, n as u64),
                        )
                        .unwrap();
                        let id = outbox::enqueue_in_tx_with(&mut tx, cfg, &e).unwrap();
                        written.push((id, Expected::of(&e)));
                    }
                    if rollback {
                        tx.rollback().unwrap();
                        remaining.fetch_add(k, SeqCst);
                        rolled_back.lock().extend(written.iter().map(|(id, _)| *id));
                    } else {
                        tx.commit().unwrap();
                        relays[n % 3].notify();
                        committed.lock().extend(written);
                    }
                }
            });
        }
    });
    let committed = committed.into_inner();
    let rolled_back = rolled_back.into_inner();
    assert_eq!(committed.len(), TOTAL);
    let orders: u64 = db.conn().query_first("SELECT COUNT(*) FROM t_order").unwrap().unwrap();
    assert_eq!(
        orders, TOTAL as u64,
        "one order per committed event, none of the rolled-back ones"
    );
    let commit_secs = started.elapsed().as_secs_f64();
    assert!(
        wait_drained(&db, Duration::from_secs(600), "bulk"),
        "events left unsent"
    );
    let relay_secs = started.elapsed().as_secs_f64();
    assert_eq!(db.count("SUCCESS"), TOTAL as u64);
    assert_eq!(db.count("FAIL"), 0);
    assert_eq!(
        count_where(&db, "status = 'SUCCESS' AND broker_msg_id IS NULL"),
        0,
        "acked rows keep the broker's message id"
    );
    let stats: Vec<_> = relays.iter().map(|r| r.counters()).collect();
    for r in &relays {
        r.stop(Duration::from_secs(10));
    }

    let read = read_topic(NAMESRV, &topic, TOTAL, Duration::from_secs(300)).expect("consumer reads the topic");
    assert!(
        !read.timed_out,
        "only {} of {TOTAL} events were read back",
        read.distinct
    );
    let duplicates = verify(&read, &committed, &rolled_back);
    let retried: u64 = stats.iter().map(|s| s.retried + s.stale_acks + s.reclaimed).sum();
    let per_relay: Vec<u64> = stats.iter().map(|s| s.sent).collect();
    let calls: u64 = stats.iter().map(|s| s.publish_calls).sum();
    eprintln!(
        "bulk: committed={TOTAL} rolled_back={} delivered={} duplicates={duplicates} lost=0 | commits took {commit_secs:.1}s, \
         all sent after {relay_secs:.1}s ({:.0} events/s end to end) | sent per relay {per_relay:?}, {calls} publish calls \
         ({:.1} events per call) | retries/reclaims {retried}",
        rolled_back.len(),
        read.distinct,
        TOTAL as f64 / relay_secs,
        TOTAL as f64 / calls.max(1) as f64
    );
    assert!(!rolled_back.is_empty(), "the writers rolled some transactions back");
    assert!(
        per_relay.iter().filter(|&&n| n > 0).count() >= 2,
        "the relays shared the work: {per_relay:?}"
    );
    // Without faults there is no duplicate: every duplicate needs a retried or reclaimed send.
    assert!(
        duplicates as u64 <= retried,
        "{duplicates} duplicates but only {retried} retries/reclaims"
    );
}

#[test]
fn a_killed_and_restarted_broker_loses_nothing_and_opens_then_closes_the_breaker() {
    let _exclusive = BROKER_LOCK.write();
    ensure_broker();
    let _restore = BrokerRestorer;
    let db = TestDb::new("mq_kill");
    let topic = unique("outbox_e2e_kill");
    let mut cfg = mq_config(&db, &topic);
    cfg.breaker_failure_threshold = 3;
    cfg.breaker_open = Duration::from_secs(2);
    cfg.send_timeout = Duration::from_secs(2);
    cfg.backoff.policy = BackoffPolicy::Fixed;
    cfg.backoff.base = Duration::from_millis(500);
    cfg.max_retry = 3;
    let relays: Vec<Relay> = (0..2).map(|_| start_relay(&cfg, None)).collect();

    // A writer keeps committing while the broker dies and comes back.
    const TOTAL: usize = 3000;
    let expected: Mutex<HashMap<u64, Expected>> = Mutex::new(HashMap::new());
    let written = AtomicUsize::new(0);
    let outage = Mutex::new((Duration::ZERO, Duration::ZERO));
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut conn = db.conn();
            for chunk in 0..TOTAL / 10 {
                let mut tx = conn.start_transaction(mysql::TxOpts::default()).unwrap();
                let mut batch = Vec::new();
                for i in 0..10 {
                    let n = chunk * 10 + i;
                    let e = NewEvent::new(format!("K-{n}"), "ORDER_CREATED", payload(n, 120));
                    batch.push((outbox::enqueue_in_tx_with(&mut tx, &cfg, &e).unwrap(), Expected::of(&e)));
                }
                tx.commit().unwrap();
                relays[chunk % 2].notify();
                expected.lock().extend(batch);
                written.fetch_add(10, SeqCst);
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        // Kill the broker once a third is through, keep it down until the breaker opened.
        assert!(wait_until(Duration::from_secs(120), || db.count("SUCCESS") >= (TOTAL / 3) as u64));
        // What a send without a route is judged by: routes exist while the broker lives...
        let routes = RocketMqPublisher::start(&cfg).unwrap();
        assert!(routes.has_routes(Duration::from_secs(3)), "no route with the broker up");
        let t0 = Instant::now();
        script(&["kill-broker"]).unwrap();
        // ...and none once it is gone, so a missing route uses no attempt.
        assert!(
            wait_until(Duration::from_secs(60), || !routes.has_routes(Duration::from_secs(3))),
            "the name server still has routes with the broker killed"
        );
        eprintln!(
            "kill: broker killed with {} of {TOTAL} events sent",
            db.count("SUCCESS")
        );
        assert!(
            wait_until(Duration::from_secs(60), || relays
                .iter()
                .all(|r| r.counters().breaker_opened >= 1)),
            "the relays did not open their breakers while the broker was down"
        );
        let down_for = t0.elapsed();
        ensure_broker();
        let restarted = t0.elapsed();
        *outage.lock() = (down_for, restarted);
        eprintln!("kill: both breakers open {down_for:?} after the kill; broker back after {restarted:?}");
    });
    let (_, restarted) = *outage.lock();
    let t_restart = Instant::now();
    // The client keeps a dead endpoint blocked for ~30 s, so recovery takes that long.
    assert!(
        wait_drained(&db, Duration::from_secs(240), "kill"),
        "events left unsent after the restart"
    );
    eprintln!("kill: all sent {:?} after the broker came back", t_restart.elapsed());
    assert_eq!(
        db.count("FAIL"),
        0,
        "no event may be dead-lettered because of the outage"
    );
    assert_eq!(db.count("SUCCESS"), TOTAL as u64);
    // A relay that found nothing left to send has not probed yet, and each producer has its own
    // client-side endpoint breaker (~30 s): keep giving the relays whose breaker is not closed
    // something to send until every one has seen the broker back.
    let mut expected = expected.into_inner();
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        let not_closed: Vec<&Relay> = relays
            .iter()
            .filter(|r| r.counters().breaker_state != outbox::BreakerState::Closed)
            .collect();
        if not_closed.is_empty() {
            break;
        }
        assert!(
            Instant::now() < until,
            "breakers still not closed: {:?}",
            relays.iter().map(|r| r.counters()).collect::<Vec<_>>()
        );
        for r in not_closed {
            let e = NewEvent::new(format!("AFTER-{}", r.instance_id()), "ORDER_CREATED", payload(1, 50));
            expected.insert(r.enqueue(&e).unwrap(), Expected::of(&e));
            wait_until(Duration::from_secs(2), || {
                r.counters().breaker_state == outbox::BreakerState::Closed
            });
        }
    }
    assert!(wait_drained(&db, Duration::from_secs(60), "kill-after"));
    let total = expected.len();
    let stats: Vec<_> = relays.iter().map(|r| r.counters()).collect();
    for r in &relays {
        r.stop(Duration::from_secs(10));
    }
    let opened: u64 = stats.iter().map(|s| s.breaker_opened).sum();
    let closed: u64 = stats.iter().map(|s| s.breaker_closed).sum();
    let released: u64 = stats.iter().map(|s| s.released_unsent).sum();
    let retried: u64 = stats.iter().map(|s| s.retried).sum();
    assert!(
        opened >= 1 && closed >= 1,
        "breaker opened {opened} and closed {closed} times"
    );
    let max_attempts: u32 = db
        .conn()
        .query_first("SELECT MAX(retry_count) FROM t_event_record")
        .unwrap()
        .unwrap_or(0);

    assert_eq!(expected.len(), total);
    let read = read_topic(NAMESRV, &topic, total, Duration::from_secs(300)).expect("consumer reads the topic");
    assert!(
        !read.timed_out,
        "only {} of {total} events were read back after the restart",
        read.distinct
    );
    let duplicates = verify(&read, &expected, &HashSet::new());
    eprintln!(
        "kill: committed={total} delivered={} duplicates={duplicates} lost=0 | down {:?} | breaker opened {opened} closed {closed} | \
         released unsent {released}, retried {retried}, highest retry_count {max_attempts}",
        read.distinct, restarted
    );
}

#[test]
fn a_message_the_broker_refuses_ends_fail_after_max_retry_and_calls_the_hook_once() {
    let _shared = BROKER_LOCK.read();
    ensure_broker();
    let db = TestDb::new("mq_reject");
    let topic = unique("outbox_e2e_reject");
    let mut cfg = mq_config(&db, &topic);
    // Enqueue and the client accept 5 MiB; the broker's limit (maxMessageSize, 4 MiB) refuses it.
    cfg.payload_max_bytes = 8 * 1024 * 1024;
    cfg.max_retry = 2;
    cfg.backoff.policy = BackoffPolicy::Fixed;
    cfg.backoff.base = Duration::from_millis(200);
    cfg.workers = 1;
    let letters: Arc<Mutex<Vec<DeadLetter>>> = Arc::new(Mutex::new(Vec::new()));
    let hook = {
        let letters = letters.clone();
        Arc::new(move |d: &DeadLetter| letters.lock().push(d.clone())) as Hook
    };
    // Batches as large as the whole call, so the big message goes in one batch with the others
    // and the broker refuses that batch: the publisher must resend them one by one.
    let publisher = RocketMqPublisher::start(&cfg)
        .unwrap()
        .with_batch_max_bytes(64 * 1024 * 1024);
    let relay = Relay::builder(cfg.clone())
        .publisher(Arc::new(publisher))
        .dead_letter_hook(move |d| hook(d))
        .start()
        .unwrap();

    let mut expected = HashMap::new();
    let mut conn = db.conn();
    let mut tx = conn.start_transaction(mysql::TxOpts::default()).unwrap();
    let mut big_id = 0;
    for i in 0..11 {
        let e = if i == 5 {
            // Random bytes: the client compresses large bodies, and a compressible one would fit.
            let mut big = vec![0u8; 5 * 1024 * 1024];
            rand::RngCore::fill_bytes(&mut rand::rng(), &mut big);
            NewEvent::new("BIG-1", "ORDER_CREATED", big)
        } else {
            NewEvent::new(format!("SMALL-{i}"), "ORDER_CREATED", payload(i, 64))
        };
        let id = relay.enqueue_in_tx(&mut tx, &e).unwrap();
        if i == 5 {
            big_id = id;
        } else {
            expected.insert(id, Expected::of(&e));
        }
    }
    relay.commit(tx).unwrap();

    assert!(wait_drained(&db, Duration::from_secs(60), "reject"), "rows left unsent");
    let statuses: Vec<(u64, String, u32, Option<String>)> = db
        .conn()
        .query("SELECT id, status, retry_count, last_error FROM t_event_record ORDER BY id")
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || !letters.lock().is_empty()),
        "no dead letter; rows: {statuses:?}"
    );
    let stats = relay.counters();
    relay.stop(Duration::from_secs(10));
    assert_eq!(
        db.count("SUCCESS"),
        10,
        "the small events of the refused batch were sent alone"
    );
    let (status, retry_count, last_error): (String, u32, Option<String>) = db
        .conn()
        .exec_first(
            "SELECT status, retry_count, last_error FROM t_event_record WHERE id = ?",
            (big_id,),
        )
        .unwrap()
        .unwrap();
    eprintln!("reject: big event {big_id}: {status} after {retry_count} attempts: {last_error:?}; {stats:?}");
    assert_eq!(status, "FAIL");
    assert_eq!(
        retry_count,
        cfg.max_retry + 1,
        "one first attempt plus max.retry retries"
    );
    let last_error = last_error.unwrap_or_default();
    assert!(last_error.starts_with("Rejected"), "{last_error}");
    let letters = letters.lock().clone();
    assert_eq!(letters.len(), 1, "the hook is called once: {letters:?}");
    assert_eq!(letters[0].id, big_id);
    assert_eq!(letters[0].retry_count, cfg.max_retry + 1);

    let read = read_topic(NAMESRV, &topic, 10, Duration::from_secs(120)).unwrap();
    assert!(!read.timed_out, "only {} of 10 read back", read.distinct);
    let forbidden = HashSet::from([big_id]);
    let duplicates = verify(&read, &expected, &forbidden);
    assert_eq!(duplicates, 0);
}

#[test]
fn a_send_that_times_out_is_retried_with_backoff_and_delivered_once_the_broker_answers() {
    let _exclusive = BROKER_LOCK.write();
    ensure_broker();
    let _restore = BrokerRestorer;
    let db = TestDb::new("mq_timeout");
    let topic = unique("outbox_e2e_timeout");
    let mut cfg = mq_config(&db, &topic);
    cfg.send_timeout = Duration::from_secs(1);
    cfg.lease = Duration::from_secs(30);
    cfg.rocketmq.retries = 0;
    cfg.backoff.policy = BackoffPolicy::Quadratic;
    cfg.backoff.base = Duration::from_secs(1);
    cfg.backoff.max = Duration::from_secs(10);
    cfg.max_retry = 20;
    cfg.breaker_failure_threshold = 1000;
    cfg.workers = 2;
    let relay = start_relay(&cfg, None);

    // Warm up: the route is known and the connection open, so what follows is a pure timeout.
    let warm = relay
        .enqueue(&NewEvent::new("WARM", "ORDER_CREATED", b"{}".to_vec()))
        .unwrap();
    assert!(wait_drained(&db, Duration::from_secs(60), "timeout-warmup"));
    let mut expected = HashMap::from([(
        warm,
        Expected::of(&NewEvent::new("WARM", "ORDER_CREATED", b"{}".to_vec())),
    )]);

    script(&["pause-broker"]).unwrap();
    let paused = Instant::now();
    for i in 0..10 {
        let e = NewEvent::new(format!("T-{i}"), "ORDER_PAID", payload(i, 80));
        expected.insert(relay.enqueue(&e).unwrap(), Expected::of(&e));
    }
    // Two timed-out attempts per event at least: 1 s timeout, then 1 s and 4 s of backoff.
    let retried_twice = wait_until(Duration::from_secs(40), || count_where(&db, "retry_count >= 2") >= 1);
    let rows: Vec<(u64, u32, i64, Option<String>)> = db
        .conn()
        .query(
            "SELECT id, retry_count, TIMESTAMPDIFF(MICROSECOND, update_time, next_retry_time) DIV 1000, last_error \
             FROM t_event_record WHERE status = 'WAIT' AND retry_count >= 1 ORDER BY id",
        )
        .unwrap();
    script(&["resume-broker"]).unwrap();
    eprintln!(
        "timeout: paused {:?}; waiting rows (id, attempts, backoff ms, error): {rows:?}",
        paused.elapsed()
    );
    assert!(retried_twice, "no event was retried twice while the broker was paused");
    // Rows whose last attempt timed out wait out the backoff of their attempt count. (After a few
    // timeouts the client may also fail sends fast, as if the broker were unreachable: those rows
    // are returned without an attempt and are due at once.)
    let mut timed_out = 0;
    for (id, attempts, backoff_ms, err) in &rows {
        let err = err.as_deref().unwrap_or_default();
        if err.starts_with("Timeout") {
            timed_out += 1;
            let want = cfg.backoff.delay(*attempts).as_millis() as i64;
            assert!(
                (want - 50..=want + 50).contains(backoff_ms),
                "event {id} after {attempts} attempts waits {backoff_ms} ms, want {want} ms"
            );
        } else {
            assert!(err.starts_with("broker unavailable"), "event {id}: {err}");
            assert!(
                *backoff_ms <= 0,
                "event {id} released unsent is due at once, not in {backoff_ms} ms"
            );
        }
    }
    assert!(timed_out >= 1, "some row waits after a timed-out attempt: {rows:?}");

    assert!(
        wait_drained(&db, Duration::from_secs(180), "timeout"),
        "events left unsent after the broker resumed"
    );
    let stats = relay.counters();
    relay.stop(Duration::from_secs(10));
    assert_eq!(db.count("FAIL"), 0);
    assert!(stats.retried >= 2, "{stats:?}");
    let read = read_topic(NAMESRV, &topic, expected.len(), Duration::from_secs(120)).unwrap();
    assert!(
        !read.timed_out,
        "only {} of {} read back",
        read.distinct,
        expected.len()
    );
    let duplicates = verify(&read, &expected, &HashSet::new());
    // A timed-out send may have been stored: those come twice, which consumers must absorb.
    eprintln!(
        "timeout: delivered={} duplicates={duplicates} (timed-out attempts {}), {stats:?}",
        read.distinct, stats.retried
    );
    assert!(duplicates as u64 <= stats.retried);
}

#[test]
fn batch_sends_versus_single_sends_throughput() {
    let _shared = BROKER_LOCK.read();
    ensure_broker();
    let db = TestDb::new("mq_rate");
    let topic = unique("outbox_e2e_rate");
    let cfg = mq_config(&db, &topic);
    let publisher = Arc::new(RocketMqPublisher::start(&cfg).unwrap());
    let events: Vec<OutboundEvent> = (1..=4000u64)
        .map(|id| OutboundEvent {
            id,
            key: outbox::event::new_event_key(),
            biz_no: format!("R-{id}"),
            event_type: "ORDER_CREATED".into(),
            payload: payload(id as usize, 200),
            topic: topic.clone(),
            tag: None,
            headers: BTreeMap::new(),
            attempt: 0,
            created_ms: 0,
        })
        .collect();
    // Warm up the route and connection.
    assert!(matches!(
        publisher.publish(&events[..1], Duration::from_secs(5))[0],
        SendOutcome::Sent { .. }
    ));
    let run = |label: &str, chunk: usize, threads: usize, events: &[OutboundEvent]| -> f64 {
        let start = Instant::now();
        let sent = AtomicUsize::new(0);
        let per_thread = events.len().div_ceil(threads);
        std::thread::scope(|s| {
            for part in events.chunks(per_thread) {
                let (publisher, sent) = (&publisher, &sent);
                s.spawn(move || {
                    for c in part.chunks(chunk) {
                        let outcomes = publisher.publish(c, Duration::from_secs(5));
                        sent.fetch_add(
                            outcomes
                                .iter()
                                .filter(|o| matches!(o, SendOutcome::Sent { .. }))
                                .count(),
                            SeqCst,
                        );
                    }
                });
            }
        });
        let rate = events.len() as f64 / start.elapsed().as_secs_f64();
        eprintln!(
            "rate: {label}: {} events in {:?} = {rate:.0} events/s",
            events.len(),
            start.elapsed()
        );
        assert_eq!(sent.load(SeqCst), events.len(), "{label}: every send succeeded");
        rate
    };
    let batch = run("batches of 32, 4 threads", 32, 4, &events[..2000]);
    let single_parallel = run("single sends, 4 threads", 1, 4, &events[2000..3000]);
    let single = run("single sends, 1 thread", 1, 1, &events[3000..]);
    eprintln!("rate: batch {batch:.0}/s, parallel single {single_parallel:.0}/s, single {single:.0}/s");
    publisher.shutdown();
    publisher.shutdown();
    assert!(!publisher.is_healthy(), "a shut-down publisher is not healthy");
    assert!(matches!(
        &publisher.publish(&events[..1], Duration::from_secs(1))[0],
        SendOutcome::Failed(e) if e.kind == outbox::FailureKind::Unavailable
    ));
    let read = read_topic(NAMESRV, &topic, 4000, Duration::from_secs(120)).unwrap();
    assert!(!read.timed_out, "only {} of 4000 read back", read.distinct);
}

#[test]
fn a_publisher_without_a_name_server_reports_the_broker_unavailable() {
    let db = TestDb::new("mq_nons");
    let mut cfg = mq_config(&db, "outbox_e2e_nons");
    // A port on loopback where nothing listens.
    cfg.rocketmq.namesrv = "127.0.0.1:1".into();
    cfg.send_timeout = Duration::from_secs(2);
    let p = RocketMqPublisher::start(&cfg).unwrap();
    let debug = format!("{p:?}");
    let e = OutboundEvent {
        id: 1,
        key: outbox::event::new_event_key(),
        biz_no: "B".into(),
        event_type: "T".into(),
        payload: b"x".to_vec(),
        topic: "outbox_e2e_nons".into(),
        tag: None,
        headers: BTreeMap::new(),
        attempt: 0,
        created_ms: 0,
    };
    let out = p.publish(&[e.clone(), e], Duration::from_secs(2));
    eprintln!("no name server: {out:?}");
    for o in &out {
        assert!(
            matches!(o, SendOutcome::Failed(e) if e.kind == outbox::FailureKind::Unavailable),
            "{o:?}"
        );
    }
    assert!(!p.is_healthy());
    assert!(!debug.contains("secret"), "{debug}");
}

#[test]
fn access_keys_never_show_in_debug_output() {
    let mut cfg = Config::new("mysql://root@127.0.0.1:3306/none");
    cfg.rocketmq.namesrv = "127.0.0.1:1".into();
    cfg.rocketmq.access_key = Some("AK-visible-not".into());
    cfg.rocketmq.secret_key = Some("SK-very-secret".into());
    let p = RocketMqPublisher::start(&cfg).unwrap();
    let debug = format!("{p:?}");
    assert!(
        !debug.contains("AK-visible-not") && !debug.contains("SK-very-secret"),
        "{debug}"
    );
    assert!(debug.contains("acl: \"on\""), "{debug}");
}

#[test]
fn per_biz_no_ordering_keeps_commit_order_per_key_in_one_queue() {
    let _shared = BROKER_LOCK.read();
    ensure_broker();
    let db = TestDb::new("e2e_ordered");
    let topic = unique("E2E_ORDERED");
    let mut cfg = mq_config(&db, &topic);
    cfg.ordering = outbox::config::Ordering::PerBizNo;
    // Events of 12 keys, interleaved over 8 commits: commit (id) order is the order to keep.
    let mut conn = db.conn();
    let mut order_of: HashMap<String, Vec<u64>> = HashMap::new();
    for step in 0..8 {
        let mut tx = conn.start_transaction(mysql::TxOpts::default()).unwrap();
        for key in 0..12 {
            let biz = format!("ORD-{key}");
            let id = outbox::enqueue_in_tx(
                &mut tx,
                &NewEvent::new(biz.clone(), format!("STEP_{step}"), payload(step, 64)),
            )
            .unwrap();
            order_of.entry(biz).or_default().push(id);
        }
        tx.commit().unwrap();
    }
    let relays: Vec<Relay> = (0..3)
        .map(|i| {
            let mut c = cfg.clone();
            c.instance_id = Some(format!("ordered-{i}-000000"));
            start_relay(&c, None)
        })
        .collect();
    assert!(
        wait_drained(&db, Duration::from_secs(180), "ordered"),
        "not every event was sent"
    );
    for r in &relays {
        r.stop(Duration::from_secs(10));
    }
    let read = read_topic(NAMESRV, &topic, 96, Duration::from_secs(120)).unwrap();
    assert!(!read.timed_out, "only {} of 96 events read back", read.distinct);
    let mut seen: HashMap<String, Vec<(i32, i64, u64)>> = HashMap::new();
    for m in &read.messages {
        let biz = m.properties.get("bizNo").cloned().unwrap();
        seen.entry(biz)
            .or_default()
            .push((m.queue_id, m.queue_offset, m.event_id().unwrap()));
    }
    for (biz, mut msgs) in seen {
        let queues: HashSet<i32> = msgs.iter().map(|m| m.0).collect();
        assert_eq!(queues.len(), 1, "{biz} was spread over queues {queues:?}");
        msgs.sort_by_key(|m| m.1);
        let mut ids: Vec<u64> = msgs.iter().map(|m| m.2).collect();
        ids.dedup();
        assert_eq!(ids, order_of[&biz], "{biz} arrived out of commit order");
    }
}
