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

use outbox::consumer::{BatchHandler, Consumer, ConsumerConfig, HandlerError, Message, Source};
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
                    created_ms: 0,
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

/// The batch handler: the batch's credits in one multi-row INSERT.
struct CreditAll;

impl BatchHandler for CreditAll {
    fn handle_batch(&self, tx: &mut mysql::Transaction<'_>, msgs: &[Message]) -> Result<(), HandlerError> {
        let mut sql = String::from("INSERT INTO credits (biz_no, points) VALUES ");
        let mut params: Vec<mysql::Value> = Vec::with_capacity(msgs.len() * 2);
        for (i, m) in msgs.iter().enumerate() {
            sql.push_str(if i == 0 { "(?, ?)" } else { ", (?, ?)" });
            params.push(m.biz_no().unwrap_or_default().into());
            params.push((m.offset as i64 % 100).into());
        }
        tx.exec_drop(sql, params)?;
        Ok(())
    }
}

/// Messages per second from the first message handled to the last, the duplicates seen, and the
/// mean messages per transaction.
fn run(topic: &str, pool: &Pool, n: u64, inbox: bool, batch_max: usize, batch_handler: bool) -> (f64, u64, f64) {
    let group = format!(
        "bench_{}_{:08x}",
        if inbox { "inbox" } else { "plain" },
        rand::random::<u32>()
    );
    let src = RocketMqSource::start(&SourceConfig::new(NAMESRV, topic, &group)).expect("source");
    let mut cfg = ConsumerConfig::new(&group);
    cfg.inbox = inbox;
    cfg.batch_max = batch_max;
    let c = if batch_handler {
        Consumer::start_batch(cfg, pool.clone(), Arc::new(src), Arc::new(CreditAll))
    } else {
        Consumer::start(cfg, pool.clone(), Arc::new(src), Arc::new(credit))
    }
    .expect("consumer");
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
    let per_tx = (s.processed + s.duplicates) as f64 / s.transactions.max(1) as f64;
    (s.processed as f64 / secs, s.duplicates, per_tx)
}

fn main() {
    let mut n: u64 = 20_000;
    let mut only: Vec<String> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--messages" => n = args.next().and_then(|v| v.parse().ok()).expect("--messages N"),
            "--only" => only.push(
                args.next()
                    .expect("--only TEXT (runs the configurations whose name holds it)"),
            ),
            "--bench" => {}
            other => {
                eprintln!("consumer bench: unknown argument {other:?} (--messages N, --only TEXT)");
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
    // The pool the consumer's users get (`outbox::connect`: READ COMMITTED, no reset per checkout).
    let pool = outbox::connect(&Config::new(&url)).expect("pool");
    outbox::migrate(&pool).unwrap();
    pool.get_conn()
        .unwrap()
        .query_drop("CREATE TABLE credits (seq BIGINT AUTO_INCREMENT PRIMARY KEY, biz_no VARCHAR(64), points BIGINT)")
        .unwrap();
    let topic = format!("OUTBOX_BENCH_CONSUMER_{:08X}", rand::random::<u32>());
    fill(&topic, &url, n);
    let raw = raw_pull(&topic, n);
    println!();
    println!("consumer throughput, {n} messages, 4 handler threads, same topic, same run");
    println!("  {:<44} {:>10.0} msg/s", "raw pull (no database)", raw);
    let mut rows = Vec::new();
    for (name, inbox, batch, batch_handler) in [
        ("inbox, batch 1 (one message per transaction)", true, 1, false),
        ("no inbox, batch 1", false, 1, false),
        ("inbox, batch 32", true, 32, false),
        ("inbox, batch 64", true, 64, false),
        ("inbox, batch 128 (default)", true, 128, false),
        ("inbox, batch 256", true, 256, false),
        ("no inbox, batch 128", false, 128, false),
        ("inbox, batch 128, batch handler", true, 128, true),
        ("inbox, batch 128 (default, again)", true, 128, false),
        ("no inbox, batch 128 (again)", false, 128, false),
    ] {
        if !only.is_empty() && !only.iter().any(|o| name.contains(o.as_str())) {
            continue;
        }
        let (rate, dups, per_tx) = run(&topic, &pool, n, inbox, batch, batch_handler);
        println!("  {name:<44} {rate:>10.0} msg/s  {per_tx:>6.1} msg/tx  dups {dups}");
        rows.push((name, rate));
    }
    let rate = |prefix: &str| {
        let v: Vec<f64> = rows
            .iter()
            .filter(|(n, _)| n.starts_with(prefix))
            .map(|(_, r)| *r)
            .collect();
        v.iter().sum::<f64>() / v.len().max(1) as f64
    };
    let (inboxed, plain) = (rate("inbox, batch 128 (default"), rate("no inbox, batch 128"));
    println!(
        "  inbox / no inbox at batch 128: {:.0} %; batch 128 / batch 1 with the inbox: {:.1}x",
        100.0 * inboxed / plain,
        inboxed / rate("inbox, batch 1 ")
    );
    server
        .get_conn()
        .unwrap()
        .query_drop(format!("DROP DATABASE {db}"))
        .unwrap();
}
