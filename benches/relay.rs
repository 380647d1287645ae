//! Benchmark harness: the relay against the real MariaDB and RocketMQ broker of this machine,
//! every compared configuration in the same run, side by side with the raw ceilings and the
//! seed's algorithm.
//!
//! `cargo bench --features rocketmq --bench relay [-- --quick | --big | --ordered]`
//!
//! `--ordered` runs only the per-key ordering comparison: the unordered drain, the ordered drain
//! with 20 hot keys and with 100 000 keys, commit-to-ack latency both ways, and the rows an
//! ordered claim round reads with 10 and 10 000 waiting events per key.
//!
//! Prints a table and writes `target/bench/results.csv` and `target/bench/throughput.svg`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mysql::prelude::Queryable;
use mysql::{Opts, Pool};
use parking_lot::Mutex;

use outbox::rocketmq::RocketMqPublisher;
use outbox::{ClaimStrategy, Config, NewEvent, OutboundEvent, Publisher, Relay, SendOutcome};

const SERVER: &str = "mysql://root@127.0.0.1:3306";
const NAMESRV: &str = "127.0.0.1:9876";

#[derive(Debug, Default, Clone)]
struct Row {
    name: String,
    group: &'static str,
    events: u64,
    secs: f64,
    eps: f64,
    p50_ms: Option<f64>,
    p99_ms: Option<f64>,
    max_ms: Option<f64>,
    stmts_per_event: Option<f64>,
    commits_per_event: Option<f64>,
    cpu_s_per_10k: Option<f64>,
    peak_rss_mb: Option<f64>,
    conflicts: Option<u64>,
    possible_dups: Option<u64>,
    note: String,
    /// Latency runs: every event's commit-to-ack time, sorted.
    samples: Vec<Duration>,
}

fn opt(v: Option<f64>, prec: usize) -> String {
    v.map(|x| format!("{x:.prec$}")).unwrap_or_else(|| "-".into())
}

// ---------------------------------------------------------------- measurement helpers

fn cpu_seconds() -> f64 {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

fn proc_status_kb(field: &str) -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Resets the peak-RSS mark (VmHWM) so each scenario reports its own peak.
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn peak_rss_mb() -> Option<f64> {
    proc_status_kb("VmHWM:").map(|kb| kb / 1024.0)
}

/// Server status counters of statements and commits.
fn db_counters(pool: &Pool) -> BTreeMap<String, u64> {
    let rows: Vec<(String, String)> = pool
        .get_conn()
        .unwrap()
        .query(
            "SHOW GLOBAL STATUS WHERE Variable_name IN ('Com_select','Com_update','Com_insert','Com_delete','Com_begin',\
             'Com_commit','Com_rollback','Handler_commit')",
        )
        .unwrap();
    rows.into_iter().map(|(k, v)| (k, v.parse().unwrap_or(0))).collect()
}

/// (statements, commits) between two snapshots, minus what the snapshots themselves cost.
fn db_delta(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> (u64, u64) {
    let d = |k: &str| after.get(k).unwrap_or(&0).saturating_sub(*before.get(k).unwrap_or(&0));
    let stmts = d("Com_select")
        + d("Com_update")
        + d("Com_insert")
        + d("Com_delete")
        + d("Com_begin")
        + d("Com_commit")
        + d("Com_rollback");
    // One SHOW (counted as Com_select? no: Com_show_status) per snapshot; nothing to subtract.
    (stmts, d("Handler_commit"))
}

fn pct(sorted: &[Duration], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    Some(sorted[i].as_secs_f64() * 1000.0)
}

// ---------------------------------------------------------------- fixtures

struct Db {
    name: String,
    url: String,
    pool: Pool,
}

impl Db {
    fn fresh(tag: &str) -> Db {
        let name = format!("outbox_bench_{tag}");
        let server = Pool::new(Opts::from_url(SERVER).unwrap()).unwrap();
        let mut c = server.get_conn().unwrap();
        c.query_drop(format!("DROP DATABASE IF EXISTS {name}")).unwrap();
        c.query_drop(format!("CREATE DATABASE {name}")).unwrap();
        let url = format!("{SERVER}/{name}");
        let pool = Pool::new(Opts::from_url(&url).unwrap()).unwrap();
        outbox::migrate(&pool).unwrap();
        Db { name, url, pool }
    }

    /// `n` due WAIT rows with ~200-byte JSON payloads, inserted in bulk (not measured).
    fn seed(&self, n: u64, status: &str) {
        self.seed_keyed(n, status, "CONCAT('ORD-', {done} + seq)")
    }

    /// [`Db::seed`] with the biz_no given by `key_sql` (`{done}` is the rows inserted before).
    fn seed_keyed(&self, n: u64, status: &str, key_sql: &str) {
        let mut c = self.pool.get_conn().unwrap();
        let mut done = 0;
        while done < n {
            let k = (n - done).min(1_000_000);
            let key = key_sql.replace("{done}", &done.to_string());
            c.query_drop(format!(
                "INSERT INTO t_event_record (biz_no, event_type, payload, status, event_key) \
                 SELECT {key}, 'ORDER_CREATED', \
                 CONCAT('{{\"order\":\"ORD-', {done} + seq, '\",\"amount_cents\":', seq, ',\"note\":\"', REPEAT('x', 140), '\"}}'), '{status}', UUID() \
                 FROM seq_1_to_{k}"
            ))
            .unwrap();
            done += k;
        }
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        if let Ok(p) = Pool::new(Opts::from_url(SERVER).unwrap()) {
            let _ = p
                .get_conn()
                .map(|mut c| c.query_drop(format!("DROP DATABASE IF EXISTS {}", self.name)));
        }
    }
}

fn base_config(db: &Db, topic: &str) -> Config {
    let mut c = Config::new(&db.url);
    c.topic = topic.into();
    c.rocketmq.namesrv = NAMESRV.into();
    c
}

fn topic(tag: &str) -> String {
    format!("BENCH_{tag}_{}", std::process::id())
}

fn dummy(topic: &str, i: u64) -> OutboundEvent {
    OutboundEvent {
        id: i,
        key: outbox::event::new_event_key(),
        biz_no: format!("ORD-{i}"),
        event_type: "ORDER_CREATED".into(),
        payload: format!(
            "{{\"order\":\"ORD-{i}\",\"amount_cents\":{i},\"note\":\"{}\"}}",
            "x".repeat(140)
        )
        .into_bytes(),
        topic: topic.into(),
        tag: None,
        headers: BTreeMap::new(),
        attempt: 0,
        created_ms: 0,
    }
}

/// Creates the topic (first send auto-creates it) so no scenario times route creation.
fn warm_topic(p: &RocketMqPublisher, topic: &str) {
    let mut last = None;
    for _ in 0..50 {
        match p.publish(&[dummy(topic, 0)], Duration::from_secs(3)).pop() {
            Some(SendOutcome::Sent { .. }) => return,
            other => last = other,
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("cannot send to topic {topic} (last: {last:?}): is the broker up (scripts/rocketmq start)?");
}

/// Per acked event: (commit to broker ack, commit to SUCCESS).
type Latencies = Arc<Mutex<Vec<outbox::Delivery>>>;

fn start_relays(cfg: &Config, instances: usize, latency: Option<Latencies>) -> Vec<Relay> {
    start_relays_with(cfg, instances, latency, |c| {
        Arc::new(RocketMqPublisher::start(c).unwrap()) as Arc<dyn Publisher>
    })
}

fn start_relays_with(
    cfg: &Config,
    instances: usize,
    latency: Option<Latencies>,
    publisher: impl Fn(&Config) -> Arc<dyn Publisher>,
) -> Vec<Relay> {
    (0..instances)
        .map(|i| {
            let mut c = cfg.clone();
            c.instance_id = Some(format!("bench-{i}-{:06x}", std::process::id() & 0xffffff));
            let mut b = Relay::builder(c.clone()).publisher(publisher(&c));
            if let Some(l) = &latency {
                let l = l.clone();
                b = b.latency_hook(move |d| l.lock().push(*d));
            }
            b.start().unwrap()
        })
        .collect()
}

/// Acks every event at once: what the relay's database side alone can do.
struct NoBroker;

impl Publisher for NoBroker {
    fn publish(&self, events: &[OutboundEvent], _timeout: Duration) -> Vec<SendOutcome> {
        vec![SendOutcome::Sent { msg_id: None }; events.len()]
    }
}

fn sent(relays: &[Relay]) -> u64 {
    relays.iter().map(|r| r.counters().sent).sum()
}

// ---------------------------------------------------------------- scenarios

/// Raw broker sends through the publisher: no database.
fn ceiling_broker(name: &str, senders: usize, batch: usize, total: u64) -> Row {
    let t = topic("raw");
    let mut cfg = Config::new("mysql://unused@127.0.0.1/none");
    cfg.rocketmq.namesrv = NAMESRV.into();
    let p = Arc::new(RocketMqPublisher::start(&cfg).unwrap());
    warm_topic(&p, &t);
    let next = Arc::new(AtomicU64::new(0));
    let ok = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let cpu0 = cpu_seconds();
    let handles: Vec<_> = (0..senders)
        .map(|_| {
            let (p, next, ok, t) = (p.clone(), next.clone(), ok.clone(), t.clone());
            std::thread::spawn(move || loop {
                let from = next.fetch_add(batch as u64, Relaxed);
                if from >= total {
                    return;
                }
                let n = (total - from).min(batch as u64);
                let events: Vec<_> = (from..from + n).map(|i| dummy(&t, i + 1)).collect();
                let out = p.publish(&events, Duration::from_secs(3));
                ok.fetch_add(
                    out.iter().filter(|o| matches!(o, SendOutcome::Sent { .. })).count() as u64,
                    Relaxed,
                );
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let secs = started.elapsed().as_secs_f64();
    p.shutdown();
    let n = ok.load(Relaxed);
    Row {
        name: name.into(),
        group: "ceiling",
        events: n,
        secs,
        eps: n as f64 / secs,
        cpu_s_per_10k: Some((cpu_seconds() - cpu0) * 10_000.0 / n.max(1) as f64),
        note: format!("{senders} sender(s), {batch} per send, no DB"),
        ..Default::default()
    }
}

/// Raw DB commits of the outbox INSERT, one event per transaction, no relay.
fn ceiling_db(writers: usize, total: u64) -> Row {
    let db = Db::fresh("rawdb");
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let handles: Vec<_> = (0..writers)
        .map(|_| {
            let (pool, next) = (db.pool.clone(), next.clone());
            std::thread::spawn(move || {
                let mut c = pool.get_conn().unwrap();
                while next.fetch_add(1, Relaxed) < total {
                    let mut tx = c.start_transaction(mysql::TxOpts::default()).unwrap();
                    outbox::enqueue_in_tx(&mut tx, &NewEvent::new("ORD-1", "ORDER_CREATED", dummy("T", 1).payload))
                        .unwrap();
                    tx.commit().unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let secs = started.elapsed().as_secs_f64();
    Row {
        name: format!("raw DB commits ({writers} writers)"),
        group: "ceiling",
        events: total,
        secs,
        eps: total as f64 / secs,
        note: "INSERT + COMMIT per event, no relay".into(),
        ..Default::default()
    }
}

/// Drains a pre-seeded backlog of `n` events with `instances` relays configured by `tune`.
fn drain(name: &str, tag: &str, n: u64, instances: usize, tune: impl Fn(&mut Config)) -> Row {
    drain_with(name, tag, n, instances, tune, true)
}

/// [`drain`], through the broker or (`broker = false`) through [`NoBroker`].
fn drain_with(name: &str, tag: &str, n: u64, instances: usize, tune: impl Fn(&mut Config), broker: bool) -> Row {
    drain_seeded(name, tag, n, instances, tune, broker, |db| db.seed(n, "WAIT"))
}

/// An ordered drain (`ordering = per-biz-no`) of `n` events over `keys` keys: `hot` spreads them
/// evenly (key = row number modulo keys, interleaved as concurrent orders would be), else each
/// row picks a key at random (about n / keys per key, some more, some fewer).
fn drain_ordered(name: &str, tag: &str, n: u64, keys: u64, hot: bool) -> Row {
    drain_ordered_with(name, tag, n, keys, hot, outbox::SentRows::Delete)
}

/// [`drain_ordered`] with `sent.rows` given (the default deletes sent rows).
fn drain_ordered_with(name: &str, tag: &str, n: u64, keys: u64, hot: bool, sent_rows: outbox::SentRows) -> Row {
    let key_sql = if hot {
        format!("CONCAT('KEY-', seq % {keys})")
    } else {
        format!("CONCAT('KEY-', FLOOR(RAND({{done}} + seq) * {keys}))")
    };
    let mut row = drain_seeded(
        name,
        tag,
        n,
        1,
        |c| {
            c.ordering = outbox::config::Ordering::PerBizNo;
            c.sent_rows = sent_rows;
        },
        true,
        |db| db.seed_keyed(n, "WAIT", &key_sql),
    );
    row.group = "ordered";
    row
}

fn drain_seeded(
    name: &str,
    tag: &str,
    n: u64,
    instances: usize,
    tune: impl Fn(&mut Config),
    broker: bool,
    seed: impl FnOnce(&Db),
) -> Row {
    let db = Db::fresh(tag);
    let t = topic(tag);
    let mut cfg = base_config(&db, &t);
    tune(&mut cfg);
    if broker {
        let p = RocketMqPublisher::start(&cfg).unwrap();
        warm_topic(&p, &t);
    }
    seed(&db);
    reset_peak_rss();
    let before = db_counters(&db.pool);
    let cpu0 = cpu_seconds();
    let started = Instant::now();
    let relays = if broker {
        start_relays(&cfg, instances, None)
    } else {
        start_relays_with(&cfg, instances, None, |_| Arc::new(NoBroker) as Arc<dyn Publisher>)
    };
    let deadline = Instant::now() + Duration::from_secs(900);
    while sent(&relays) < n && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let secs = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    let stats: Vec<_> = relays.iter().map(|r| r.counters()).collect();
    let after = db_counters(&db.pool);
    for r in &relays {
        r.stop(Duration::from_secs(10));
    }
    let done = stats.iter().map(|s| s.sent).sum::<u64>();
    let (stmts, commits) = db_delta(&before, &after);
    let mut row = Row {
        name: name.into(),
        group: if broker { "drain" } else { "ceiling" },
        events: done,
        secs,
        eps: done as f64 / secs,
        stmts_per_event: Some(stmts as f64 / done.max(1) as f64),
        commits_per_event: Some(commits as f64 / done.max(1) as f64),
        cpu_s_per_10k: Some(cpu * 10_000.0 / done.max(1) as f64),
        peak_rss_mb: peak_rss_mb(),
        conflicts: Some(stats.iter().map(|s| s.claim_conflicts).sum()),
        possible_dups: Some(stats.iter().map(|s| s.stale_acks + s.reclaimed).sum()),
        ..Default::default()
    };
    if done < n {
        row.note = format!("only {done} of {n} within the deadline");
    }
    row
}

/// The seed's defaults (scan every 5 s, batch 20, per-row, one sender): events/s over `secs`.
fn seed_defaults(secs: u64) -> Row {
    let db = Db::fresh("seed_defaults");
    let t = topic("seed_defaults");
    let mut cfg = Config::seed_compatible(&db.url);
    cfg.topic = t.clone();
    cfg.rocketmq.namesrv = NAMESRV.into();
    {
        let p = RocketMqPublisher::start(&cfg).unwrap();
        warm_topic(&p, &t);
    }
    db.seed(1000, "WAIT");
    let before = db_counters(&db.pool);
    let started = Instant::now();
    let relays = start_relays(&cfg, 1, None);
    std::thread::sleep(Duration::from_secs(secs));
    let done = sent(&relays);
    let after = db_counters(&db.pool);
    let el = started.elapsed().as_secs_f64();
    for r in &relays {
        r.stop(Duration::from_secs(10));
    }
    let (stmts, commits) = db_delta(&before, &after);
    Row {
        name: "seed defaults (scan 5 s, batch 20)".into(),
        group: "seed",
        events: done,
        secs: el,
        eps: done as f64 / el,
        stmts_per_event: Some(stmts as f64 / done.max(1) as f64),
        commits_per_event: Some(commits as f64 / done.max(1) as f64),
        note: format!("backlog of 1000, measured for {secs} s"),
        ..Default::default()
    }
}

/// Commit-to-ack latency at a fixed offered load, with the fast path (notify after commit) or
/// without it (the scan alone).
fn latency(rate: u64, secs: u64, fast_path: bool) -> Row {
    latency_with(rate, secs, fast_path, None)
}

/// How the events of the ordered latency runs share keys.
#[derive(Clone, Copy)]
enum KeyShape {
    /// Each writer cycles over 100 keys: a key's events come 100 commits apart (0.4 s at
    /// 1 000/s over 4 writers), like an order's created, paid, shipped.
    Spread,
    /// Each key gets 4 events back to back (4 ms apart at 1 000/s): every event but the first
    /// waits for the one before it to be acked.
    Burst,
}

/// [`latency`]; `ordered`: `ordering = per-biz-no` with keys shared as [`KeyShape`] says.
fn latency_with(rate: u64, secs: u64, fast_path: bool, ordered: Option<KeyShape>) -> Row {
    let tag = match (fast_path, ordered) {
        (true, None) => "lat_fast",
        (false, None) => "lat_scan",
        (true, Some(KeyShape::Spread)) => "lat_fast_ord_spread",
        (true, Some(KeyShape::Burst)) => "lat_fast_ord_burst",
        (false, Some(_)) => "lat_scan_ordered",
    };
    let db = Db::fresh(tag);
    let t = topic(tag);
    let mut cfg = base_config(&db, &t);
    if ordered.is_some() {
        cfg.ordering = outbox::config::Ordering::PerBizNo;
    }
    {
        let p = RocketMqPublisher::start(&cfg).unwrap();
        warm_topic(&p, &t);
    }
    let lat = Arc::new(Mutex::new(Vec::new()));
    let publisher = Arc::new(RocketMqPublisher::start(&cfg).unwrap());
    let relays = Arc::new(start_relays_with(&cfg, 1, Some(lat.clone()), |_| {
        publisher.clone() as Arc<dyn Publisher>
    }));
    let writers = 4u64;
    let total = rate * secs;
    let started = Instant::now();
    let handles: Vec<_> = (0..writers)
        .map(|w| {
            let (pool, relays) = (db.pool.clone(), relays.clone());
            std::thread::spawn(move || {
                let mut c = pool.get_conn().unwrap();
                let per = total / writers;
                let interval = Duration::from_secs_f64(writers as f64 / rate as f64);
                let t0 = Instant::now() + Duration::from_micros(w * 250);
                for i in 0..per {
                    let due = t0 + interval * i as u32;
                    if let Some(d) = due.checked_duration_since(Instant::now()) {
                        std::thread::sleep(d);
                    }
                    let mut tx = c.start_transaction(mysql::TxOpts::default()).unwrap();
                    relays[0]
                        .enqueue_in_tx(
                            &mut tx,
                            &NewEvent::new(
                                match ordered {
                                    None => format!("ORD-{w}-{i}"),
                                    Some(KeyShape::Spread) => format!("ORD-{w}-{}", i % 100),
                                    Some(KeyShape::Burst) => format!("ORD-{w}-{}", i / 4),
                                },
                                "ORDER_CREATED",
                                dummy("T", i).payload,
                            ),
                        )
                        .unwrap();
                    if fast_path {
                        relays[0].commit(tx).unwrap();
                    } else {
                        tx.commit().unwrap();
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let offered_secs = started.elapsed().as_secs_f64();
    let deadline = Instant::now() + Duration::from_secs(60);
    while sent(&relays) < total && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let c = relays[0].counters();
    let per = |n: u64| c.sent as f64 / n.max(1) as f64;
    let (per_round, per_call, per_request) = (per(c.claim_rounds), per(c.publish_calls), per(publisher.requests()));
    for r in relays.iter() {
        r.stop(Duration::from_secs(10));
    }
    // Where the time goes: commit to the claim (the scanner), then the claim to the ack (the
    // dispatch, the worker queue and the send).
    let sorted = |f: &dyn Fn(&outbox::Delivery) -> Duration| {
        let mut v: Vec<Duration> = lat.lock().iter().map(f).collect();
        v.sort_unstable();
        v
    };
    let l = sorted(&|d| d.to_broker);
    let to_success = sorted(&|d| d.to_success);
    let to_claim = sorted(&|d| d.to_success.saturating_sub(d.held));
    let claim_to_ack = sorted(&|d| d.to_broker.saturating_sub(d.to_success.saturating_sub(d.held)));
    Row {
        name: format!(
            "latency @ {rate}/s, {}{}",
            if fast_path {
                "fast path (notify)"
            } else {
                "scan only (1 s)"
            },
            match ordered {
                None => "",
                Some(KeyShape::Spread) => ", ordered, a key's events 0.4 s apart",
                Some(KeyShape::Burst) => ", ordered, 4 events per key back to back",
            }
        ),
        group: "latency",
        events: l.len() as u64,
        secs: offered_secs,
        eps: total as f64 / offered_secs,
        p50_ms: pct(&l, 0.5),
        p99_ms: pct(&l, 0.99),
        max_ms: pct(&l, 1.0),
        note: format!(
            "commit (create_time) to broker ack; to claim p50 {} p99 {}, claim to ack p50 {} p99 {}, to SUCCESS p50 {} p99 {} ms; \
             events per claim round {per_round:.1}, per publish call {per_call:.1}, per broker request {per_request:.1}",
            opt(pct(&to_claim, 0.5), 1),
            opt(pct(&to_claim, 0.99), 1),
            opt(pct(&claim_to_ack, 0.5), 1),
            opt(pct(&claim_to_ack, 0.99), 1),
            opt(pct(&to_success, 0.5), 1),
            opt(pct(&to_success, 0.99), 1)
        ),
        samples: l,
        ..Default::default()
    }
}

/// Writers insert flat out while the relay runs: does it keep up with the DB's own ceiling?
fn live(writers: usize, secs: u64) -> Row {
    live_with(writers, secs, None)
}

/// [`live`]; `hot_keys`: ordered (`per-biz-no`), every writer's events over that many keys.
fn live_with(writers: usize, secs: u64, hot_keys: Option<u64>) -> Row {
    let tag = if hot_keys.is_some() { "live_ordered" } else { "live" };
    let db = Db::fresh(tag);
    let t = topic(tag);
    let mut cfg = base_config(&db, &t);
    if hot_keys.is_some() {
        cfg.ordering = outbox::config::Ordering::PerBizNo;
    }
    {
        let p = RocketMqPublisher::start(&cfg).unwrap();
        warm_topic(&p, &t);
    }
    let relays = Arc::new(start_relays(&cfg, 1, None));
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let handles: Vec<_> = (0..writers)
        .map(|w| {
            let (pool, relays, stop, written) = (db.pool.clone(), relays.clone(), stop.clone(), written.clone());
            std::thread::spawn(move || {
                let mut c = pool.get_conn().unwrap();
                let mut i = 0u64;
                while !stop.load(Relaxed) {
                    let mut tx = c.start_transaction(mysql::TxOpts::default()).unwrap();
                    relays[0]
                        .enqueue_in_tx(
                            &mut tx,
                            &NewEvent::new(
                                match hot_keys {
                                    Some(k) => format!("KEY-{}", i % k),
                                    None => format!("ORD-{w}-{i}"),
                                },
                                "ORDER_CREATED",
                                dummy("T", i).payload,
                            ),
                        )
                        .unwrap();
                    relays[0].commit(tx).unwrap();
                    written.fetch_add(1, Relaxed);
                    i += 1;
                }
            })
        })
        .collect();
    let mut max_lag = 0u64;
    while started.elapsed() < Duration::from_secs(secs) {
        std::thread::sleep(Duration::from_millis(100));
        max_lag = max_lag.max(written.load(Relaxed).saturating_sub(sent(&relays)));
    }
    stop.store(true, Relaxed);
    for h in handles {
        h.join().unwrap();
    }
    let total = written.load(Relaxed);
    let wrote_in = started.elapsed().as_secs_f64();
    let end = Instant::now();
    while sent(&relays) < total && end.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let catch_up = end.elapsed().as_secs_f64();
    for r in relays.iter() {
        r.stop(Duration::from_secs(10));
    }
    Row {
        name: match hot_keys {
            Some(k) => format!("live: {writers} writers flat out + relay, ordered, {k} hot keys"),
            None => format!("live: {writers} writers flat out + relay"),
        },
        group: "live",
        events: total,
        secs: wrote_in,
        eps: total as f64 / wrote_in,
        note: format!("max backlog {max_lag} events; caught up {catch_up:.2} s after the last commit"),
        ..Default::default()
    }
}

/// Rows the scan reads, at growing numbers of SUCCESS rows in the table.
fn scan_rows_examined(sizes: &[u64]) -> Vec<(u64, u64, String)> {
    let db = Db::fresh("scanflat");
    let mut have = 0;
    let cfg = base_config(&db, "T");
    let store = outbox::store::Store::new(db.pool.clone(), &cfg, "bench-scan".into());
    db.seed(100, "WAIT");
    let mut out = Vec::new();
    for &size in sizes {
        if size > have {
            db.seed(size - have, "SUCCESS");
            have = size;
        }
        let mut c = db.pool.get_conn().unwrap();
        c.query_drop("FLUSH STATUS").unwrap();
        let _: Vec<mysql::Row> = c.query(store.scan_sql(100, false)).unwrap();
        let reads: Vec<(String, u64)> = c
            .query("SHOW SESSION STATUS WHERE Variable_name IN ('Handler_read_next','Handler_read_key','Handler_read_rnd_next','Handler_read_first')")
            .unwrap();
        let plan: Vec<mysql::Row> = c.query(format!("EXPLAIN {}", store.scan_sql(100, true))).unwrap();
        let ty: Option<String> = plan[0].get("type").unwrap();
        let key: Option<String> = plan[0].get("key").unwrap();
        out.push((
            size,
            reads.iter().map(|(_, n)| n).sum(),
            format!("{} on {}", ty.unwrap_or_default(), key.unwrap_or_default()),
        ));
    }
    out
}

/// Rows one ordered claim round reads (every `Handler_read_%`), with 20 keys and `per_key`
/// waiting events each: the first round (100 candidates, all claimable) and the next (all
/// blocked behind the runs in flight).
fn ordered_rows_read(per_key: u64) -> (u64, u64) {
    let db = Db::fresh(&format!("ordrows_{per_key}"));
    db.seed_keyed(20 * per_key, "WAIT", "CONCAT('KEY-', seq % 20)");
    let mut c = db.pool.get_conn().unwrap();
    c.query_drop("ANALYZE TABLE t_event_record").unwrap();
    let mut cfg = base_config(&db, "T");
    cfg.ordering = outbox::config::Ordering::PerBizNo;
    let opts = mysql::OptsBuilder::from_opts(Opts::from_url(&db.url).unwrap()).pool_opts(
        mysql::PoolOpts::default()
            .with_constraints(mysql::PoolConstraints::new(1, 1).unwrap())
            .with_reset_connection(false),
    );
    let store = outbox::store::Store::new(Pool::new(opts).unwrap(), &cfg, "bench-ordrows".into());
    let reads = |store: &outbox::store::Store| -> u64 {
        let rows: Vec<(String, String)> = store
            .pool()
            .get_conn()
            .unwrap()
            .query("SHOW SESSION STATUS LIKE 'Handler_read%'")
            .unwrap();
        rows.iter().filter_map(|(_, v)| v.parse::<u64>().ok()).sum()
    };
    let r0 = reads(&store);
    store.claim_ordered(100, 128).unwrap();
    let r1 = reads(&store);
    store.claim_ordered(100, 128).unwrap();
    let r2 = reads(&store);
    (r1 - r0, r2 - r1)
}

/// Drains a large backlog while sampling RSS: memory must stay flat.
fn big_backlog(n: u64) -> Row {
    let sampling = Arc::new(AtomicBool::new(true));
    let samples = Arc::new(Mutex::new(Vec::new()));
    let (s2, smp) = (sampling.clone(), samples.clone());
    let sampler = std::thread::spawn(move || {
        while s2.load(Relaxed) {
            if let Some(kb) = proc_status_kb("VmRSS:") {
                smp.lock().push(kb / 1024.0);
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    });
    let mut row = drain(&format!("drain {n} backlog (defaults)"), "big", n, 1, |_| {});
    sampling.store(false, Relaxed);
    sampler.join().unwrap();
    let s = samples.lock();
    let (first, max) = (s.first().copied().unwrap_or(0.0), s.iter().cloned().fold(0.0, f64::max));
    row.group = "memory";
    row.note = format!(
        "RSS sampled every 0.5 s: start {first:.0} MB, max {max:.0} MB over {} samples",
        s.len()
    );
    row
}

// ---------------------------------------------------------------- output

/// Per mode, over rounds of `per_round` rows taking turns: the p99 of each round, of all its
/// events pooled, and its ratio to the unordered mode (the first of each round).
fn print_latency_rounds(rows: &[Row], per_round: usize) {
    println!("\ncommit -> ack at 1000/s, rounds taking turns:");
    // Each mode's events over all its rounds, sorted; the unordered mode is the first.
    let pooled: Vec<Vec<Duration>> = (0..per_round)
        .map(|m| {
            let mut v: Vec<Duration> = rows
                .iter()
                .skip(m)
                .step_by(per_round)
                .flat_map(|r| r.samples.iter().copied())
                .collect();
            v.sort_unstable();
            v
        })
        .collect();
    let unordered_p99 = pct(&pooled[0], 0.99).unwrap_or(f64::NAN);
    for (m, events) in pooled.iter().enumerate() {
        let per: Vec<String> = rows
            .iter()
            .skip(m)
            .step_by(per_round)
            .map(|r| opt(r.p99_ms, 1))
            .collect();
        let ratios: Vec<String> = rows
            .chunks(per_round)
            .map(|round| match (round[m].p99_ms, round[0].p99_ms) {
                (Some(o), Some(u)) => format!("{:.2}", o / u),
                _ => "-".into(),
            })
            .collect();
        let p99 = pct(events, 0.99);
        println!(
            "  {:<66} p99 per round [{}] ms, pooled p50 {} p99 {} ms = {:.2}x unordered (per round [{}])",
            rows[m].name,
            per.join(", "),
            opt(pct(events, 0.5), 1),
            opt(p99, 1),
            p99.unwrap_or(f64::NAN) / unordered_p99,
            ratios.join(", ")
        );
    }
}

fn print_table(rows: &[Row]) {
    println!(
        "\n{:<48} {:>8} {:>9} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9} {:>8} {:>7} {:>6}  note",
        "scenario",
        "events",
        "events/s",
        "p50 ms",
        "p99 ms",
        "max ms",
        "stmt/evt",
        "cmt/evt",
        "cpu s/10k",
        "RSS MB",
        "confl",
        "dups?"
    );
    for r in rows {
        println!(
            "{:<48} {:>8} {:>9.0} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9} {:>8} {:>7} {:>6}  {}",
            r.name,
            r.events,
            r.eps,
            opt(r.p50_ms, 1),
            opt(r.p99_ms, 1),
            opt(r.max_ms, 1),
            opt(r.stmts_per_event, 3),
            opt(r.commits_per_event, 3),
            opt(r.cpu_s_per_10k, 2),
            opt(r.peak_rss_mb, 0),
            r.conflicts.map(|c| c.to_string()).unwrap_or_else(|| "-".into()),
            r.possible_dups.map(|c| c.to_string()).unwrap_or_else(|| "-".into()),
            r.note
        );
    }
}

fn write_csv(rows: &[Row], path: &std::path::Path) {
    let mut s = String::from("group,scenario,events,secs,events_per_s,p50_ms,p99_ms,max_ms,stmts_per_event,commits_per_event,cpu_s_per_10k,peak_rss_mb,conflicts,possible_dups,note\n");
    for r in rows {
        let _ = writeln!(
            s,
            "{},\"{}\",{},{:.3},{:.1},{},{},{},{},{},{},{},{},{},\"{}\"",
            r.group,
            r.name,
            r.events,
            r.secs,
            r.eps,
            opt(r.p50_ms, 2),
            opt(r.p99_ms, 2),
            opt(r.max_ms, 2),
            opt(r.stmts_per_event, 4),
            opt(r.commits_per_event, 4),
            opt(r.cpu_s_per_10k, 3),
            opt(r.peak_rss_mb, 1),
            r.conflicts.map(|c| c.to_string()).unwrap_or_default(),
            r.possible_dups.map(|c| c.to_string()).unwrap_or_default(),
            r.note.replace('"', "'")
        );
    }
    std::fs::write(path, s).unwrap();
}

/// A horizontal bar chart of events/s, log scale, as SVG.
fn write_svg(rows: &[Row], path: &std::path::Path) {
    let rows: Vec<&Row> = rows.iter().filter(|r| r.eps > 0.0 && r.group != "latency").collect();
    let (w, bar, left) = (1000.0, 22.0, 380.0);
    let h = 40.0 + rows.len() as f64 * (bar + 6.0);
    let max = rows.iter().map(|r| r.eps).fold(1.0, f64::max).log10().ceil();
    let x = |v: f64| left + (v.max(1.0).log10() / max) * (w - left - 90.0);
    let mut s = format!(
        "<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}' font-family='sans-serif' font-size='12'>\
         <text x='10' y='20' font-size='14'>events/s (log scale), this machine, one run</text>"
    );
    for (i, r) in rows.iter().enumerate() {
        let y = 34.0 + i as f64 * (bar + 6.0);
        let color = match r.group {
            "ceiling" => "#888",
            "seed" => "#c44",
            _ => "#36c",
        };
        let _ = write!(
            s,
            "<text x='{}' y='{}' text-anchor='end'>{}</text><rect x='{left}' y='{y}' width='{}' height='{bar}' fill='{color}'/>\
             <text x='{}' y='{}'>{:.0}</text>",
            left - 6.0,
            y + 15.0,
            r.name.replace('&', "and").replace('<', "(").replace('>', ")"),
            x(r.eps) - left,
            x(r.eps) + 4.0,
            y + 15.0,
            r.eps
        );
    }
    s.push_str("</svg>\n");
    std::fs::write(path, s).unwrap();
}

/// One publish call's time, ordered (`k` events, each to another queue) against unordered (`k`
/// events as one batch), with nothing else running: what a call over `k` queues costs.
fn call_cost() {
    for ordered in [false, true] {
        let tag = if ordered { "calls_ord" } else { "calls" };
        let db = Db::fresh(tag);
        let t = topic(tag);
        let mut cfg = base_config(&db, &t);
        if ordered {
            cfg.ordering = outbox::config::Ordering::PerBizNo;
        }
        let p = RocketMqPublisher::start(&cfg).unwrap();
        warm_topic(&p, &t);
        // The ordered topic's stable queue set, as the publisher hashes keys over it.
        let queues: usize = if ordered {
            db.pool
                .get_conn()
                .unwrap()
                .exec_first("SELECT COUNT(*) FROM outbox_topic_queue WHERE topic = ?", (&t,))
                .unwrap()
                .unwrap()
        } else {
            8
        };
        for k in [1usize, 2, 4, 8].into_iter().filter(|&k| k <= queues) {
            // Keys of k different queues of the topic.
            let mut keys: Vec<String> = Vec::new();
            let mut used = std::collections::HashSet::new();
            for i in 0.. {
                let key = format!("KEY-{i}");
                if used.insert(outbox::ordering::queue_index(&key, queues)) {
                    keys.push(key);
                }
                if keys.len() == k {
                    break;
                }
            }
            let requests = p.requests();
            let mut times = Vec::new();
            for round in 0..300u64 {
                let events: Vec<OutboundEvent> = keys
                    .iter()
                    .enumerate()
                    .map(|(j, key)| OutboundEvent {
                        biz_no: key.clone(),
                        ..dummy(&t, round * 8 + j as u64)
                    })
                    .collect();
                let start = Instant::now();
                let out = p.publish(&events, Duration::from_secs(3));
                times.push(start.elapsed());
                assert!(out.iter().all(|o| matches!(o, SendOutcome::Sent { .. })), "{out:?}");
            }
            times.sort_unstable();
            eprintln!(
                "  {:<9} call of {k} events: p50 {} p99 {} ms, {:.1} requests per call",
                if ordered { "ordered" } else { "unordered" },
                opt(pct(&times, 0.5), 2),
                opt(pct(&times, 0.99), 2),
                (p.requests() - requests) as f64 / 300.0
            );
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--calls") {
        call_cost();
        return;
    }
    let quick = args.iter().any(|a| a == "--quick");
    let big = args.iter().any(|a| a == "--big");
    let only_ordered = args.iter().any(|a| a == "--ordered");
    if args.iter().any(|a| a == "--latency") {
        // Commit-to-ack latency alone, unordered and ordered, in `--rounds N` (default 3) rounds
        // that take turns (unordered, spread, burst, unordered, ...), so that every mode meets the
        // same spells of a busy machine; each mode's p99 is then taken over all its rounds.
        let rounds: usize = args
            .iter()
            .position(|a| a == "--rounds")
            .and_then(|i| args.get(i + 1))
            .map(|v| v.parse().unwrap_or_else(|_| panic!("--rounds: not a number: {v}")))
            .unwrap_or(3);
        let shapes = [None, Some(KeyShape::Spread), Some(KeyShape::Burst)];
        let mut rows = Vec::new();
        for round in 1..=rounds {
            for shape in shapes {
                let r = latency_with(1000, if quick { 5 } else { 10 }, true, shape);
                eprintln!(
                    "  [{round}/{rounds}] {:<70} p50 {} p99 {} ms\n    {}",
                    r.name,
                    opt(r.p50_ms, 1),
                    opt(r.p99_ms, 1),
                    r.note
                );
                rows.push(r);
            }
        }
        print_table(&rows);
        print_latency_rounds(&rows, shapes.len());
        return;
    }
    let n: u64 = if quick { 20_000 } else { 60_000 };
    let _ = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).try_init();
    let mut rows = Vec::new();
    let mut run = |r: Row| {
        eprintln!("  {:<48} {:>9.0} events/s {}", r.name, r.eps, r.note);
        rows.push(r);
    };
    // Per-key ordering against the unordered drain of the same run.
    let ordered_rows = {
        eprintln!("per-key ordering");
        let defaults = Config::default();
        run(drain(
            &format!(
                "defaults ({:?}, batch {}, {} workers)",
                defaults.claim_strategy, defaults.batch_size, defaults.workers
            ),
            "defaults",
            n,
            1,
            |_| {},
        ));
        run(drain_ordered(
            &format!("ordered: 20 hot keys x {}", n / 20),
            "ord_hot",
            n,
            20,
            true,
        ));
        run(drain_ordered_with(
            &format!("ordered: 20 hot keys x {}, sent rows kept", n / 20),
            "ord_hot_keep",
            n,
            20,
            true,
            outbox::SentRows::Keep,
        ));
        let many = if quick { 50_000 } else { 100_000 };
        run(drain_ordered(
            &format!("ordered: {many} keys x ~2 (random)"),
            "ord_many",
            many * 2,
            many,
            false,
        ));
        if only_ordered {
            // (The full run measures this ceiling with the others.)
            run(ceiling_db(4, n / 4));
        }
        run(live_with(4, if quick { 5 } else { 10 }, None));
        run(live_with(4, if quick { 5 } else { 10 }, Some(20)));
        run(latency_with(1000, if quick { 5 } else { 10 }, true, None));
        run(latency_with(
            1000,
            if quick { 5 } else { 10 },
            true,
            Some(KeyShape::Spread),
        ));
        run(latency_with(
            1000,
            if quick { 5 } else { 10 },
            true,
            Some(KeyShape::Burst),
        ));
        [10, 10_000].map(|per_key| (per_key, ordered_rows_read(per_key)))
    };
    let print_ordered = |rows: &[Row]| {
        println!("\nordered claim round, rows read (Handler_read_*), 20 keys, 100 candidates:");
        for (per_key, (first, second)) in &ordered_rows {
            println!(
                "  {per_key:>6} waiting per key: {first:>5} rows (round that claims 100), {second:>5} rows (next round, blocked by the runs in flight)"
            );
        }
        let eps = |name: &str| rows.iter().find(|r| r.name.starts_with(name)).map(|r| r.eps);
        if let Some(unordered) = eps("defaults (") {
            for r in rows.iter().filter(|r| r.group == "ordered") {
                println!(
                    "  {:<40} = {:>4.0}% of the unordered drain",
                    r.name,
                    r.eps / unordered * 100.0
                );
            }
        }
        let p99 = |name: &str| rows.iter().find(|r| r.name == name).and_then(|r| r.p99_ms);
        if let Some(u) = p99("latency @ 1000/s, fast path (notify)") {
            let prefix = "latency @ 1000/s, fast path (notify), ";
            for r in rows.iter().filter(|r| r.name.starts_with(prefix)) {
                if let Some(o) = r.p99_ms {
                    println!(
                        "  commit -> ack p99 at 1000/s: unordered {u:.1} ms, {} {o:.1} ms ({:.2}x)",
                        &r.name[prefix.len()..],
                        o / u
                    );
                }
            }
        }
    };
    if only_ordered {
        print_table(&rows);
        print_ordered(&rows);
        return;
    }
    eprintln!("ceilings");
    let defaults = Config::default();
    run(ceiling_broker(
        "raw broker, 1 sequential sync sender",
        1,
        1,
        if quick { 1000 } else { 3000 },
    ));
    run(ceiling_broker("raw broker, 4 sync senders", 4, 1, n / 4));
    run(ceiling_broker("raw broker, 1 sender, batch 64", 1, 64, n * 2));
    run(ceiling_broker("raw broker, 4 senders, batch 64", 4, 64, n * 2));
    let shape = format!(
        "raw broker, {} senders, batch {} (relay's shape)",
        defaults.workers, defaults.publish_batch_max
    );
    run(ceiling_broker(
        &shape,
        defaults.workers,
        defaults.publish_batch_max,
        n * 2,
    ));
    run(ceiling_db(4, n / 4));
    run(drain_with(
        "relay defaults, no broker (DB side alone)",
        "nobroker",
        n,
        1,
        |_| {},
        false,
    ));
    eprintln!("the seed's algorithm");
    run(drain(
        "seed algorithm flat out (per-row, batch 20, 1 sender)",
        "seed_flat",
        n / 10,
        1,
        |c| {
            c.claim_strategy = ClaimStrategy::PerRow;
            c.batch_size = 20;
            c.workers = 1;
            c.publish_batch_max = 1;
            c.max_in_flight = 20;
            c.scan_drain = true;
        },
    ));
    run(seed_defaults(if quick { 10 } else { 20 }));
    eprintln!("this project");
    for batch in [20usize, 100, 500] {
        for workers in [1usize, 4, 8] {
            if quick && workers == 8 {
                continue;
            }
            run(drain(
                &format!("sweep: batch {batch}, {workers} workers"),
                &format!("sweep_{batch}_{workers}"),
                n,
                1,
                |c| {
                    c.batch_size = batch;
                    c.workers = workers;
                    c.max_in_flight = (batch * 2).max(256);
                },
            ));
        }
    }
    for instances in [2usize, 3] {
        run(drain(
            &format!("defaults, {instances} instances"),
            &format!("inst_{instances}"),
            n,
            instances,
            |_| {},
        ));
    }
    run(drain("per-row strategy, 3 instances", "perrow_3", n / 4, 3, |c| {
        c.claim_strategy = ClaimStrategy::PerRow
    }));
    eprintln!("latency and live load");
    run(latency(1000, if quick { 5 } else { 10 }, true));
    run(latency(1000, if quick { 5 } else { 10 }, false));
    run(live(4, if quick { 5 } else { 10 }));
    if big {
        eprintln!("1 000 000-row backlog");
        run(big_backlog(1_000_000));
    }
    let sizes: Vec<u64> = if big {
        vec![0, 1_000_000, 10_000_000]
    } else {
        vec![0, 100_000, 1_000_000]
    };
    let scan = scan_rows_examined(&sizes);

    print_table(&rows);
    print_ordered(&rows);
    println!("\nscan rows read (Handler_read_*) with 100 due WAIT rows, batch 100:");
    for (size, reads, plan) in &scan {
        println!("  {size:>10} SUCCESS rows in the table: {reads:>5} rows read, plan {plan}");
    }
    let by = |name: &str| rows.iter().find(|r| r.name.starts_with(name)).map(|r| r.eps);
    if let Some(relay) = by("defaults (") {
        let best = rows
            .iter()
            .filter(|r| r.group == "drain")
            .map(|r| r.eps)
            .fold(0.0, f64::max);
        println!("\nheadline (relay defaults draining a backlog, {relay:.0} events/s; best drain {best:.0}):");
        for (what, name) in [
            ("raw batch ceiling, 4 senders x 64", "raw broker, 4 senders, batch 64"),
            ("raw batch ceiling, 1 sender x 64", "raw broker, 1 sender, batch 64"),
            ("raw batch ceiling, the relay's shape", shape.as_str()),
            ("the relay's DB side alone (no broker)", "relay defaults, no broker"),
        ] {
            if let Some(c) = by(name) {
                println!(
                    "  relay / {what:<40} = {:>4.0}%  (best drain {:.0}%)",
                    relay / c * 100.0,
                    best / c * 100.0
                );
            }
        }
        if let Some(seed) = by("seed algorithm flat out") {
            println!("  relay / seed algorithm flat out{:<16} = {:>4.0}x", "", relay / seed);
        }
    }
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    std::fs::create_dir_all(&dir).unwrap();
    write_csv(&rows, &dir.join("results.csv"));
    write_svg(&rows, &dir.join("throughput.svg"));
    println!(
        "\nwrote {} and {}",
        dir.join("results.csv").display(),
        dir.join("throughput.svg").display()
    );
}
