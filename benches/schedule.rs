//! Scheduled events under load (docs/scheduling.md): how late after its time a scheduled event
//! reaches the broker while a million events wait for later and a relay drains a backlog, and
//! what the million cost the due scan.
//!
//! 1. A fresh database gets N rows scheduled a day ahead and a backlog of B due rows
//!    (`INSERT … SELECT` from MariaDB's sequence engine).
//! 2. **The scan**: the relay's claim scan (`Store::scan_sql`, 500 rows, no lock) on one
//!    connection, its `Handler_read%` counters and its plan, with the N rows there; rows read per
//!    row returned.
//! 3. **Lateness**: one relay with its defaults and the RocketMQ publisher starts draining the
//!    backlog; meanwhile a writer enqueues P probe events, each scheduled at an absolute time
//!    (`NewEvent::deliver_at`) spread over S seconds from 2 s on, each carrying its due time in
//!    a header. A wrapper around the publisher notes when the broker acknowledged each probe;
//!    lateness = ack − due (one machine, one clock), p50/p99/max, and how many went early (must
//!    be 0). The backlog's drain rate over the same run is printed beside it.
//!
//! `cargo bench --features rocketmq --bench schedule [-- --scheduled N] [--backlog B]
//! [--probes P] [--spread S] [--quick]` (defaults 1 000 000, 600 000, 500, 10 s; `--quick`:
//! 100 000, 100 000, 100, 5 s). The backlog must outlast the probes: the run prints what was left
//! of it when the last probe was acknowledged. Needs MariaDB on 127.0.0.1:3306 (root) and the name server and
//! broker (`scripts/rocketmq start`).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use mysql::prelude::Queryable;
use mysql::{Opts, OptsBuilder, Pool, PoolConstraints, PoolOpts, TxOpts};
use parking_lot::Mutex;

use outbox::rocketmq::RocketMqPublisher;
use outbox::store::Store;
use outbox::{Config, NewEvent, OutboundEvent, Publisher, Relay, SendOutcome};

const SERVER: &str = "mysql://root@127.0.0.1:3306";
const DUE_HEADER: &str = "benchDueMs";

struct Args {
    scheduled: u64,
    backlog: u64,
    probes: u64,
    spread_s: u64,
}

fn args() -> Args {
    let mut a = Args {
        scheduled: 1_000_000,
        backlog: 600_000,
        probes: 500,
        spread_s: 10,
    };
    let mut it = std::env::args().skip(1);
    let num = |flag: &str, v: Option<String>| -> u64 {
        let v = v.unwrap_or_else(|| panic!("{flag} needs a value"));
        v.parse()
            .ok()
            .filter(|n| *n >= 1)
            .unwrap_or_else(|| panic!("{flag} must be a whole number of at least 1, not {v:?}"))
    };
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--scheduled" => a.scheduled = num("--scheduled", it.next()),
            "--backlog" => a.backlog = num("--backlog", it.next()),
            "--probes" => a.probes = num("--probes", it.next()),
            "--spread" => a.spread_s = num("--spread", it.next()),
            "--quick" => (a.scheduled, a.backlog, a.probes, a.spread_s) = (100_000, 100_000, 100, 5),
            "--bench" => {}
            other => panic!("unknown argument {other:?} (--scheduled N, --backlog B, --probes P, --spread S, --quick)"),
        }
    }
    a
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

/// The RocketMQ publisher, noting when the broker acknowledged each probe (by its due header).
struct Timed {
    inner: RocketMqPublisher,
    /// (due ms, acked ms) per probe.
    acks: Mutex<Vec<(u64, u64)>>,
    sent: std::sync::atomic::AtomicU64,
}

impl Publisher for Timed {
    fn publish(&self, events: &[OutboundEvent], timeout: Duration) -> Vec<SendOutcome> {
        let out = self.inner.publish(events, timeout);
        let at = now_ms();
        for (e, o) in events.iter().zip(&out) {
            if matches!(o, SendOutcome::Sent { .. }) {
                self.sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if let Some(due) = e.headers.get(DUE_HEADER).and_then(|d| d.parse::<u64>().ok()) {
                    self.acks.lock().push((due, at));
                }
            }
        }
        out
    }
    fn queue_hint(&self, event: &OutboundEvent) -> Option<u64> {
        self.inner.queue_hint(event)
    }
    fn is_healthy(&self) -> bool {
        self.inner.is_healthy()
    }
    fn shutdown(&self) {
        self.inner.shutdown()
    }
}

fn pct(sorted: &[i64], p: f64) -> i64 {
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

fn main() {
    let a = args();
    let db = format!("outbox_bench_sched_{:06x}", rand::random::<u32>() & 0xffffff);
    let server = Pool::new(Opts::from_url(SERVER).unwrap()).expect("MariaDB on 127.0.0.1:3306");
    server
        .get_conn()
        .unwrap()
        .query_drop(format!("CREATE DATABASE {db}"))
        .unwrap();
    let url = format!("{SERVER}/{db}");
    let result = std::panic::catch_unwind(|| run(&a, &url));
    server
        .get_conn()
        .unwrap()
        .query_drop(format!("DROP DATABASE IF EXISTS {db}"))
        .unwrap();
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

fn run(a: &Args, url: &str) {
    let pool = Pool::new(Opts::from_url(url).unwrap()).unwrap();
    outbox::migrate(&pool).unwrap();
    let mut cfg = Config::new(url);
    cfg.topic = format!("bench_sched_{:06x}", rand::random::<u32>() & 0xffffff);
    let t = Instant::now();
    let mut conn = pool.get_conn().unwrap();
    for start in (1..=a.scheduled).step_by(100_000) {
        let end = (start + 99_999).min(a.scheduled);
        conn.query_drop(format!(
            "INSERT INTO t_event_record (biz_no, event_type, payload, next_retry_time, event_key) \
             SELECT CONCAT('LATER-', seq), 'ORDER_TIMEOUT', '{{\"order\":1}}', NOW(3) + INTERVAL 1 DAY, UUID() \
             FROM seq_{start}_to_{end}"
        ))
        .unwrap();
    }
    for start in (1..=a.backlog).step_by(100_000) {
        let end = (start + 99_999).min(a.backlog);
        conn.query_drop(format!(
            "INSERT INTO t_event_record (biz_no, event_type, payload, next_retry_time, event_key) \
             SELECT CONCAT('NOW-', seq), 'ORDER_CREATED', '{{\"order\":1}}', NOW(3), UUID() FROM seq_{start}_to_{end}"
        ))
        .unwrap();
    }
    conn.query_drop("ANALYZE TABLE t_event_record").unwrap();
    println!(
        "seeded {} scheduled a day ahead and a backlog of {} due in {:.1} s",
        a.scheduled,
        a.backlog,
        t.elapsed().as_secs_f64()
    );

    // The scan, on one connection.
    let one = Pool::new(
        OptsBuilder::from_opts(Opts::from_url(url).unwrap()).pool_opts(
            PoolOpts::default()
                .with_constraints(PoolConstraints::new(1, 1).unwrap())
                .with_reset_connection(false),
        ),
    )
    .unwrap();
    let store = Store::new(one.clone(), &cfg, "bench-sched-000001".into());
    let sql = store.scan_sql(500, false);
    let mut c = one.get_conn().unwrap();
    let plan: mysql::Row = c.query_first(format!("EXPLAIN {sql}")).unwrap().unwrap();
    let (kind, key): (Option<String>, Option<String>) = (plan.get("type").unwrap(), plan.get("key").unwrap());
    let read = |c: &mut mysql::PooledConn| -> u64 {
        let rows: Vec<(String, String)> = c.query("SHOW SESSION STATUS LIKE 'Handler_read%'").unwrap();
        rows.iter().filter_map(|(_, v)| v.parse::<u64>().ok()).sum()
    };
    let before = read(&mut c);
    let t = Instant::now();
    let got: Vec<mysql::Row> = c.query(&sql).unwrap();
    let took = t.elapsed();
    let rows_read = read(&mut c) - before;
    println!(
        "due scan with {} scheduled for later: plan {} on {}, {} rows returned, {} rows read ({:.2} per row), {:.2} ms",
        a.scheduled,
        kind.unwrap_or_default(),
        key.unwrap_or_default(),
        got.len(),
        rows_read,
        rows_read as f64 / got.len().max(1) as f64,
        took.as_secs_f64() * 1e3
    );
    drop(c);

    // Lateness while the relay drains the backlog.
    let timed = Arc::new(Timed {
        inner: RocketMqPublisher::start(&cfg).expect("publisher (is the broker up? scripts/rocketmq start)"),
        acks: Mutex::new(Vec::new()),
        sent: Default::default(),
    });
    let relay = Relay::builder(cfg.clone()).publisher(timed.clone()).start().unwrap();
    let started = Instant::now();
    let first_due = now_ms() + 2_000;
    let step = a.spread_s * 1000 / a.probes;
    let mut w = pool.get_conn().unwrap();
    for i in 0..a.probes {
        let due = first_due + i * step;
        // Each probe is written a little before its time, as a service schedules ahead.
        while now_ms() + 1_000 < due {
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut tx = w.start_transaction(TxOpts::default()).unwrap();
        let e = NewEvent::new(format!("PROBE-{i}"), "ORDER_TIMEOUT", "{\"probe\":1}")
            .with_header(DUE_HEADER, due.to_string())
            .deliver_at(UNIX_EPOCH + Duration::from_millis(due));
        outbox::enqueue_in_tx(&mut tx, &e).unwrap();
        tx.commit().unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while timed.acks.lock().len() < a.probes as usize && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let elapsed = started.elapsed();
    let sent = timed.sent.load(std::sync::atomic::Ordering::Relaxed);
    let backlog_left: Option<u64> = w
        .query_first("SELECT COUNT(*) FROM t_event_record WHERE status = 'WAIT' AND biz_no LIKE 'NOW-%'")
        .unwrap();
    relay.stop(Duration::from_secs(10));
    let acks = timed.acks.lock().clone();
    assert_eq!(acks.len() as u64, a.probes, "probes acknowledged within 120 s");
    let mut late: Vec<i64> = acks.iter().map(|(due, at)| *at as i64 - *due as i64).collect();
    late.sort();
    let early = late.iter().filter(|l| **l < 0).count();
    println!(
        "{} probes over {} s with the backlog draining: ack − due p50 {} ms, p99 {} ms, max {} ms, sent before their time {} \
         (scan.interval.ms = {}); relay sent {} events in {:.1} s ({:.0}/s), {} of the backlog still waiting then",
        a.probes,
        a.spread_s,
        pct(&late, 0.5),
        pct(&late, 0.99),
        late[late.len() - 1],
        early,
        cfg.scan_interval.as_millis(),
        sent,
        elapsed.as_secs_f64(),
        sent as f64 / elapsed.as_secs_f64(),
        backlog_left.unwrap_or(0)
    );
    assert_eq!(early, 0, "a scheduled event was sent before its time");
}
