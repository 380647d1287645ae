//! The consumer runtime against the real broker: events relayed in order per key, consumed by two
//! consumer instances of one group that credit them in the same transaction as the inbox mark.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mysql::prelude::Queryable;
use parking_lot::Mutex;

use crate::rocketmq_e2e::{ensure_broker, script, unique, wait_drained, BROKER_LOCK};
use crate::support::{wait_until, TestDb};
use outbox::consumer::{Consumer, ConsumerConfig, HandlerError, Message, QueueRef, Source};
use outbox::rocketmq::RocketMqPublisher;
use outbox::rocketmq::{RocketMqSource, SourceConfig};
use outbox::{NewEvent, OutboundEvent, Publisher, Relay, SendOutcome};

const NAMESRV: &str = "127.0.0.1:9876";

fn credit(tx: &mut mysql::Transaction<'_>, m: &Message) -> Result<(), HandlerError> {
    let body: serde_json::Value = serde_json::from_slice(&m.body)?;
    tx.exec_drop(
        "INSERT INTO credits (biz_no, n, event_key, queue_id) VALUES (?, ?, ?, ?)",
        (
            m.biz_no().unwrap_or_default(),
            body["n"].as_i64().unwrap_or(-1),
            &m.key,
            m.queue.queue_id,
        ),
    )?;
    Ok(())
}

#[test]
fn two_consumers_of_a_group_credit_every_relayed_event_once_in_key_order() {
    let _shared = BROKER_LOCK.read();
    ensure_broker();
    let db = TestDb::new("cons_mq");
    db.conn()
        .query_drop(
            "CREATE TABLE credits (seq BIGINT AUTO_INCREMENT PRIMARY KEY, biz_no VARCHAR(64), n INT, \
             event_key VARCHAR(64), queue_id INT)",
        )
        .unwrap();
    let topic = unique("outbox_e2e_cons");
    let group = unique("points");
    let mut cfg = db.config();
    cfg.topic = topic.clone();
    cfg.rocketmq.namesrv = NAMESRV.into();
    cfg.rocketmq.producer_group = unique("outbox_e2e");
    cfg.ordering = outbox::config::Ordering::PerBizNo;
    let keys = 20;
    let per_key = 30;
    {
        let mut conn = db.conn();
        for n in 0..per_key {
            let mut tx = conn.start_transaction(mysql::TxOpts::default()).unwrap();
            for k in 0..keys {
                let e = NewEvent::new(format!("ORD-{k}"), "ORDER_STEP", format!("{{\"n\":{n}}}"));
                outbox::enqueue_in_tx(&mut tx, &e).unwrap();
            }
            tx.commit().unwrap();
        }
    }
    let relay = Relay::builder(cfg.clone())
        .publisher(Arc::new(RocketMqPublisher::start(&cfg).unwrap()))
        .start()
        .unwrap();
    let consumer = |_: usize| {
        let src = RocketMqSource::start(&SourceConfig::new(NAMESRV, &topic, &group)).unwrap();
        Consumer::start(
            ConsumerConfig::new(&group),
            db.pool.clone(),
            Arc::new(src),
            Arc::new(credit),
        )
        .unwrap()
    };
    let (a, b) = (consumer(0), consumer(1));
    let total = (keys * per_key) as u64;
    assert!(wait_drained(&db, Duration::from_secs(120), "cons_mq"));
    let credited = || -> u64 {
        db.conn()
            .query_first("SELECT COUNT(DISTINCT event_key) FROM credits")
            .unwrap()
            .unwrap()
    };
    assert!(
        wait_until(Duration::from_secs(120), || credited() == total),
        "credited {} of {total}",
        credited()
    );
    relay.stop(Duration::from_secs(10));
    let (sa, sb) = (a.stop(), b.stop());
    eprintln!("consumer a: {sa:?}\nconsumer b: {sb:?}");
    assert_eq!(sa.processed + sb.processed, total, "each event handled once");
    assert_eq!(sa.fallback_keys + sb.fallback_keys, 0, "every message carried eventKey");
    assert_eq!(sa.dead_lettered + sb.dead_lettered, 0);
    let mut conn = db.conn();
    let rows: u64 = conn.query_first("SELECT COUNT(*) FROM credits").unwrap().unwrap();
    assert_eq!(rows, total, "no double credit");
    // The key the consumer saw is the one stored with the outbox row.
    let matched: u64 = conn
        .query_first(
            "SELECT COUNT(*) FROM credits c JOIN t_event_record e ON e.event_key = c.event_key AND e.biz_no = c.biz_no",
        )
        .unwrap()
        .unwrap();
    assert_eq!(matched, total);
    // Per key: credited in event order, from one queue.
    for k in 0..keys {
        let steps: Vec<(i64, u32)> = conn
            .exec(
                "SELECT n, queue_id FROM credits WHERE biz_no = ? ORDER BY seq",
                (format!("ORD-{k}"),),
            )
            .unwrap();
        let ns: Vec<i64> = steps.iter().map(|s| s.0).collect();
        assert_eq!(ns, (0..per_key as i64).collect::<Vec<_>>(), "ORD-{k} in order");
        assert!(steps.iter().all(|s| s.1 == steps[0].1), "ORD-{k} from one queue");
    }
    let marks: u64 = conn
        .exec_first("SELECT COUNT(*) FROM outbox_inbox WHERE consumer_group = ?", (&group,))
        .unwrap()
        .unwrap();
    assert_eq!(marks, total);
}

/// Sends `n` messages to `topic` (created by the first send, 4 queues), one per request so that
/// the producer spreads them over the queues; their event keys.
fn send(topic: &str, n: usize) -> HashSet<String> {
    let mut cfg = outbox::Config::new("mysql://unused@127.0.0.1/unused");
    cfg.topic = topic.to_string();
    cfg.rocketmq.namesrv = NAMESRV.into();
    cfg.rocketmq.producer_group = unique("outbox_e2e_send");
    // A new producer per call: one made before a broker restart would wait out its own client's
    // endpoint circuit breaker.
    let p = RocketMqPublisher::start(&cfg).unwrap();
    let mut keys = HashSet::new();
    for i in 0..n {
        let e = OutboundEvent {
            id: i as u64 + 1,
            key: outbox::event::new_event_key(),
            biz_no: format!("B-{i}"),
            event_type: "T".into(),
            payload: b"{}".to_vec(),
            topic: topic.to_string(),
            tag: None,
            headers: Default::default(),
            attempt: 0,
            created_ms: 0,
        };
        let out = p.publish(std::slice::from_ref(&e), Duration::from_secs(5));
        assert!(matches!(out[0], SendOutcome::Sent { .. }), "{out:?}");
        keys.insert(e.key);
    }
    p.shutdown();
    keys
}

/// The next offset of every queue in `messages` (what the consumer runtime commits).
fn next_offsets(messages: &[Message]) -> Vec<(QueueRef, u64)> {
    let mut next: HashMap<QueueRef, u64> = HashMap::new();
    for m in messages {
        let o = next.entry(m.queue.clone()).or_default();
        *o = (*o).max(m.offset + 1);
    }
    next.into_iter().collect()
}

/// How many of `messages` carry one of `keys`.
fn among(messages: &[Message], keys: &HashSet<String>) -> usize {
    messages.iter().filter(|m| keys.contains(&m.key)).count()
}

/// A stop takes the consumer out of its group at once and stores the offsets it committed in
/// memory only. The group is asked through a newcomer: an instance that joins 3 s after the stop
/// began must find the stopped one gone, so that it and the remaining instance share every queue
/// (the broker tells the members of a join, not of a leave, so only a join shows who is in the
/// group without waiting for their periodic balance, every 20 s). They then get none of the
/// messages committed before the stop again, and every new one. Before the fix the stop waited
/// for each queue's pull held by the broker, 5 s per queue, gave up after 10 s and only then
/// left the group.
#[test]
fn a_stopped_source_leaves_its_group_at_once_and_stores_its_offsets() {
    let _shared = BROKER_LOCK.read();
    ensure_broker();
    let topic = unique("outbox_e2e_stop");
    let group = unique("stop");
    let first = send(&topic, 40);
    let cfg = SourceConfig::new(NAMESRV, &topic, &group);
    let a = RocketMqSource::start(&cfg).unwrap();
    let b = RocketMqSource::start(&cfg).unwrap();
    assert!(
        wait_until(Duration::from_secs(40), || a.assignment().len() == 2
            && b.assignment().len() == 2),
        "the group never split the 4 queues: a {:?}, b {:?}",
        a.assignment(),
        b.assignment()
    );
    let (mut of_a, mut of_b) = (Vec::new(), Vec::new());
    assert!(
        wait_until(Duration::from_secs(60), || {
            of_a.extend(a.poll(Duration::from_millis(100)).unwrap());
            of_b.extend(b.poll(Duration::from_millis(100)).unwrap());
            among(&of_a, &first) + among(&of_b, &first) >= first.len()
        }),
        "a got {}, b got {} of {}",
        of_a.len(),
        of_b.len(),
        first.len()
    );
    // `a` commits in memory only: its stop must store the offsets. `b` stores them now.
    a.commit(&next_offsets(&of_a), false);
    b.commit(&next_offsets(&of_b), true);
    // Nothing new: `a`'s pulls are held by the broker now (what stops used to wait for).
    std::thread::sleep(Duration::from_secs(2));
    let stopping = Instant::now();
    let stop = std::thread::spawn(move || {
        a.shutdown();
        stopping.elapsed()
    });
    std::thread::sleep(Duration::from_secs(3));
    let c = RocketMqSource::start(&cfg).unwrap();
    let shared = wait_until(Duration::from_secs(15), || {
        b.assignment().len() == 2 && c.assignment().len() == 2
    });
    let stop_took = stop.join().unwrap();
    eprintln!("stop took {stop_took:?}");
    assert!(
        shared,
        "3 s after the stop began the group still counted the stopped instance: the remaining one has {:?}, the \
         newcomer {:?}",
        b.assignment(),
        c.assignment()
    );
    // The queues are `b`'s and `c`'s, from where `a` stopped: none of the first messages again,
    // every new one.
    let later = send(&topic, 8);
    let mut got = Vec::new();
    let all = wait_until(Duration::from_secs(30), || {
        got.extend(b.poll(Duration::from_millis(100)).unwrap());
        got.extend(c.poll(Duration::from_millis(100)).unwrap());
        among(&got, &later) >= later.len()
    });
    assert!(
        all,
        "the group got {} of the {} new messages",
        among(&got, &later),
        later.len()
    );
    assert_eq!(among(&got, &first), 0, "messages committed before the stop came again");
    b.shutdown();
    c.shutdown();
}

/// A name server that cannot be reached: the source starts (the name server may come up later)
/// but says why it cannot take messages, naming the address, and has no lag to report.
#[test]
fn a_source_that_cannot_reach_its_name_server_says_so_and_reports_no_lag() {
    let group = unique("nons");
    let src = RocketMqSource::start(&SourceConfig::new("127.0.0.1:1", "outbox_e2e_nons", &group)).unwrap();
    assert!(src.poll(Duration::from_millis(200)).unwrap().is_empty());
    assert_eq!(src.lag(), None, "no queue is assigned: the lag is unknown, not 0");
    let why = src.health().expect("a source without a name server is not healthy");
    eprintln!("health: {why}");
    assert!(why.contains("127.0.0.1:1") && why.contains("name server"), "{why}");
    assert!(src.assignment().is_empty());
    src.shutdown();
}

/// On a topic with a route every source of the group is healthy, the one left without a queue
/// (5 instances, 4 queues) too; only the ones with a queue report a lag. A topic without a
/// route is a problem that names the topic.
#[test]
fn sources_of_a_routed_topic_are_healthy_even_without_a_queue_and_a_topic_without_a_route_is_not() {
    let _shared = BROKER_LOCK.read();
    ensure_broker();
    let topic = unique("outbox_e2e_health");
    let group = unique("health");
    send(&topic, 4);
    let cfg = SourceConfig::new(NAMESRV, &topic, &group);
    let sources: Vec<RocketMqSource> = (0..5).map(|_| RocketMqSource::start(&cfg).unwrap()).collect();
    let counts = || {
        let mut c: Vec<usize> = sources.iter().map(|s| s.assignment().len()).collect();
        c.sort();
        c
    };
    assert!(
        wait_until(Duration::from_secs(40), || counts() == vec![0, 1, 1, 1, 1]),
        "the group never balanced 4 queues over 5 instances: {:?}",
        counts()
    );
    for s in &sources {
        let assigned = !s.assignment().is_empty();
        let lag = s.lag();
        assert_eq!(
            lag.is_some(),
            assigned,
            "lag {lag:?} with assignment {:?}",
            s.assignment()
        );
        assert_eq!(s.health(), None, "assignment {:?}", s.assignment());
    }
    let missing = unique("outbox_e2e_noroute");
    let lost = RocketMqSource::start(&SourceConfig::new(NAMESRV, &missing, &unique("noroute"))).unwrap();
    assert_eq!(lost.lag(), None);
    let why = lost.health().expect("a topic without a route is a problem");
    eprintln!("health: {why}");
    assert!(why.contains(&missing) && why.contains("no route"), "{why}");
    lost.shutdown();
    for s in sources {
        s.shutdown();
    }
}

/// Starts the broker again when a test that killed it ends, even by a panic.
struct BrokerBack;

impl Drop for BrokerBack {
    fn drop(&mut self) {
        if let Err(e) = script(&["start"]) {
            eprintln!("could not start the broker again: {e}");
        }
    }
}

/// Health readings: when, and what the source said.
type Readings = Arc<Mutex<Vec<(Instant, Option<String>)>>>;

/// A source polled as the consumer runtime does (offsets committed as they come, stored every
/// second), with its lag and health read every second as the runtime does every 5 s.
struct Watched {
    src: Arc<RocketMqSource>,
    got: Arc<Mutex<Vec<Message>>>,
    health: Readings,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Watched {
    fn start(src: RocketMqSource) -> Watched {
        let src = Arc::new(src);
        let got: Arc<Mutex<Vec<Message>>> = Arc::default();
        let health: Readings = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let poller = {
            let (src, got, stop) = (src.clone(), got.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut stored = Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    let batch = src.poll(Duration::from_millis(100)).unwrap();
                    let persist = stored.elapsed() >= Duration::from_secs(1);
                    if persist {
                        stored = Instant::now();
                    }
                    src.commit(&next_offsets(&batch), persist);
                    got.lock().extend(batch);
                }
            })
        };
        let monitor = {
            let (src, health, stop) = (src.clone(), health.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let at = Instant::now();
                    let _ = src.lag();
                    let h = src.health();
                    health.lock().push((at, h));
                    std::thread::sleep(Duration::from_secs(1));
                }
            })
        };
        Watched {
            src,
            got,
            health,
            stop,
            threads: vec![poller, monitor],
        }
    }

    /// Waits until every message of `keys` arrived; how long after `since` the last one did.
    fn receive(&self, keys: &HashSet<String>, since: Instant) -> Option<Duration> {
        let all = wait_until(Duration::from_secs(90), || among(&self.got.lock(), keys) >= keys.len());
        all.then(|| since.elapsed())
    }

    /// The problems health reported from `from` to `to`.
    fn problems(&self, from: Instant, to: Instant) -> Vec<String> {
        self.health
            .lock()
            .iter()
            .filter(|(at, _)| *at >= from && *at <= to)
            .filter_map(|(_, h)| h.clone())
            .collect()
    }

    fn healthy_now(&self) -> bool {
        self.health.lock().last().is_some_and(|(_, h)| h.is_none())
    }

    fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            t.join().unwrap();
        }
        self.src.shutdown();
    }
}

/// A broker restarted on the same store (SIGKILL, then started again), then one down for 10 s:
/// every message sent once it is back is received, and the source's health names the broker
/// while it is gone or not yet read again, then clears. Before the fix a pull in flight when the
/// broker died was given up only after 30 s, and after a longer outage the client kept away from
/// the broker for 30 s more (its endpoint circuit breaker), with the health saying nothing.
#[test]
fn every_message_sent_after_a_broker_restart_is_received_and_the_outage_is_reported() {
    let _exclusive = BROKER_LOCK.write();
    ensure_broker();
    let _back = BrokerBack;
    let topic = unique("outbox_e2e_restart");
    let group = unique("restart");
    let before = send(&topic, 8);
    let w = Watched::start(RocketMqSource::start(&SourceConfig::new(NAMESRV, &topic, &group)).unwrap());
    assert!(
        w.receive(&before, Instant::now()).is_some(),
        "the first messages never arrived"
    );
    for down in [None, Some(Duration::from_secs(10))] {
        // Wait for a healthy reading, so that what follows is this outage's.
        assert!(
            wait_until(Duration::from_secs(30), || w.healthy_now()),
            "{:?}",
            w.health.lock().last()
        );
        let killed = Instant::now();
        match down {
            None => {
                script(&["restart-broker"]).unwrap();
            }
            Some(d) => {
                script(&["kill-broker"]).unwrap();
                std::thread::sleep(d);
                script(&["start"]).unwrap();
            }
        }
        let back = Instant::now();
        let after = send(&topic, 8);
        let took = w.receive(&after, back);
        let problems = w.problems(killed, Instant::now());
        eprintln!(
            "broker down {:?}: back after {:?}; the messages sent then arrived {took:?} after it was back; \
             health meanwhile: {problems:#?}",
            down,
            back - killed
        );
        assert!(
            took.is_some(),
            "{} of the 8 messages sent after the restart arrived",
            among(&w.got.lock(), &after)
        );
        assert!(
            problems.iter().any(|p| p.contains("broker-a") && p.contains(&topic)),
            "health never reported the broker gone: {problems:?}"
        );
        assert!(
            wait_until(Duration::from_secs(30), || w.healthy_now()),
            "health still reports {:?}",
            w.health.lock().last()
        );
    }
    w.stop();
}

/// Not a check, a measurement (`--ignored`): through the consumer runtime, how long after a broker
/// restart (`scripts/rocketmq restart-broker`; with `OUTBOX_TEST_BROKER_DOWN_S=N`, a kill and a
/// start N seconds later) the messages sent once it is back are handled, what the runtime's health
/// said meanwhile, and how long `Consumer::stop` takes. docs/rocketmq.md has the results.
#[test]
#[ignore]
fn measure_recovery_after_a_broker_restart_and_the_stop() {
    let _exclusive = BROKER_LOCK.write();
    ensure_broker();
    let _back = BrokerBack;
    let db = TestDb::new("cons_measure");
    let topic = unique("outbox_e2e_measure");
    let group = unique("measure");
    let first = send(&topic, 8);
    let handled: Arc<Mutex<Vec<(Instant, String)>>> = Arc::default();
    let handler = {
        let handled = handled.clone();
        move |_tx: &mut mysql::Transaction<'_>, m: &Message| -> Result<(), HandlerError> {
            handled.lock().push((Instant::now(), m.key.clone()));
            Ok(())
        }
    };
    let src = RocketMqSource::start(&SourceConfig::new(NAMESRV, &topic, &group)).unwrap();
    let consumer = Arc::new(
        Consumer::start(
            ConsumerConfig::new(&group),
            db.pool.clone(),
            Arc::new(src),
            Arc::new(handler),
        )
        .unwrap(),
    );
    let done = |keys: &HashSet<String>| handled.lock().iter().filter(|(_, k)| keys.contains(k)).count();
    assert!(wait_until(Duration::from_secs(30), || done(&first) >= first.len()));
    let stop = Arc::new(AtomicBool::new(false));
    let monitor = {
        let (consumer, stop) = (consumer.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut seen = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let s = consumer.stats();
                if seen.last() != Some(&s.unhealthy) {
                    eprintln!("health: {:?} (lag {:?})", s.unhealthy, s.lag);
                    seen.push(s.unhealthy);
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        })
    };
    // Let the pulls go idle (held by the broker), as in production between bursts.
    std::thread::sleep(Duration::from_secs(6));
    let killed = Instant::now();
    match std::env::var("OUTBOX_TEST_BROKER_DOWN_S")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        Some(secs) => {
            script(&["kill-broker"]).unwrap();
            std::thread::sleep(Duration::from_secs(secs));
            script(&["start"]).unwrap();
        }
        None => {
            script(&["restart-broker"]).unwrap();
        }
    }
    let back = Instant::now();
    let later = send(&topic, 8);
    let all = wait_until(Duration::from_secs(120), || done(&later) >= later.len());
    let last = handled
        .lock()
        .iter()
        .filter(|(_, k)| later.contains(k))
        .map(|(t, _)| *t)
        .max();
    std::thread::sleep(Duration::from_secs(6));
    stop.store(true, Ordering::Relaxed);
    monitor.join().unwrap();
    let stopping = Instant::now();
    match Arc::try_unwrap(consumer) {
        Ok(consumer) => consumer.stop(),
        Err(_) => panic!("the consumer is still shared"),
    };
    eprintln!(
        "measure: broker back {:?} after the kill; every message sent then handled {:?} after it was back{}; \
         Consumer::stop took {:?}",
        back - killed,
        last.map(|t| t - back),
        if all { "" } else { " (NOT ALL)" },
        stopping.elapsed()
    );
}
