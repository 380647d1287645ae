//! Two master brokers of one cluster on loopback (`scripts/rocketmq start-b`), one of them
//! SIGKILLed mid-run and restarted: ordered keys stay on their queue and in commit order, keys on
//! the live broker keep flowing, unordered delivery does not notice.
//!
//! These tests hold the broker lock exclusively (the other end-to-end tests expect one broker)
//! and stop broker-b when they end, even by a panic.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mysql::prelude::Queryable;

use outbox::ordering::{queue_index, QueueRef};
use outbox::rocketmq::testing::read_topic;
use outbox::rocketmq::RocketMqPublisher;
use outbox::{Config, NewEvent, Relay};

use crate::rocketmq_e2e::{ensure_broker, script, BROKER_LOCK};
use crate::support::{wait_until, TestDb};

const NAMESRV: &str = "127.0.0.1:9876";
/// How long broker-b stays down.
const OUTAGE: Duration = Duration::from_secs(40);

/// broker-b for the length of a test: started on creation, stopped (store removed) on drop.
struct BrokerB;

impl BrokerB {
    fn start() -> BrokerB {
        ensure_broker();
        let mut last = String::new();
        for _ in 0..3 {
            match script(&["start-b"]) {
                Ok(_) => return BrokerB,
                Err(e) => last = e,
            }
        }
        panic!("broker-b did not start: {last}");
    }
}

impl Drop for BrokerB {
    fn drop(&mut self) {
        if let Err(e) = script(&["stop-b"]) {
            eprintln!("could not stop broker-b: {e}");
        }
    }
}

fn config(db: &TestDb, topic: &str, ordered: bool) -> Config {
    let mut c = db.config();
    c.topic = topic.into();
    c.rocketmq.namesrv = NAMESRV.into();
    c.rocketmq.producer_group = format!("outbox_two_{:08x}", rand::random::<u32>());
    c.breaker_open = Duration::from_millis(500);
    if ordered {
        c.ordering = outbox::config::Ordering::PerBizNo;
    }
    c
}

fn start_relay(cfg: &Config, id: &str) -> Relay {
    let mut cfg = cfg.clone();
    cfg.instance_id = Some(id.into());
    let publisher = RocketMqPublisher::start(&cfg).expect("publisher starts");
    Relay::builder(cfg)
        .publisher(Arc::new(publisher))
        .start()
        .expect("relay starts")
}

/// Commits one event per key every `every` until `stop`, recording each key's ids in commit order.
fn write_steps(
    db: &TestDb,
    cfg: &Config,
    keys: usize,
    every: Duration,
    stop: &AtomicBool,
    relays: &[Relay],
) -> HashMap<String, Vec<u64>> {
    let mut order: HashMap<String, Vec<u64>> = HashMap::new();
    let mut conn = db.conn();
    let mut step = 0usize;
    while !stop.load(SeqCst) {
        let mut tx = conn.start_transaction(mysql::TxOpts::default()).unwrap();
        let mut ids = Vec::new();
        for k in 0..keys {
            let key = format!("CUST-{k}");
            let e = NewEvent::new(key.clone(), format!("STEP_{step}"), format!("{{\"step\":{step}}}"));
            ids.push((key, outbox::enqueue_in_tx_with(&mut tx, cfg, &e).unwrap()));
        }
        tx.commit().unwrap();
        for r in relays {
            r.notify();
        }
        for (key, id) in ids {
            order.entry(key).or_default().push(id);
        }
        step += 1;
        std::thread::sleep(every);
    }
    order
}

/// Events of `keys` claimed at or after `since` (the database's clock) and acked since: while
/// their queues' broker is down, such an event can only have been sent to another queue.
fn claimed_and_sent_since(db: &TestDb, keys: &[String], since: &str) -> Vec<(String, u64)> {
    let list = keys.iter().map(|k| format!("'{k}'")).collect::<Vec<_>>().join(",");
    db.conn()
        .exec(
            format!(
                "SELECT biz_no, id FROM t_event_record \
                 WHERE status = 'SUCCESS' AND biz_no IN ({list}) AND claimed_at >= ?"
            ),
            (since,),
        )
        .unwrap()
}

fn sent_of(db: &TestDb, keys: &[String]) -> u64 {
    if keys.is_empty() {
        return 0;
    }
    let list = keys.iter().map(|k| format!("'{k}'")).collect::<Vec<_>>().join(",");
    db.conn()
        .query_first(format!(
            "SELECT COUNT(*) FROM t_event_record WHERE status = 'SUCCESS' AND biz_no IN ({list})"
        ))
        .unwrap()
        .unwrap_or(0)
}

/// Creates `topic` (8 queues) on both brokers and waits until its route lists both.
fn create_on_both_brokers(db: &TestDb, topic: &str) {
    let admin = RocketMqPublisher::start(&config(db, topic, false)).unwrap();
    admin.create_topic(topic, 8).unwrap();
    assert!(
        wait_until(Duration::from_secs(30), || admin
            .topic_brokers(topic, Duration::from_secs(3))
            .len()
            == 2),
        "the topic's route never listed both brokers"
    );
    admin.close();
}

/// Waits until no event is WAIT or SENDING, printing every 5 s what the rows and the relays are
/// doing (so a drain that stops says where it stopped).
fn drain(db: &TestDb, relays: &[Relay], limit: Duration, label: &str) -> bool {
    let mut last_print = Instant::now();
    wait_until(limit, || {
        std::thread::sleep(Duration::from_millis(100));
        let (open, retrying, sending): (u64, u64, u64) = db
            .conn()
            .query_first(
                "SELECT COUNT(*), COALESCE(SUM(retry_count > 0), 0), COALESCE(SUM(status = 'SENDING'), 0) \
                 FROM t_event_record WHERE status IN ('WAIT', 'SENDING')",
            )
            .unwrap()
            .unwrap();
        if last_print.elapsed() > Duration::from_secs(5) {
            eprintln!(
                "[{label}] {open} not yet sent ({retrying} after a failed attempt, {sending} SENDING); SUCCESS {}",
                db.count("SUCCESS")
            );
            for r in relays {
                let s = r.stats();
                eprintln!(
                    "  {}: claimed {} sent {} retried {} parked {} released {} possible dup {} in flight {} \
                     blocked {} rounds {} breaker {:?} stalled {:?}",
                    s.instance_id,
                    s.claimed,
                    s.sent,
                    s.retried,
                    s.parked,
                    s.released_unsent,
                    s.possible_duplicates,
                    s.in_flight,
                    s.claim_blocked,
                    s.claim_rounds,
                    s.breaker_state,
                    s.stalled,
                );
            }
            last_print = Instant::now();
        }
        open == 0
    })
}

#[test]
fn ordered_keys_keep_their_queue_and_commit_order_while_one_of_two_brokers_is_down() {
    let _exclusive = BROKER_LOCK.write();
    let _b = BrokerB::start();
    let db = TestDb::new("two_ordered");
    let topic = format!("TWO_ORDERED_{:08x}", rand::random::<u32>());
    let cfg = config(&db, &topic, true);
    // An ordered topic is created on every broker before it is relayed (as an operator would).
    create_on_both_brokers(&db, &topic);
    const KEYS: usize = 40;
    let relays: Vec<Relay> = (0..2).map(|i| start_relay(&cfg, &format!("two-{i}-000000"))).collect();
    let stop = AtomicBool::new(false);
    let (order, during) = std::thread::scope(|s| {
        let writer = s.spawn(|| write_steps(&db, &cfg, KEYS, Duration::from_millis(100), &stop, &relays));
        assert!(
            wait_until(Duration::from_secs(120), || db.count("SUCCESS") >= 400),
            "nothing relayed"
        );
        // The stable queue set now holds both brokers' queues.
        let book: Vec<(String, u32)> = db
            .conn()
            .exec(
                "SELECT broker_name, queue_id FROM outbox_topic_queue WHERE topic = ? ORDER BY broker_name, queue_id",
                (&topic,),
            )
            .unwrap();
        let stable: Vec<QueueRef> = book
            .into_iter()
            .map(|(broker, queue_id)| QueueRef {
                topic: topic.clone(),
                broker,
                queue_id,
            })
            .collect();
        let brokers: HashSet<&str> = stable.iter().map(|q| q.broker.as_str()).collect();
        assert_eq!(brokers.len(), 2, "the topic's queues are on both brokers: {stable:?}");
        let on = |b: &str| -> Vec<String> {
            (0..KEYS)
                .map(|k| format!("CUST-{k}"))
                .filter(|k| stable[queue_index(k, stable.len())].broker == b)
                .collect()
        };
        let (on_a, on_b) = (on("broker-a"), on("broker-b"));
        assert!(!on_a.is_empty() && !on_b.is_empty(), "keys on both brokers");
        script(&["kill-broker-b"]).unwrap();
        // From here on (the database's clock, which stamps claims) broker-b is gone: an event of
        // its keys claimed since then cannot be acked by it. (Sends that were in flight at the
        // kill may still be acked, by broker-b, a little later: they were claimed before.)
        let killed_at: String = db.conn().query_first("SELECT CAST(NOW(3) AS CHAR)").unwrap().unwrap();
        let killed = Instant::now();
        // Keys on broker-a keep flowing while broker-b is down.
        let a_before = sent_of(&db, &on_a);
        let b_before = sent_of(&db, &on_b);
        std::thread::sleep(Duration::from_secs(5));
        let a_mid = sent_of(&db, &on_a);
        std::thread::sleep(OUTAGE.saturating_sub(killed.elapsed()));
        let a_after = sent_of(&db, &on_a);
        let b_after = sent_of(&db, &on_b);
        let b_elsewhere = claimed_and_sent_since(&db, &on_b, &killed_at);
        let parked: u64 = relays.iter().map(|r| r.counters().parked).sum();
        eprintln!(
            "outage: broker-a keys {a_before} -> {a_mid} -> {a_after} sent; broker-b keys {b_before} -> {b_after} \
             (in-flight sends ending); parked {parked}"
        );
        script(&["start-b"]).unwrap();
        std::thread::sleep(Duration::from_secs(5));
        stop.store(true, SeqCst);
        let order = writer.join().unwrap();
        (order, (a_mid, a_after, b_elsewhere, parked))
    });
    let (a_mid, a_after, b_elsewhere, parked) = during;
    assert!(
        a_after > a_mid,
        "keys on the live broker stopped flowing during the outage"
    );
    assert!(
        b_elsewhere.is_empty(),
        "events of the dead broker's keys claimed during the outage were acked (sent elsewhere): {b_elsewhere:?}"
    );
    assert!(parked > 0, "the dead broker's keys were parked");
    assert!(
        drain(&db, &relays, Duration::from_secs(180), "two brokers, ordered"),
        "events left unsent after broker-b came back"
    );
    let stats: Vec<_> = relays.iter().map(|r| r.counters()).collect();
    for r in &relays {
        r.stop(Duration::from_secs(10));
    }
    assert_eq!(db.count("FAIL"), 0);
    let retried: u64 = stats.iter().map(|s| s.retried).sum();
    let breaker_opened: u64 = stats.iter().map(|s| s.breaker_opened).sum();
    eprintln!("relays: retried {retried}, breaker opened {breaker_opened}, parked {parked}");
    assert_eq!(
        breaker_opened, 0,
        "one broker of two down must not open the relay's breaker"
    );

    // Read every queue back by offset: each key in one queue, first copies in commit order.
    let total: usize = order.values().map(Vec::len).sum();
    let read = read_topic(NAMESRV, &topic, total, Duration::from_secs(180)).unwrap();
    assert!(!read.timed_out, "only {} of {total} events read back", read.distinct);
    let mut by_key: HashMap<String, Vec<(String, i32, i64, u64)>> = HashMap::new();
    for m in &read.messages {
        let key = m.properties.get("bizNo").cloned().unwrap();
        by_key
            .entry(key)
            .or_default()
            .push((m.broker.clone(), m.queue_id, m.queue_offset, m.event_id().unwrap()));
    }
    for (key, committed) in &order {
        let mut msgs = by_key.remove(key).unwrap_or_default();
        let queues: HashSet<(String, i32)> = msgs.iter().map(|m| (m.0.clone(), m.1)).collect();
        assert_eq!(queues.len(), 1, "{key} was spread over queues {queues:?}");
        msgs.sort_by_key(|m| m.2);
        let mut first = Vec::new();
        let mut seen = HashSet::new();
        for m in &msgs {
            if seen.insert(m.3) {
                first.push(m.3);
            }
        }
        assert_eq!(&first, committed, "{key} read back out of commit order");
    }
    eprintln!(
        "read back {} messages, {} duplicates",
        read.messages.len(),
        read.duplicates()
    );
}

#[test]
fn unordered_delivery_goes_on_unchanged_with_one_of_two_brokers_down() {
    let _exclusive = BROKER_LOCK.write();
    let _b = BrokerB::start();
    let db = TestDb::new("two_unordered");
    let topic = format!("TWO_UNORDERED_{:08x}", rand::random::<u32>());
    let cfg = config(&db, &topic, false);
    // The topic is on both brokers before it is relayed, as an operator creates it. (A topic
    // created by first sends exists only on the brokers those sends reached; a client that saw
    // it on broker-b alone has nowhere else to send until its next route update, 30 s later.)
    create_on_both_brokers(&db, &topic);
    let relays: Vec<Relay> = (0..2).map(|i| start_relay(&cfg, &format!("twou-{i}-000000"))).collect();
    let stop = AtomicBool::new(false);
    let rates = std::thread::scope(|s| {
        let writer = s.spawn(|| write_steps(&db, &cfg, 20, Duration::from_millis(50), &stop, &relays));
        assert!(
            wait_until(Duration::from_secs(120), || db.count("SUCCESS") >= 400),
            "nothing relayed"
        );
        let rate = |d: Duration| {
            let a = db.count("SUCCESS");
            std::thread::sleep(d);
            (db.count("SUCCESS") - a) as f64 / d.as_secs_f64()
        };
        let before = rate(Duration::from_secs(5));
        script(&["kill-broker-b"]).unwrap();
        // Events created from here on (the database's clock) were never in flight at the kill.
        let killed_at: String = db.conn().query_first("SELECT CAST(NOW(3) AS CHAR)").unwrap().unwrap();
        let during = rate(OUTAGE / 2);
        script(&["start-b"]).unwrap();
        stop.store(true, SeqCst);
        writer.join().unwrap();
        (before, during, killed_at)
    });
    assert!(
        drain(&db, &relays, Duration::from_secs(180), "two brokers, unordered"),
        "events left unsent"
    );
    let stats: Vec<_> = relays.iter().map(|r| r.counters()).collect();
    for r in &relays {
        r.stop(Duration::from_secs(10));
    }
    let retried: u64 = stats.iter().map(|s| s.retried).sum();
    let released: u64 = stats.iter().map(|s| s.released_unsent).sum();
    let breaker_opened: u64 = stats.iter().map(|s| s.breaker_opened).sum();
    eprintln!(
        "unordered, one of two brokers down: {:.0}/s before, {:.0}/s during; retried {retried}, \
         released unsent {released}, breaker opened {breaker_opened}",
        rates.0, rates.1
    );
    assert_eq!(
        breaker_opened, 0,
        "one broker of two down must not open the relay's breaker (the client picks the live broker's queues)"
    );
    assert_eq!(db.count("FAIL"), 0);
    // A send in flight on broker-b when it was killed has an unknown outcome and is retried, as
    // it must be; everything committed during the outage goes out with no attempt spent.
    let attempts_during: u64 = db
        .conn()
        .exec_first(
            "SELECT COUNT(*) FROM t_event_record WHERE create_time > ? AND retry_count > 0",
            (&rates.2,),
        )
        .unwrap()
        .unwrap();
    assert_eq!(
        attempts_during, 0,
        "events committed while one broker of two was down cost attempts ({retried} retried in all)"
    );
    let total = db.count("SUCCESS") as usize;
    let read = read_topic(NAMESRV, &topic, total, Duration::from_secs(180)).unwrap();
    assert!(!read.timed_out, "only {} of {total} events read back", read.distinct);
}
