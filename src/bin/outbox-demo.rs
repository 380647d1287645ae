//! The demo behind `scripts/demo`: a few writer threads commit orders with their events in one
//! transaction (some rolled back on purpose) while several relay instances publish them to a
//! real RocketMQ broker; then everything is read back from the topic and checked.
//!
//! `cargo run --release --features rocketmq,daemon --bin outbox-demo -- --events 2000 --instances 3`

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mysql::prelude::Queryable;
use mysql::{Opts, Pool, TxOpts};
use parking_lot::Mutex;

use outbox::rocketmq::{testing, RocketMqPublisher};
use outbox::{Config, NewEvent, Relay};

struct Args {
    events: usize,
    instances: usize,
    writers: usize,
    server: String,
    namesrv: String,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        events: 2000,
        instances: 3,
        writers: 4,
        server: std::env::var("OUTBOX_DEMO_MYSQL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306".into()),
        namesrv: std::env::var("OUTBOX_DEMO_NAMESRV").unwrap_or_else(|_| "127.0.0.1:9876".into()),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        let num = |name: &str, v: String| {
            v.parse::<usize>()
                .map_err(|_| format!("{name} {v:?} is not a whole number"))
        };
        match flag.as_str() {
            "--events" => a.events = num("--events", value("--events")?)?,
            "--instances" => a.instances = num("--instances", value("--instances")?)?,
            "--writers" => a.writers = num("--writers", value("--writers")?)?,
            "--mysql" => a.server = value("--mysql")?,
            "--namesrv" => a.namesrv = value("--namesrv")?,
            "-h" | "--help" => {
                println!(
                    "demo [--events N] [--instances K] [--writers W] [--mysql URL-without-db] [--namesrv host:port]"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if a.events == 0 || a.instances == 0 || a.writers == 0 || a.instances > 16 || a.writers > 64 {
        return Err("--events, --instances (1-16) and --writers (1-64) must be positive".into());
    }
    Ok(a)
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

fn main() {
    let _ = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).try_init();
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("demo: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(&args) {
        eprintln!("demo failed: {e}");
        std::process::exit(1);
    }
}

fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let db = "outbox_demo";
    let server = Pool::new(Opts::from_url(&args.server)?)?;
    {
        let mut c = server.get_conn()?;
        c.query_drop(format!("DROP DATABASE IF EXISTS {db}"))?;
        c.query_drop(format!("CREATE DATABASE {db}"))?;
    }
    let url = format!("{}/{db}", args.server);
    let pool = Pool::new(Opts::from_url(&url)?)?;
    let report = outbox::migrate(&pool)?;
    println!("database {db}: migrations {:?} applied", report.applied);
    pool.get_conn()?.query_drop(
        "CREATE TABLE demo_orders (order_no VARCHAR(64) PRIMARY KEY, amount_cents BIGINT NOT NULL, created DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3))",
    )?;
    let topic = format!("OUTBOX_DEMO_{}", std::process::id());

    let latencies = Arc::new(Mutex::new(Vec::with_capacity(args.events)));
    let mut relays = Vec::new();
    for i in 0..args.instances {
        let mut cfg = Config::new(&url);
        cfg.set("topic", &topic)?;
        cfg.set("rocketmq.namesrv", &args.namesrv)?;
        cfg.set("instance.id", &format!("demo-{}-{i}", std::process::id()))?;
        let publisher = Arc::new(RocketMqPublisher::start(&cfg)?);
        let l = latencies.clone();
        relays.push(Arc::new(
            Relay::builder(cfg)
                .publisher(publisher)
                .latency_hook(move |d| l.lock().push(d.to_broker))
                .start()?,
        ));
    }
    println!(
        "{} relay instance(s) publishing to topic {topic} on {}; {} writer(s) committing {} events",
        args.instances, args.namesrv, args.writers, args.events
    );

    let committed_ids = Arc::new(Mutex::new(HashMap::<u64, (String, Vec<u8>)>::new()));
    let rolled_back = Arc::new(Mutex::new(HashSet::<u64>::new()));
    let committed = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let per_writer = args.events.div_ceil(args.writers);
    let mut writers = Vec::new();
    for w in 0..args.writers {
        let (pool, relay) = (pool.clone(), relays[w % relays.len()].clone());
        let (ids, rb, committed) = (committed_ids.clone(), rolled_back.clone(), committed.clone());
        let n = per_writer.min(args.events - (w * per_writer).min(args.events));
        writers.push(std::thread::spawn(move || -> Result<(), String> {
            let mut conn = pool.get_conn().map_err(|e| e.to_string())?;
            let mut done = 0;
            let mut attempt = 0u64;
            while done < n {
                attempt += 1;
                let order = format!("ORD-{w}-{attempt}");
                let payload = format!("{{\"order\":\"{order}\",\"amount_cents\":{}}}", 1000 + attempt).into_bytes();
                let mut tx = conn.start_transaction(TxOpts::default()).map_err(|e| e.to_string())?;
                tx.exec_drop(
                    "INSERT INTO demo_orders (order_no, amount_cents) VALUES (?, ?)",
                    (&order, 1000 + attempt),
                )
                .map_err(|e| e.to_string())?;
                let event =
                    NewEvent::new(order.clone(), "ORDER_CREATED", payload.clone()).with_header("writer", w.to_string());
                let id = relay.enqueue_in_tx(&mut tx, &event).map_err(|e| e.to_string())?;
                if attempt.is_multiple_of(10) {
                    // An order that fails validation after its event was written: nothing may leak.
                    tx.rollback().map_err(|e| e.to_string())?;
                    rb.lock().insert(id);
                    continue;
                }
                relay.commit(tx).map_err(|e| e.to_string())?;
                ids.lock().insert(id, (order, payload));
                committed.fetch_add(1, Relaxed);
                done += 1;
            }
            Ok(())
        }));
    }

    let mut check = pool.get_conn()?;
    let mut last = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(600);
    let total = args.events as u64;
    loop {
        // Sent rows are deleted (sent.rows = delete) or SUCCESS: of the rows committed, those
        // left in another status are not sent yet.
        let c = committed.load(Relaxed);
        let unsent: u64 = check
            .query_first("SELECT COUNT(*) FROM t_event_record WHERE status <> 'SUCCESS'")?
            .unwrap_or(0);
        let sent = c.saturating_sub(unsent);
        if last.elapsed() >= Duration::from_secs(1) || sent == total {
            println!(
                "  {:>5.1} s  committed {c:>7}/{total}  sent {sent:>7}  ({:.0} events/s)",
                started.elapsed().as_secs_f64(),
                sent as f64 / started.elapsed().as_secs_f64()
            );
            last = Instant::now();
        }
        if sent == total && c == total {
            break;
        }
        if Instant::now() > deadline {
            println!("  deadline passed with {sent} of {total} sent");
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let relayed_in = started.elapsed();
    for w in writers {
        w.join().map_err(|_| "a writer panicked")??;
    }
    let mut stats = Vec::new();
    for r in &relays {
        r.stop(Duration::from_secs(10));
        stats.push(r.counters());
    }

    println!("reading topic {topic} back from the broker ...");
    let expected = committed_ids.lock().len();
    let back = testing::read_topic(&args.namesrv, &topic, expected, Duration::from_secs(180))?;
    let ids = committed_ids.lock();
    let rb = rolled_back.lock();
    let mut delivered = HashSet::new();
    let (mut unexpected, mut mismatched) = (0usize, 0usize);
    for m in &back.messages {
        match m.event_id() {
            Some(id) if ids.contains_key(&id) => {
                let (order, payload) = &ids[&id];
                if &m.body != payload
                    || m.biz_no() != Some(order.as_str())
                    || m.keys.as_deref() != Some(&id.to_string())
                {
                    mismatched += 1;
                }
                delivered.insert(id);
            }
            _ => unexpected += 1,
        }
    }
    let leaked = back
        .messages
        .iter()
        .filter(|m| m.event_id().is_some_and(|id| rb.contains(&id)))
        .count();
    let lost = expected - delivered.len();
    let duplicates = back.duplicates();
    let mut lat = latencies.lock().clone();
    lat.sort_unstable();
    let throughput = expected as f64 / relayed_in.as_secs_f64();
    println!();
    println!("summary");
    println!("  committed          {expected} ({} rolled back on purpose)", rb.len());
    println!(
        "  delivered          {} distinct events read back from the broker",
        delivered.len()
    );
    println!("  duplicates         {duplicates}");
    println!("  lost               {lost}");
    println!("  rolled back, leaked {leaked}; unexpected {unexpected}; content mismatches {mismatched}");
    println!(
        "  throughput         {throughput:.0} events/s (first commit to last ack, {} instances)",
        args.instances
    );
    println!(
        "  commit->broker ack p50 {:.1} ms  p99 {:.1} ms  max {:.1} ms",
        percentile(&lat, 0.50),
        percentile(&lat, 0.99),
        percentile(&lat, 1.0)
    );
    for s in &stats {
        println!(
            "  instance {:<24} claimed {:>6} sent {:>6} reclaimed {} stale acks {}",
            s.instance_id, s.claimed, s.sent, s.reclaimed, s.stale_acks
        );
    }
    println!(
        "committed={expected} delivered={} duplicates={duplicates} lost={lost} leaked={leaked} unexpected={unexpected} mismatched={mismatched} throughput_eps={throughput:.0} p50_ms={:.1} p99_ms={:.1}",
        delivered.len(),
        percentile(&lat, 0.50),
        percentile(&lat, 0.99)
    );
    if lost > 0 || leaked > 0 || unexpected > 0 || mismatched > 0 {
        return Err(format!("{lost} lost, {leaked} leaked, {unexpected} unexpected, {mismatched} mismatched").into());
    }
    Ok(())
}
