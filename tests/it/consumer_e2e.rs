//! The consumer runtime against the real broker: events relayed in order per key, consumed by two
//! consumer instances of one group that credit them in the same transaction as the inbox mark.

use std::sync::Arc;
use std::time::Duration;

use mysql::prelude::Queryable;

use crate::rocketmq_e2e::{ensure_broker, unique, wait_drained, BROKER_LOCK};
use crate::support::{wait_until, TestDb};
use outbox::consumer::{Consumer, ConsumerConfig, HandlerError, Message};
use outbox::rocketmq::RocketMqPublisher;
use outbox::rocketmq::{RocketMqSource, SourceConfig};
use outbox::{NewEvent, Relay};

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
