//! What the inbox costs a consumer: the same consumer runtime and handler over the same topic,
//! with the inbox and without it, in the same run, beside the raw pull rate of the broker.
//!
//! `cargo bench --features rocketmq --bench consumer [-- --messages N]`
//!
//! The topic is filled once (N messages of ~200 bytes over its queues, by the publisher); then
//! each configuration reads it from the first offset with a consumer group of its own:
//! - **raw pull**: the lite pull consumer alone, no database (the ceiling);
//! - **no inbox**: the runtime with `inbox = false`, the handler's INSERT in its own transaction;
//! - **inbox**: the runtime as shipped: mark + the same INSERT in one transaction.
//!
//! Against the real MariaDB and RocketMQ broker of this machine (`scripts/rocketmq start`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use mysql::prelude::Queryable;
use mysql::{Opts, Pool};

use outbox::consumer::{Consumer, ConsumerConfig, HandlerError, Message, Source};
use outbox::rocketmq::RocketMqPublisher;
use outbox::rocketmq::{RocketMqSource, SourceConfig};
use outbox::{Config, OutboundEvent, Publisher, SendOutcome};

const SERVER: &str = "mysql://root@127.0.0.1:3306";
const NAMESRV: &str = "127.0.0.1:9876";

fn fill(topic: &str, db_url: &str, n: u64) {
    let mut cfg = Config::new(db_url);
    cfg.rocketmq.namesrv = NAMESRV.into();
    cfg.topic = topic.into();
    let p = RocketMqPublisher::start(&cfg).expect("publisher");
    let t0 = Instant::now();
    let mut id = 0u64;
    while id < n {
        let batch: Vec<OutboundEvent> = (0..200.min(n - id))
            .map(|i| {
                let e = id + i + 1;
                OutboundEvent {
                    id: e,
                    key: outbox::event::new_event_key(),
                    biz_no: format!("ORD-{e}"),
                    event_type: "ORDER_PAID".into(),
                    payload: format!(
                        "{{\"order\":\"ORD-{e}\",\"points\":{},\"note\":\"{}\"}}",
                        e % 100,
                        "x".repeat(150)
                    )
                    .into_bytes(),
                    topic: topic.into(),
                    tag: None,
                    headers: Default::default(),
                    attempt: 0,
                }
            })
            .collect();
        let out = p.publish(&batch, Duration::from_secs(10));
        let ok = out.iter().filter(|o| matches!(o, SendOutcome::Sent { .. })).count() as u64;
        if ok < batch.len() as u64 {
            eprintln!(
                "fill: {} of {} failed; resending the batch",
                batch.len() as u64 - ok,
                batch.len()
            );
            std::thread::sleep(Duration::from_millis(500));
            continue;
        }
        id += batch.len() as u64;
    }
    p.shutdown();
    println!(
        "filled {topic} with {n} messages in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
}

fn raw_pull(topic: &str, n: u64) -> f64 {
    let group = format!("bench_raw_{:08x}", rand::random::<u32>());
    let src = RocketMqSource::start(&SourceConfig::new(NAMESRV, topic, &group)).expect("source");
    let mut got = 0u64;
    let mut t0 = None;
    let end = Instant::now() + Duration::from_secs(300);
    while got < n && Instant::now() < end {
        let batch = src.poll(Duration::from_millis(200)).expect("poll");
        if !batch.is_empty() && t0.is_none() {
            t0 = Some(Instant::now());
        }
        got += batch.len() as u64;
    }
    let secs = t0.map(|t| t.elapsed().as_secs_f64()).unwrap_or(f64::NAN);
    src.shutdown();
    got as f64 / secs
}

fn credit(tx: &mut mysql::Transaction<'_>, m: &Message) -> Result<(), HandlerError> {
    tx.exec_drop(
        "INSERT INTO credits (biz_no, points) VALUES (?, ?)",
        (m.biz_no().unwrap_or_default(), m.offset as i64 % 100),
    )?;
    Ok(())
}

/// Messages per second from the first message handled to the last, and the database
/// statements per message.
fn run(topic: &str, pool: &Pool, n: u64, inbox: bool) -> (f64, u64) {
    let group = format!(
        "bench_{}_{:08x}",
        if inbox { "inbox" } else { "plain" },
        rand::random::<u32>()
    );
    let src = RocketMqSource::start(&SourceConfig::new(NAMESRV, topic, &group)).expect("source");
    let mut cfg = ConsumerConfig::new(&group);
    cfg.inbox = inbox;
    let c = Consumer::start(cfg, pool.clone(), Arc::new(src), Arc::new(credit)).expect("consumer");
    let end = Instant::now() + Duration::from_secs(600);
    let mut t0 = None;
    loop {
        let s = c.stats();
        if s.processed > 0 && t0.is_none() {
            t0 = Some(Instant::now());
        }
        if s.processed + s.duplicates >= n || Instant::now() > end {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let secs = t0.map(|t| t.elapsed().as_secs_f64()).unwrap_or(f64::NAN);
    let s = c.stop();
    (s.processed as f64 / secs, s.duplicates)
}

fn main() {
    let mut n: u64 = 20_000;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--messages" => n = args.next().and_then(|v| v.parse().ok()).expect("--messages N"),
            "--bench" => {}
            other => {
                eprintln!("consumer bench: unknown argument {other:?} (--messages N)");
                std::process::exit(2);
            }
        }
    }
    let db = format!("outbox_bench_consumer_{:08x}", rand::random::<u32>());
    let server = Pool::new(Opts::from_url(SERVER).unwrap()).expect("MariaDB on 127.0.0.1:3306");
    server
        .get_conn()
        .unwrap()
        .query_drop(format!("CREATE DATABASE {db}"))
        .unwrap();
    let url = format!("{SERVER}/{db}");
    let pool = Pool::new(Opts::from_url(&url).unwrap()).unwrap();
    outbox::migrate(&pool).unwrap();
    pool.get_conn()
        .unwrap()
        .query_drop("CREATE TABLE credits (seq BIGINT AUTO_INCREMENT PRIMARY KEY, biz_no VARCHAR(64), points BIGINT)")
        .unwrap();
    let topic = format!("OUTBOX_BENCH_CONSUMER_{:08X}", rand::random::<u32>());
    fill(&topic, &url, n);
    let raw = raw_pull(&topic, n);
    let (plain, _) = run(&topic, &pool, n, false);
    let (inboxed, dups) = run(&topic, &pool, n, true);
    let (plain2, _) = run(&topic, &pool, n, false);
    println!();
    println!("consumer throughput, {n} messages, 4 handler threads, same topic, same run");
    println!("  {:<34} {:>10.0} msg/s", "raw pull (no database)", raw);
    println!("  {:<34} {:>10.0} msg/s", "runtime without inbox", plain);
    println!("  {:<34} {:>10.0} msg/s", "runtime with inbox", inboxed);
    println!("  {:<34} {:>10.0} msg/s", "runtime without inbox (again)", plain2);
    let base = (plain + plain2) / 2.0;
    println!(
        "  inbox / no inbox: {:.0} % (the mark is one more INSERT in the same transaction); duplicates seen {dups}",
        100.0 * inboxed / base
    );
    server
        .get_conn()
        .unwrap()
        .query_drop(format!("DROP DATABASE {db}"))
        .unwrap();
}
