//! A stalled broker (SIGSTOP: the kernel still accepts and buffers requests, the broker stores
//! them when it resumes) during a steady drain: every duplicate read back belongs to a row whose
//! counted attempts allow it, and the relay counted the possible duplicates.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use mysql::prelude::Queryable;

use outbox::rocketmq::testing::read_topic;
use outbox::rocketmq::RocketMqPublisher;
use outbox::{NewEvent, Relay};

use crate::rocketmq_e2e::{ensure_broker, script, BROKER_LOCK};
use crate::support::{wait_until, TestDb};

const NAMESRV: &str = "127.0.0.1:9876";
/// How long the broker stays stopped.
const STALL: Duration = Duration::from_secs(20);

/// Resumes the broker when the test ends, even by a panic.
struct Resume;

impl Drop for Resume {
    fn drop(&mut self) {
        let _ = script(&["resume-broker"]);
    }
}

#[test]
fn every_duplicate_after_a_broker_stall_is_a_counted_attempt() {
    let _exclusive = BROKER_LOCK.write();
    ensure_broker();
    let _resume = Resume;
    let db = TestDb::new("stall_dups");
    let topic = format!("STALL_{:08x}", rand::random::<u32>());
    let mut cfg = db.config();
    cfg.topic = topic.clone();
    cfg.rocketmq.namesrv = NAMESRV.into();
    cfg.rocketmq.producer_group = format!("outbox_stall_{:08x}", rand::random::<u32>());
    // The relay's own send timeout and breaker (what an outboxd run uses).
    cfg.backoff.policy = outbox::BackoffPolicy::Fixed;
    cfg.backoff.base = Duration::from_millis(500);
    cfg.max_retry = 50;
    let relay = Relay::builder(cfg.clone())
        .publisher(Arc::new(RocketMqPublisher::start(&cfg).unwrap()))
        .start()
        .unwrap();
    let stop = AtomicBool::new(false);
    let committed = std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let mut n = 0u64;
            while !stop.load(SeqCst) {
                for _ in 0..10 {
                    relay
                        .enqueue(&NewEvent::new(
                            format!("ORD-{n}"),
                            "ORDER_CREATED",
                            format!("{{\"n\":{n}}}"),
                        ))
                        .unwrap();
                    n += 1;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            n
        });
        assert!(wait_until(Duration::from_secs(60), || db.count("SUCCESS") >= 500));
        script(&["pause-broker"]).unwrap();
        std::thread::sleep(STALL);
        script(&["resume-broker"]).unwrap();
        assert!(wait_until(Duration::from_secs(60), || db.count("SUCCESS") >= 1000));
        stop.store(true, SeqCst);
        writer.join().unwrap()
    });
    assert!(
        wait_until(Duration::from_secs(180), || db.count("SUCCESS") == committed),
        "not every event was sent after the stall"
    );
    let stats = relay.counters();
    relay.stop(Duration::from_secs(10));
    let read = read_topic(NAMESRV, &topic, committed as usize, Duration::from_secs(120)).unwrap();
    assert!(!read.timed_out, "only {} of {committed} read back", read.distinct);
    let mut copies: HashMap<u64, u64> = HashMap::new();
    for m in &read.messages {
        *copies.entry(m.event_id().unwrap()).or_default() += 1;
    }
    let attempts: HashMap<u64, u64> = db
        .conn()
        .query_map("SELECT id, retry_count FROM t_event_record", |(id, rc): (u64, u64)| {
            (id, rc)
        })
        .unwrap()
        .into_iter()
        .collect();
    let duplicates: u64 = copies.values().map(|c| c - 1).sum();
    let unexplained: Vec<(u64, u64, u64)> = copies
        .iter()
        .filter(|(id, c)| **c > 1 + attempts.get(id).copied().unwrap_or(0))
        .map(|(id, c)| (*id, *c, attempts.get(id).copied().unwrap_or(0)))
        .collect();
    eprintln!(
        "stall: {committed} committed, {} copies read, {duplicates} duplicates; relay: possible duplicates {}, retried {}, released unsent {}, breaker opened {}",
        read.messages.len(),
        stats.possible_duplicates,
        stats.retried,
        stats.released_unsent,
        stats.breaker_opened
    );
    assert!(
        unexplained.is_empty(),
        "copies beyond 1 + counted attempts (id, copies, attempts): {:?}",
        &unexplained[..unexplained.len().min(20)]
    );
    assert!(
        stats.possible_duplicates >= duplicates,
        "{duplicates} duplicates read back but only {} possible duplicates counted",
        stats.possible_duplicates
    );
    assert_eq!(db.count("FAIL"), 0);
}
