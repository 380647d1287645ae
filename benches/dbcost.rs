//! What the outbox costs the order database, as MariaDB's own CPU time (`/proc/<mariadbd>/stat`,
//! utime + stime), per order and per event, nothing else touching the server:
//!
//! - an order transaction alone (one order row, COMMIT), then with its event (the library's
//!   INSERT in the same transaction), and with its event inserted by the statement the library
//!   used before (the scheduled INSERT's due-time expression on every row), in rotating order
//!   round after round;
//! - one relay draining those events to RocketMQ, per claim strategy and `sent.rows`;
//! - retention deleting kept rows afterwards (what `sent.rows = keep` leaves for later);
//! - a consumer with the inbox crediting the relayed events (its defaults, a one-row handler);
//! - live: orders with their events at a steady rate (1 000/s), with and without a relay
//!   running, and with a relay whose rounds take 10 ms of commits together (`scan.coalesce.ms`).
//!
//! Each phase ends only when the server has done the work it deferred: the purge of deleted row
//! versions (history list length back to where it was) and the flush of the pages the phase
//! dirtied, so a phase pays for its own writes. What it wrote comes from `SHOW GLOBAL STATUS`:
//! rows (`Handler_write`, `_update`, `_delete`), pages modified (each row and index entry
//! written touches one: `Innodb_buffer_pool_write_requests`), redo bytes, statements.
//!
//! `cargo bench --features rocketmq --bench dbcost [-- --rounds R] [--events N] [--writers W]
//! [--live-rate R] [--live-secs S] [--server URL] [--pid N] [--only orders]`
//!
//! `--server` names another server (default `mysql://root@127.0.0.1:3306`), `--pid` its
//! `mariadbd` process (default: the only one on the machine), and `--only orders` runs just the
//! orders alone and with their events (no broker needed), e.g. to weigh a server setting.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use mysql::prelude::Queryable;
use mysql::{Opts, Pool, TxOpts};

use outbox::consumer::{Consumer, ConsumerConfig, HandlerError, Message};
use outbox::rocketmq::{RocketMqPublisher, RocketMqSource, SourceConfig};
use outbox::{ClaimStrategy, Config, NewEvent, Publisher, Relay, SentRows};

mod support;
use support::{at_least_one, server_cpu, server_pid};

const SERVER: &str = "mysql://root@127.0.0.1:3306";
const NAMESRV: &str = "127.0.0.1:9876";

struct Args {
    rounds: usize,
    events: u64,
    writers: usize,
    /// The live part: orders per second, and for how long.
    live_rate: u64,
    live_secs: u64,
    /// The server to measure, and its process (None: the only `mariadbd` on the machine).
    server: String,
    pid: Option<u32>,
    /// `--only orders`: the orders alone and with their events, nothing else.
    only_orders: bool,
}

fn args() -> Args {
    let mut a = Args {
        rounds: 3,
        events: 40_000,
        writers: 8,
        live_rate: 1000,
        live_secs: 20,
        server: SERVER.into(),
        pid: None,
        only_orders: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--rounds" => a.rounds = at_least_one("--rounds", it.next()),
            "--events" => a.events = at_least_one("--events", it.next()) as u64,
            "--writers" => a.writers = at_least_one("--writers", it.next()),
            "--live-rate" => a.live_rate = at_least_one("--live-rate", it.next()) as u64,
            "--live-secs" => a.live_secs = at_least_one("--live-secs", it.next()) as u64,
            "--server" => a.server = it.next().expect("--server needs a URL"),
            "--pid" => a.pid = Some(at_least_one("--pid", it.next()) as u32),
            "--only" => match it.next().as_deref() {
                Some("orders") => a.only_orders = true,
                other => panic!("--only takes `orders`, not {other:?}"),
            },
            "--bench" => {}
            other => {
                panic!(
                    "unknown argument {other:?} (--rounds R, --events N, --writers W, --live-rate R, --live-secs S, \
                     --server URL, --pid N, --only orders)"
                )
            }
        }
    }
    a
}

// ---------------------------------------------------------------- the server's side

fn global_status(c: &mut mysql::PooledConn) -> BTreeMap<String, u64> {
    let rows: Vec<(String, String)> = c.query("SHOW GLOBAL STATUS").unwrap();
    rows.into_iter()
        .filter_map(|(k, v)| v.parse().ok().map(|v| (k, v)))
        .collect()
}

fn history_length(c: &mut mysql::PooledConn) -> u64 {
    c.query_first("SELECT `COUNT` FROM information_schema.INNODB_METRICS WHERE NAME = 'trx_rseg_history_len'")
        .unwrap()
        .unwrap_or(0)
}

/// Waits until the server has done what the phase left for later: the purge of old row
/// versions (history list back to `history0` or below a few hundred) and the flush of dirty
/// pages (forced with `innodb_max_dirty_pages_pct = 0`, restored after).
fn settle(c: &mut mysql::PooledConn, history0: u64) {
    c.query_drop("SET GLOBAL innodb_max_dirty_pages_pct = 0").unwrap();
    let started = Instant::now();
    loop {
        let s = global_status(c);
        let dirty = s.get("Innodb_buffer_pool_pages_dirty").copied().unwrap_or(0);
        let history = history_length(c);
        if dirty < 50 && history <= history0.max(500) {
            break;
        }
        if started.elapsed() > Duration::from_secs(300) {
            eprintln!("  settle: still {dirty} dirty pages, history {history} after 300 s; measuring anyway");
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    c.query_drop("SET GLOBAL innodb_max_dirty_pages_pct = 90").unwrap();
}

/// What one phase cost the server.
#[derive(Debug, Default, Clone)]
struct Cost {
    units: u64,
    cpu_s: f64,
    status: BTreeMap<String, u64>,
}

impl Cost {
    fn us_per_unit(&self) -> f64 {
        self.cpu_s * 1e6 / self.units.max(1) as f64
    }

    fn per_unit(&self, key: &str) -> f64 {
        self.status.get(key).copied().unwrap_or(0) as f64 / self.units.max(1) as f64
    }

    /// Rows inserted, updated and deleted (`Handler_write`, `_update`, `_delete`).
    fn rows_written(&self) -> f64 {
        ["Handler_write", "Handler_update", "Handler_delete"]
            .iter()
            .map(|k| self.per_unit(k))
            .sum()
    }

    /// Pages modified in the buffer pool (`Innodb_buffer_pool_write_requests`): every row and
    /// index entry written touches one.
    fn page_writes(&self) -> f64 {
        self.per_unit("Innodb_buffer_pool_write_requests")
    }

    /// Redo log bytes (`Innodb_os_log_written`).
    fn redo_bytes(&self) -> f64 {
        self.per_unit("Innodb_os_log_written")
    }

    /// Statements the server ran (`Questions`).
    fn statements(&self) -> f64 {
        self.per_unit("Questions")
    }
}

/// Runs `work` (which reports how many units it did) and charges it the server's CPU until the
/// server has settled what it deferred.
fn measure(pool: &Pool, pid: u32, work: impl FnOnce() -> u64) -> Cost {
    let mut c = pool.get_conn().unwrap();
    let history0 = history_length(&mut c);
    settle(&mut c, history0);
    let s0 = global_status(&mut c);
    let cpu0 = server_cpu(pid);
    let units = work();
    // What the work wrote, before the settle's own polling statements.
    let s1 = global_status(&mut c);
    settle(&mut c, history0);
    let cpu = server_cpu(pid) - cpu0;
    let status = s1
        .iter()
        .map(|(k, v)| (k.clone(), v.saturating_sub(s0.get(k).copied().unwrap_or(0))))
        .collect();
    Cost {
        units,
        cpu_s: cpu,
        status,
    }
}

// ---------------------------------------------------------------- fixtures

struct Db {
    server: String,
    name: String,
    url: String,
    pool: Pool,
}

impl Db {
    fn fresh(server_url: &str, tag: &str) -> Db {
        let name = format!("outbox_cost_{tag}");
        let server = Pool::new(Opts::from_url(server_url).unwrap()).unwrap();
        let mut c = server.get_conn().unwrap();
        c.query_drop(format!("DROP DATABASE IF EXISTS {name}")).unwrap();
        c.query_drop(format!("CREATE DATABASE {name}")).unwrap();
        let url = format!("{server_url}/{name}");
        let pool = Pool::new(Opts::from_url(&url).unwrap()).unwrap();
        outbox::migrate(&pool).unwrap();
        pool.get_conn()
            .unwrap()
            .query_drop(
                "CREATE TABLE t_order (id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY, \
                 order_no VARCHAR(64) NOT NULL, user_id BIGINT UNSIGNED NOT NULL, amount_cents BIGINT NOT NULL, \
                 status VARCHAR(16) NOT NULL, created_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3), \
                 KEY idx_user (user_id)) ENGINE = InnoDB",
            )
            .unwrap();
        Db {
            server: server_url.into(),
            name,
            url,
            pool,
        }
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        if let Ok(p) = Pool::new(Opts::from_url(&self.server).unwrap()) {
            let _ = p
                .get_conn()
                .map(|mut c| c.query_drop(format!("DROP DATABASE IF EXISTS {}", self.name)));
        }
    }
}

/// The order phases of a round.
#[derive(Clone, Copy)]
enum Phase {
    Alone,
    WithEvent,
    Previous,
}

impl Phase {
    fn label(self) -> &'static str {
        match self {
            Phase::Alone => "alone                  ",
            Phase::WithEvent => "with event             ",
            Phase::Previous => "with event, previous    ",
        }
    }
}

/// How an order's event is written, if it is.
#[derive(Clone, Copy, PartialEq)]
enum EventInsert {
    None,
    /// The library's INSERT (`outbox::enqueue_in_tx`).
    Library,
    /// The statement the library used before events due now left their due time to the column's
    /// default: the scheduled INSERT, its schedule parameters NULL.
    Previous,
}

/// `n` order transactions from `writers` connections, each with its event as `event` says.
fn orders(db: &Db, n: u64, writers: usize, event: EventInsert, round: usize) -> u64 {
    let with_event = event != EventInsert::None;
    let previous = &outbox::insert_scheduled_statement("t_event_record").unwrap();
    let per = n / writers as u64;
    std::thread::scope(|s| {
        for w in 0..writers {
            let pool = db.pool.clone();
            s.spawn(move || {
                let mut c = pool.get_conn().unwrap();
                for i in 0..per {
                    let order = format!("ORD-{round}-{w}-{i}-{}", u8::from(with_event));
                    let mut tx = c.start_transaction(TxOpts::default()).unwrap();
                    tx.exec_drop(
                        "INSERT INTO t_order (order_no, user_id, amount_cents, status) VALUES (?, ?, ?, 'CREATED')",
                        (&order, i % 10_000, 1999),
                    )
                    .unwrap();
                    let payload = || {
                        format!(
                            "{{\"order\":\"{order}\",\"amount_cents\":1999,\"note\":\"{}\"}}",
                            "x".repeat(140)
                        )
                    };
                    match event {
                        EventInsert::None => {}
                        EventInsert::Library => {
                            outbox::enqueue_in_tx(&mut tx, &NewEvent::new(&order, "ORDER_CREATED", payload())).unwrap();
                        }
                        EventInsert::Previous => {
                            let none = None::<String>;
                            let params = (
                                &order,
                                "ORDER_CREATED",
                                payload(),
                                &none,
                                &none,
                                &none,
                                None::<i64>,
                                None::<i64>,
                            );
                            tx.exec_drop(previous, params).unwrap();
                        }
                    }
                    tx.commit().unwrap();
                }
            });
        }
    });
    per * writers as u64
}

fn pending(db: &Db) -> u64 {
    db.pool
        .get_conn()
        .unwrap()
        .query_first("SELECT COUNT(*) FROM t_event_record WHERE status IN ('WAIT', 'SENDING')")
        .unwrap()
        .unwrap_or(0)
}

fn relay_config(db: &Db, topic: &str) -> Config {
    let mut cfg = Config::new(&db.url);
    cfg.topic = topic.into();
    cfg.rocketmq.namesrv = NAMESRV.into();
    cfg
}

fn start_relay(cfg: Config) -> Relay {
    let publisher = std::sync::Arc::new(RocketMqPublisher::start(&cfg).unwrap());
    Relay::builder(cfg).publisher(publisher).start().unwrap()
}

/// One relay with `strategy` and `sent_rows`, defaults otherwise, draining what is pending.
fn drain(db: &Db, topic: &str, strategy: ClaimStrategy, sent_rows: SentRows) -> u64 {
    let n = pending(db);
    let mut cfg = relay_config(db, topic);
    cfg.claim_strategy = strategy;
    cfg.sent_rows = sent_rows;
    let relay = start_relay(cfg);
    let deadline = Instant::now() + Duration::from_secs(900);
    while relay.counters().sent < n && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let sent = relay.counters().sent;
    relay.stop(Duration::from_secs(10));
    assert!(sent >= n, "only {sent} of {n} sent within 15 minutes");
    sent
}

/// Creates the topic (the first send auto-creates it) so no phase pays for the route.
fn warm(topic: &str) {
    let mut cfg = Config::new("mysql://unused@127.0.0.1/none");
    cfg.rocketmq.namesrv = NAMESRV.into();
    let p = RocketMqPublisher::start(&cfg).unwrap();
    let e = outbox::OutboundEvent {
        id: 0,
        key: outbox::event::new_event_key(),
        biz_no: "WARM".into(),
        event_type: "WARM".into(),
        payload: b"{}".to_vec(),
        topic: topic.into(),
        tag: None,
        headers: BTreeMap::new(),
        attempt: 0,
        created_ms: 0,
    };
    for _ in 0..50 {
        if matches!(
            p.publish(std::slice::from_ref(&e), Duration::from_secs(3)).pop(),
            Some(outbox::SendOutcome::Sent { .. })
        ) {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("cannot send to {topic}: is the broker up (scripts/rocketmq start)?");
}

/// A consumer with the inbox, at its defaults, crediting each event with a one-row INSERT, until
/// it has handled `n` messages; returns how many it handled.
fn consume(db: &Db, topic: &str, n: u64) -> u64 {
    fn credit(tx: &mut mysql::Transaction<'_>, m: &Message) -> Result<(), HandlerError> {
        tx.exec_drop(
            "INSERT INTO credits (biz_no, points) VALUES (?, ?)",
            (m.biz_no().unwrap_or_default(), 10),
        )?;
        Ok(())
    }
    let group = format!("dbcost_{:08x}", rand::random::<u32>());
    let src = RocketMqSource::start(&SourceConfig::new(NAMESRV, topic, &group)).expect("source");
    let c = Consumer::start(
        ConsumerConfig::new(&group),
        db.pool.clone(),
        std::sync::Arc::new(src),
        std::sync::Arc::new(credit),
    )
    .expect("consumer");
    let deadline = Instant::now() + Duration::from_secs(900);
    loop {
        let s = c.stats();
        if s.processed + s.duplicates >= n || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let s = c.stop();
    s.processed + s.duplicates
}

/// Orders with their events at `rate` per second for `secs`, from `writers` connections each
/// keeping its share of the pace; returns the orders written.
fn paced(db: &Db, rate: u64, secs: u64, writers: usize, round: usize) -> u64 {
    let interval = Duration::from_secs_f64(writers as f64 / rate as f64);
    let per = rate * secs / writers as u64;
    std::thread::scope(|s| {
        for w in 0..writers {
            let pool = db.pool.clone();
            s.spawn(move || {
                let mut c = pool.get_conn().unwrap();
                // Writers start spread over one interval, as independent clients would.
                let start = Instant::now() + interval.mul_f64(w as f64 / writers as f64);
                for i in 0..per {
                    let at = start + interval * i as u32;
                    if let Some(wait) = at.checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                    let order = format!("LIVE-{round}-{w}-{i}");
                    let mut tx = c.start_transaction(TxOpts::default()).unwrap();
                    tx.exec_drop(
                        "INSERT INTO t_order (order_no, user_id, amount_cents, status) VALUES (?, ?, ?, 'CREATED')",
                        (&order, i % 10_000, 1999),
                    )
                    .unwrap();
                    let payload = format!(
                        "{{\"order\":\"{order}\",\"amount_cents\":1999,\"note\":\"{}\"}}",
                        "x".repeat(140)
                    );
                    outbox::enqueue_in_tx(&mut tx, &NewEvent::new(order, "ORDER_CREATED", payload)).unwrap();
                    tx.commit().unwrap();
                }
            });
        }
    });
    per * writers as u64
}

/// The live part: the same paced orders with no relay, with the default relay, and with a relay
/// whose rounds take 10 ms of commits together. Returns (no relay, relay, relay coalescing).
fn live(a: &Args, pid: u32, topic: &str, round: usize) -> (Cost, Cost, Cost) {
    let db = Db::fresh(&a.server, "live");
    let alone = measure(&db.pool, pid, || paced(&db, a.live_rate, a.live_secs, a.writers, round));
    // The rows the first part left are not the relay's to pay for: gone before it starts.
    db.pool
        .get_conn()
        .unwrap()
        .query_drop("TRUNCATE t_event_record")
        .unwrap();
    let with = |coalesce: Option<Duration>| {
        let mut cfg = relay_config(&db, topic);
        if let Some(c) = coalesce {
            cfg.scan_coalesce = c;
        }
        measure(&db.pool, pid, || {
            let relay = start_relay(cfg);
            let n = paced(&db, a.live_rate, a.live_secs, a.writers, round);
            let deadline = Instant::now() + Duration::from_secs(60);
            while relay.counters().sent < n && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            relay.stop(Duration::from_secs(10));
            n
        })
    };
    let relayed = with(None);
    let coalescing = with(Some(Duration::from_millis(10)));
    (alone, relayed, coalescing)
}

// ---------------------------------------------------------------- the run

const STRATEGIES: &[(&str, ClaimStrategy, SentRows)] = &[
    (
        "held, sent rows deleted (default)",
        ClaimStrategy::Held,
        SentRows::Delete,
    ),
    ("held, sent rows kept", ClaimStrategy::Held, SentRows::Keep),
    (
        "skip-locked lease, sent rows deleted",
        ClaimStrategy::SkipLocked,
        SentRows::Delete,
    ),
    (
        "skip-locked lease, sent rows kept",
        ClaimStrategy::SkipLocked,
        SentRows::Keep,
    ),
];

fn main() {
    let a = args();
    let pid = a.pid.unwrap_or_else(server_pid);
    println!(
        "dbcost: {} rounds, {} orders per phase, {} writers; MariaDB pid {pid}{}",
        a.rounds,
        a.events,
        a.writers,
        if a.server == SERVER {
            String::new()
        } else {
            format!(" at {}", a.server)
        }
    );
    let mut plain = Vec::new();
    let mut with_event = Vec::new();
    let mut with_previous = Vec::new();
    let mut relay: Vec<Vec<Cost>> = vec![Vec::new(); STRATEGIES.len()];
    let mut retention = Vec::new();
    let mut consumed = Vec::new();
    let mut live_parts = Vec::new();
    for round in 0..a.rounds {
        // A topic per round: the consumer reads what this round's relays sent.
        let topic = format!("BENCH_dbcost_{}_{round}", std::process::id());
        if !a.only_orders {
            warm(&topic);
        }
        let db = Db::fresh(&a.server, "run");
        db.pool
            .get_conn()
            .unwrap()
            .query_drop(
                "CREATE TABLE credits (id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY, \
                 biz_no VARCHAR(64) NOT NULL, points INT NOT NULL) ENGINE = InnoDB",
            )
            .unwrap();
        let mut relayed = 0;
        // The previous statement writes into a database of its own, so the relays below drain
        // the library's rows only.
        let previous = Db::fresh(&a.server, "previous");
        // Rotate which goes first, so a drift in the server's state favours none.
        let mut phases = [Phase::Alone, Phase::WithEvent, Phase::Previous];
        phases.rotate_left(round % 3);
        for phase in phases {
            let (target, events) = match phase {
                Phase::Alone => (&db, EventInsert::None),
                Phase::WithEvent => (&db, EventInsert::Library),
                Phase::Previous => (&previous, EventInsert::Previous),
            };
            let c = measure(&target.pool, pid, || orders(target, a.events, a.writers, events, round));
            println!(
                "  round {round}: orders {} {:>7.1} µs per order",
                phase.label(),
                c.us_per_unit()
            );
            match phase {
                Phase::Alone => plain.push(c),
                Phase::WithEvent => with_event.push(c),
                Phase::Previous => with_previous.push(c),
            }
        }
        drop(previous);
        if a.only_orders {
            continue;
        }
        // Each strategy drains a fresh batch of the same events, written the library's way.
        for (i, (name, strategy, sent_rows)) in STRATEGIES.iter().enumerate() {
            if pending(&db) == 0 {
                let _ = orders(&db, a.events, a.writers, EventInsert::Library, round * 100 + i + 1);
            }
            let c = measure(&db.pool, pid, || drain(&db, &topic, *strategy, *sent_rows));
            relayed += c.units;
            println!(
                "  round {round}: relay {name:<38} {:>7.1} µs per event",
                c.us_per_unit()
            );
            relay[i].push(c);
        }
        // What kept rows cost later: retention deleting them.
        let c = measure(&db.pool, pid, || {
            outbox::admin::purge(
                &db.pool,
                "t_event_record",
                Duration::ZERO,
                1000,
                Duration::from_secs(600),
                |_| {},
            )
            .unwrap()
        });
        println!(
            "  round {round}: retention of kept rows {:>7.1} µs per row",
            c.us_per_unit()
        );
        retention.push(c);
        let c = measure(&db.pool, pid, || consume(&db, &topic, relayed + 1));
        println!(
            "  round {round}: consumer with the inbox {:>7.1} µs per event",
            c.us_per_unit()
        );
        consumed.push(c);
        let parts = live(&a, pid, &topic, round);
        println!(
            "  round {round}: live at {}/s: orders {:.1}, with a relay {:.1}, rounds of 10 ms {:.1} µs per order",
            a.live_rate,
            parts.0.us_per_unit(),
            parts.1.us_per_unit(),
            parts.2.us_per_unit()
        );
        live_parts.push(parts);
    }
    report(&plain, &with_event, &with_previous, &relay, &retention, &consumed);
    if !a.only_orders {
        report_live(&a, &plain, &live_parts);
    }
}

/// The median of the rounds' figures.
fn median(costs: &[Cost], f: impl Fn(&Cost) -> f64) -> f64 {
    let mut v: Vec<f64> = costs.iter().map(f).collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn report(
    plain: &[Cost],
    with_event: &[Cost],
    previous: &[Cost],
    relay: &[Vec<Cost>],
    retention: &[Cost],
    consumed: &[Cost],
) {
    let order = median(plain, Cost::us_per_unit);
    let enqueue = median(with_event, Cost::us_per_unit) - order;
    println!();
    println!(
        "MariaDB CPU per order or event (median of {} rounds), and what it wrote per unit",
        plain.len()
    );
    println!(
        "| phase | µs per unit | of an order | rows written | page writes | redo bytes | statements | rounds (µs) |\n|---|---:|---:|---:|---:|---:|---:|---|"
    );
    let line = |name: &str, us: f64, costs: &[Cost]| {
        println!(
            "| {name} | {us:.1} | {:.2} | {:.2} | {:.1} | {:.0} | {:.3} | {} |",
            us / order,
            median(costs, Cost::rows_written),
            median(costs, Cost::page_writes),
            median(costs, Cost::redo_bytes),
            median(costs, Cost::statements),
            costs
                .iter()
                .map(|c| format!("{:.1}", c.us_per_unit()))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    line("order transaction alone (one order row, COMMIT)", order, plain);
    line(
        "the same with its event (the library's INSERT)",
        median(with_event, Cost::us_per_unit),
        with_event,
    );
    println!(
        "| the enqueue's addition | {enqueue:.1} | {:.2} | | | |",
        enqueue / order
    );
    let earlier = median(previous, Cost::us_per_unit);
    line(
        "the same with the previous INSERT (a due-time expression on every row)",
        earlier,
        previous,
    );
    println!(
        "| its enqueue's addition | {:.1} | {:.2} | | | |",
        earlier - order,
        (earlier - order) / order
    );
    if retention.is_empty() {
        return; // --only orders
    }
    for ((name, _, _), costs) in STRATEGIES.iter().zip(relay) {
        line(&format!("relay: {name}"), median(costs, Cost::us_per_unit), costs);
    }
    line(
        "retention deleting kept rows, per row",
        median(retention, Cost::us_per_unit),
        retention,
    );
    line(
        "consumer with the inbox, per event (defaults, a one-row handler)",
        median(consumed, Cost::us_per_unit),
        consumed,
    );
}

fn report_live(a: &Args, plain: &[Cost], parts: &[(Cost, Cost, Cost)]) {
    let order = median(plain, Cost::us_per_unit);
    let alone: Vec<Cost> = parts.iter().map(|p| p.0.clone()).collect();
    let base = median(&alone, Cost::us_per_unit);
    println!();
    println!(
        "Live: {} orders/s with their events for {} s ({} writers); the relay's share is the difference",
        a.live_rate, a.live_secs, a.writers
    );
    println!(
        "| phase | µs per order | relay per event | of a (saturated) order | rounds (µs) |\n|---|---:|---:|---:|---|"
    );
    let line = |name: &str, costs: Vec<Cost>| {
        let us = median(&costs, Cost::us_per_unit);
        let relay = if name.starts_with("orders") {
            String::new()
        } else {
            format!("{:.1}", us - base)
        };
        let share = if name.starts_with("orders") {
            String::new()
        } else {
            format!("{:.2}", (us - base) / order)
        };
        println!(
            "| {name} | {us:.1} | {relay} | {share} | {} |",
            costs
                .iter()
                .map(|c| format!("{:.1}", c.us_per_unit()))
                .collect::<Vec<_>>()
                .join(", ")
        );
    };
    line("orders with events, no relay", alone);
    line("with the relay (defaults)", parts.iter().map(|p| p.1.clone()).collect());
    line(
        "with a relay taking 10 ms of commits per round (scan.coalesce.ms = 10)",
        parts.iter().map(|p| p.2.clone()).collect(),
    );
}
