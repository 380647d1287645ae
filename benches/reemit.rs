//! Re-emit under live traffic (docs/scheduling.md#re-emitting-sent-events): a job re-emits a
//! million sent events at its configured rate while an order service keeps writing live events,
//! and the live events' commit → broker ack is measured before and during the job.
//!
//! 1. A fresh database gets N sent events (SUCCESS rows with an event key, `INSERT … SELECT` from
//!    MariaDB's sequence engine).
//! 2. One relay with its defaults and the RocketMQ publisher runs; a writer commits L live events
//!    per second, one per transaction, through the relay's `enqueue_in_tx` and `commit` (as an
//!    embedded service does: the commit wakes the relay). A wrapper around the publisher notes when the broker
//!    acknowledged each live event; its latency = ack − the row's `create_time` (the database's
//!    clock, on this machine).
//! 3. **Baseline**: the live events alone for B seconds: p50/p99.
//! 4. **Rates**: for each rate of the sweep, a job (`outbox::reemit`) re-emits S seconds' worth
//!    of sent events (their own event type) at that rate while the writer goes on: the live
//!    events' p50/p99 over the job against the baseline's.
//! 5. **A million**: a job re-emits all N at R per second: its achieved rate, the live events'
//!    p50/p99 over it, and when the relay had sent the last copy.
//!
//! `cargo bench --features rocketmq --bench reemit [-- --events N] [--rate R] [--live L]
//! [--baseline B] [--sweep 2000,5000,10000] [--sweep-seconds S] [--quick]` (defaults 1 000 000,
//! the library's default rate 1 000, 1 000, 15 s, 2 000/5 000/10 000 for 20 s each; `--quick`:
//! 100 000, 1 000, 1 000, 5 s, no sweep). Needs MariaDB on 127.0.0.1:3306 (root) and the name server and broker
//! (`scripts/rocketmq start`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use mysql::prelude::Queryable;
use mysql::{Opts, Pool, TxOpts};
use parking_lot::Mutex;

use outbox::reemit::{self, ReemitFilter, RunEnd};
use outbox::rocketmq::RocketMqPublisher;
use outbox::{Config, NewEvent, OutboundEvent, Publisher, Relay, SendOutcome};

const SERVER: &str = "mysql://root@127.0.0.1:3306";

struct Args {
    events: u64,
    rate: u32,
    live: u64,
    baseline_s: u64,
    sweep: Vec<u32>,
    sweep_s: u64,
}

fn args() -> Args {
    let mut a = Args {
        events: 1_000_000,
        rate: reemit::DEFAULT_RATE,
        live: 1_000,
        baseline_s: 15,
        sweep: vec![2_000, 5_000, 10_000],
        sweep_s: 20,
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
            "--events" => a.events = num("--events", it.next()),
            "--rate" => a.rate = num("--rate", it.next()) as u32,
            "--live" => a.live = num("--live", it.next()),
            "--baseline" => a.baseline_s = num("--baseline", it.next()),
            "--sweep" => {
                let v = it.next().unwrap_or_default();
                a.sweep = v
                    .split(',')
                    .filter(|r| !r.is_empty())
                    .map(|r| num("--sweep", Some(r.to_string())) as u32)
                    .collect();
            }
            "--sweep-seconds" => a.sweep_s = num("--sweep-seconds", it.next()),
            "--quick" => (a.events, a.baseline_s, a.sweep) = (100_000, 5, Vec::new()),
            "--bench" => {}
            other => panic!(
                "unknown argument {other:?} (--events N, --rate R, --live L, --baseline B, --sweep R1,R2, --sweep-seconds S, --quick)"
            ),
        }
    }
    a
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

/// The RocketMQ publisher, noting each live event's latency (ack − written) and counting copies:
/// every send, and the distinct (job, original) pairs, so a copy sent twice shows.
struct Timed {
    inner: RocketMqPublisher,
    /// (acked ms, latency ms) per live event.
    live: Mutex<Vec<(u64, i64)>>,
    /// Live events sent more than once.
    live_seen: Mutex<std::collections::HashSet<String>>,
    live_dups: AtomicU64,
    copies: AtomicU64,
    distinct: Mutex<std::collections::HashSet<(String, String)>>,
    last_copy_ms: AtomicU64,
}

impl Timed {
    fn distinct_copies(&self) -> u64 {
        self.distinct.lock().len() as u64
    }
}

impl Publisher for Timed {
    fn publish(&self, events: &[OutboundEvent], timeout: Duration) -> Vec<SendOutcome> {
        let out = self.inner.publish(events, timeout);
        let at = now_ms();
        for (e, o) in events.iter().zip(&out) {
            if !matches!(o, SendOutcome::Sent { .. }) {
                continue;
            }
            if let Some(of) = e.headers.get(outbox::wire::REEMIT_OF) {
                self.copies.fetch_add(1, Ordering::Relaxed);
                let job = e.headers.get(outbox::wire::REEMIT_JOB).cloned().unwrap_or_default();
                self.distinct.lock().insert((job, of.clone()));
                self.last_copy_ms.store(at, Ordering::Relaxed);
            } else if e.biz_no.starts_with("LIVE-") {
                if self.live_seen.lock().insert(e.biz_no.clone()) {
                    self.live.lock().push((at, at as i64 - e.created_ms as i64));
                } else {
                    self.live_dups.fetch_add(1, Ordering::Relaxed);
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
    if sorted.is_empty() {
        return -1;
    }
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

/// p50 and p99 of the live latencies acknowledged in `[from, to)` (ms since the epoch).
fn window(live: &[(u64, i64)], from: u64, to: u64) -> (usize, i64, i64) {
    let mut l: Vec<i64> = live
        .iter()
        .filter(|(at, _)| (from..to).contains(at))
        .map(|(_, l)| *l)
        .collect();
    l.sort();
    (l.len(), pct(&l, 0.5), pct(&l, 0.99))
}

fn main() {
    let a = args();
    let db = format!("outbox_bench_reemit_{:06x}", rand::random::<u32>() & 0xffffff);
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

fn seed(conn: &mut mysql::PooledConn, n: u64, event_type: &str) {
    for start in (1..=n).step_by(100_000) {
        let end = (start + 99_999).min(n);
        conn.query_drop(format!(
            "INSERT INTO t_event_record (biz_no, event_type, payload, status, sent_at, event_key, create_time) \
             SELECT CONCAT('PAST-', seq), '{event_type}', '{{\"order\":1,\"amount\":100,\"user\":42}}', 'SUCCESS', \
             NOW(3), UUID(), NOW(3) - INTERVAL 1 DAY FROM seq_{start}_to_{end}"
        ))
        .unwrap();
    }
}

/// Re-emits the sent events of `event_type` (`n` of them) at `rate` while the live writer runs;
/// prints the live latency over the job against the baseline's p99; waits until the relay sent
/// every copy of it.
/// What every job of a run shares.
struct Run<'a> {
    pool: &'a Pool,
    cfg: &'a Config,
    timed: &'a Timed,
    /// The baseline's live p99, ms.
    base99: i64,
    /// Live events written per second.
    live: u64,
}

fn job(r: &Run<'_>, event_type: &str, n: u64, rate: u32) {
    let Run {
        pool,
        cfg,
        timed,
        base99,
        live,
    } = *r;
    let filter = ReemitFilter {
        event_type: Some(event_type.into()),
        ..ReemitFilter::default()
    };
    let p = reemit::preview(pool, &cfg.table, &cfg.topic, &filter).unwrap();
    assert_eq!(p.matched, n);
    let before = timed.distinct_copies();
    let job = reemit::create(pool, &p, rate, "bench").unwrap();
    let t = Instant::now();
    let from = now_ms();
    let (j, end) = reemit::run(
        pool,
        &cfg.table,
        job.id,
        "bench-runner",
        &AtomicBool::new(false),
        |_| {},
    )
    .unwrap();
    let took = t.elapsed();
    let to = now_ms();
    assert_eq!((end, j.emitted), (RunEnd::Done, n));
    let deadline = Instant::now() + Duration::from_secs(120);
    while timed.distinct_copies() < before + n && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let copies = timed.distinct_copies() - before;
    let (rn, r50, r99) = window(&timed.live.lock(), from, to);
    println!(
        "re-emit of {n} at {rate}/s: done in {:.1} s ({:.0}/s), last copy sent {} ms after the job ended, {copies} distinct copies sent; \
         live events meanwhile ({live}/s written): {rn} acknowledged, commit → ack p50 {r50} ms, p99 {r99} ms ({:.2}× the baseline p99)",
        took.as_secs_f64(),
        n as f64 / took.as_secs_f64(),
        timed.last_copy_ms.load(Ordering::Relaxed).saturating_sub(to),
        r99 as f64 / base99.max(1) as f64,
    );
    assert_eq!(copies, n, "every copy sent within 120 s of the job's end");
}

fn run(a: &Args, url: &str) {
    let pool = Pool::new(Opts::from_url(url).unwrap()).unwrap();
    outbox::migrate(&pool).unwrap();
    let mut cfg = Config::new(url);
    cfg.topic = format!("bench_reemit_{:06x}", rand::random::<u32>() & 0xffffff);
    let t = Instant::now();
    let mut conn = pool.get_conn().unwrap();
    for r in &a.sweep {
        seed(&mut conn, u64::from(*r) * a.sweep_s, &format!("SWEEP_{r}"));
    }
    seed(&mut conn, a.events, "ORDER_PAID");
    conn.query_drop("ANALYZE TABLE t_event_record").unwrap();
    println!(
        "seeded {} sent events (and the sweep's) in {:.1} s",
        a.events,
        t.elapsed().as_secs_f64()
    );

    let timed = Arc::new(Timed {
        inner: RocketMqPublisher::start(&cfg).expect("publisher (is the broker up? scripts/rocketmq start)"),
        live: Mutex::new(Vec::new()),
        live_seen: Mutex::new(Default::default()),
        live_dups: AtomicU64::new(0),
        copies: AtomicU64::new(0),
        distinct: Mutex::new(Default::default()),
        last_copy_ms: AtomicU64::new(0),
    });
    let relay = Arc::new(Relay::builder(cfg.clone()).publisher(timed.clone()).start().unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (pool, stop, rate, relay) = (pool.clone(), stop.clone(), a.live, relay.clone());
        std::thread::spawn(move || {
            let mut c = pool.get_conn().unwrap();
            let started = Instant::now();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // As an embedded service writes: in its own transaction, then the relay's commit,
                // which wakes the relay.
                let mut tx = c.start_transaction(TxOpts::default()).unwrap();
                relay
                    .enqueue_in_tx(
                        &mut tx,
                        &NewEvent::new(format!("LIVE-{n}"), "ORDER_CREATED", "{\"order\":2}"),
                    )
                    .unwrap();
                relay.commit(tx).unwrap();
                n += 1;
                let due = Duration::from_secs_f64(n as f64 / rate as f64);
                if let Some(p) = due.checked_sub(started.elapsed()) {
                    std::thread::sleep(p);
                }
            }
            n
        })
    };
    // Warm up, then the baseline.
    std::thread::sleep(Duration::from_secs(2));
    let base_from = now_ms();
    std::thread::sleep(Duration::from_secs(a.baseline_s));
    let (bn, b50, b99) = window(&timed.live.lock(), base_from, now_ms());
    println!(
        "live events alone ({} s, {}/s written): {bn} acknowledged, commit → ack p50 {b50} ms, p99 {b99} ms",
        a.baseline_s, a.live
    );
    let run = Run {
        pool: &pool,
        cfg: &cfg,
        timed: &timed,
        base99: b99,
        live: a.live,
    };
    for r in &a.sweep {
        job(&run, &format!("SWEEP_{r}"), u64::from(*r) * a.sweep_s, *r);
    }
    job(&run, "ORDER_PAID", a.events, a.rate);
    stop.store(true, Ordering::Relaxed);
    let written = writer.join().unwrap();
    let Ok(relay) = Arc::try_unwrap(relay) else {
        panic!("the writer has ended: no other holder of the relay")
    };
    relay.stop(Duration::from_secs(10));
    let st = relay.stats();
    let copy_dups = timed.copies.load(Ordering::Relaxed) - timed.distinct_copies();
    let live_dups = timed.live_dups.load(Ordering::Relaxed);
    let explained = st.retried + st.possible_duplicates + st.reclaimed + st.stale_acks;
    println!(
        "{written} live events written in all; sent twice: {copy_dups} copies, {live_dups} live events; \
         the relay counted {} retried, {} possible duplicates (unknown outcomes), {} reclaimed, {} stale acks",
        st.retried, st.possible_duplicates, st.reclaimed, st.stale_acks
    );
    assert!(
        copy_dups + live_dups <= explained,
        "every duplicate is explained by a counted retry, unknown outcome or reclaim"
    );
}
