//! The whole pipeline in one run: an order service committing orders with their events, the relay
//! publishing them to RocketMQ, and a points service consuming them with the inbox, crediting
//! points in another schema of the same MariaDB server. On this machine's MariaDB and broker.
//!
//! `cargo bench --features rocketmq --bench pipeline [-- --events N] [--secs S] [--rounds N] [--writers N] [--only PART]
//! [--set key=value ...]` (`--set`: a relay setting, as in `outbox.toml`)
//!
//! Parts (all by default, in this order; `--only` takes `rates`, `points`, `latency`, `sustained`):
//! - **rates**: one topic filled by the relay's unordered drain of N seeded events (default
//!   400 000: each consumer's run then lasts ~10 s; at 100 000 a run of 2–3 s moved the inbox's
//!   ratio by ±6 points from round to round) (its rate),
//!   then read from the first offset by consumers of groups of their own: the lite pull consumer
//!   alone (the raw pull rate), and the consumer runtime with its defaults (inbox on, batches,
//!   the per-message handler doing one INSERT per message), without the inbox, with one message
//!   per transaction, and with a batch handler (one multi-row INSERT per batch); the defaults and
//!   the runtime without the inbox in `--rounds` alternating pairs (default 3), compared by their
//!   medians. Rates leave start-up out: the relay's from its first send to its last (wall
//!   clock: held rounds write no claim time and sent rows are deleted), a consumer's from its
//!   first credit to its last (the database clock).
//! - **points**: a points service whose handler updates a shared row: per order a credit INSERT
//!   and an UPDATE of its user's balance (users named by the event's `userId` header), 200 users
//!   and a hotter 20, N/4 events each. Per user count, one topic filled by the relay's unordered
//!   drain (its rate: first send to last, wall clock), then read by the consumer at its defaults
//!   (`consumer.route = queue`), routed by business key (`biz_no`), routed by the user
//!   (`property:userId`), with one handler thread, and at its defaults with the handler written
//!   per batch (one multi-row INSERT of the credits, one multi-row upsert of the balances); each
//!   checks that every balance adds up.
//! - **latency**: writers commit 1 000 orders/s for S seconds while the relay and the consumer
//!   run; commit → credited per order is the credit's time minus the order's (both the database
//!   clock), p50 and p99, unordered and with `ordering = per-biz-no`.
//! - **sustained**: N writers (default 32) at rising offered rates (and flat out) for S seconds
//!   each; the highest rate at which the pipeline's lag (orders committed and not yet credited)
//!   stays bounded: no growth over the second half of the run and caught up within 5 s of the last
//!   commit. Each line also says how much of the largest lag was not yet sent by the relay (the
//!   rest was sent and not yet credited) and the relay's events per claim round and per send.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mysql::prelude::Queryable;
use mysql::{Opts, Pool};

use outbox::consumer::{BatchHandler, Consumer, ConsumerConfig, ConsumerStats, HandlerError, Message, Source};
use outbox::rocketmq::{RocketMqPublisher, RocketMqSource, SourceConfig};
use outbox::{Config, NewEvent, Relay};

const SERVER: &str = "mysql://root@127.0.0.1:3306";
const NAMESRV: &str = "127.0.0.1:9876";

/// The order service's and the points service's databases, dropped at the end.
struct Dbs {
    tag: String,
    orders_url: String,
    orders: Pool,
    points: Pool,
}

impl Dbs {
    fn fresh(tag: &str) -> Dbs {
        let tag = format!("{tag}_{}", std::process::id());
        let server = Pool::new(Opts::from_url(SERVER).unwrap()).expect("MariaDB on 127.0.0.1:3306");
        let mut c = server.get_conn().unwrap();
        for db in ["orders", "points"] {
            c.query_drop(format!("DROP DATABASE IF EXISTS outbox_pipe_{db}_{tag}"))
                .unwrap();
            c.query_drop(format!("CREATE DATABASE outbox_pipe_{db}_{tag}")).unwrap();
        }
        let orders_url = format!("{SERVER}/outbox_pipe_orders_{tag}");
        // The pools the library's users get (`outbox::connect`).
        let orders = outbox::connect(&Config::new(&orders_url)).unwrap();
        let points = outbox::connect(&Config::new(format!("{SERVER}/outbox_pipe_points_{tag}"))).unwrap();
        outbox::migrate(&orders).unwrap();
        outbox::migrate(&points).unwrap();
        orders
            .get_conn()
            .unwrap()
            .query_drop(
                "CREATE TABLE orders (order_no VARCHAR(32) PRIMARY KEY, amount BIGINT NOT NULL, \
                 created_at DATETIME(6) NOT NULL DEFAULT NOW(6))",
            )
            .unwrap();
        points
            .get_conn()
            .unwrap()
            .query_drop(
                "CREATE TABLE credits (seq BIGINT AUTO_INCREMENT PRIMARY KEY, grp VARCHAR(64) NOT NULL, \
                 order_no VARCHAR(32) NOT NULL, points BIGINT NOT NULL, credited_at DATETIME(6) NOT NULL DEFAULT NOW(6), \
                 KEY (grp, credited_at))",
            )
            .unwrap();
        Dbs {
            tag,
            orders_url,
            orders,
            points,
        }
    }

    /// `n` due events of orders `ORD-0..n`, inserted in bulk (not measured).
    fn seed(&self, n: u64) {
        let mut c = self.orders.get_conn().unwrap();
        let mut done = 0u64;
        while done < n {
            let k = (n - done).min(1_000_000);
            c.query_drop(format!(
                "INSERT INTO t_event_record (biz_no, event_type, payload, status, event_key) \
                 SELECT CONCAT('ORD-', {done} + seq), 'ORDER_PAID', \
                 CONCAT('{{\"order\":\"ORD-', {done} + seq, '\",\"points\":', seq % 100, ',\"note\":\"', REPEAT('x', 140), '\"}}'), 'WAIT', UUID() \
                 FROM seq_1_to_{k}"
            ))
            .unwrap();
            done += k;
        }
    }

    /// Credits of `group` and the seconds from the first to the last (database clock).
    fn credited(&self, group: &str) -> (u64, f64) {
        let (n, us): (u64, Option<i64>) = self
            .points
            .get_conn()
            .unwrap()
            .exec_first(
                "SELECT COUNT(*), TIMESTAMPDIFF(MICROSECOND, MIN(credited_at), MAX(credited_at)) FROM credits WHERE grp = ?",
                (group,),
            )
            .unwrap()
            .unwrap();
        (n, us.unwrap_or(0) as f64 / 1e6)
    }
}

impl Drop for Dbs {
    fn drop(&mut self) {
        if let Ok(p) = Pool::new(Opts::from_url(SERVER).unwrap()) {
            if let Ok(mut c) = p.get_conn() {
                for db in ["orders", "points"] {
                    let _ = c.query_drop(format!("DROP DATABASE IF EXISTS outbox_pipe_{db}_{}", self.tag));
                }
            }
        }
    }
}

/// `--set key=value` settings, applied to every relay's configuration after the bench's own.
static RELAY_SETTINGS: std::sync::OnceLock<Vec<(String, String)>> = std::sync::OnceLock::new();

fn relay_config(dbs: &Dbs, topic: &str) -> Config {
    let mut c = Config::new(&dbs.orders_url);
    c.topic = topic.into();
    c.rocketmq.namesrv = NAMESRV.into();
    for (k, v) in RELAY_SETTINGS.get().into_iter().flatten() {
        c.set(k, v).unwrap_or_else(|e| panic!("--set {k}={v}: {e}"));
    }
    c
}

fn topic(tag: &str) -> String {
    format!("PIPE_{tag}_{}", std::process::id())
}

fn group(tag: &str) -> String {
    format!("points_{tag}_{:08x}", rand::random::<u32>())
}

/// The points service's handler: one INSERT per message, in the consumer's transaction.
fn credit_with(group: String) -> impl Fn(&mut mysql::Transaction<'_>, &Message) -> Result<(), HandlerError> {
    move |tx, m| {
        let body: serde_json::Value = serde_json::from_slice(&m.body)?;
        tx.exec_drop(
            "INSERT INTO credits (grp, order_no, points) VALUES (?, ?, ?)",
            (
                &group,
                body["order"].as_str().unwrap_or_default(),
                body["points"].as_i64().unwrap_or(0),
            ),
        )?;
        Ok(())
    }
}

/// The same credits, one multi-row INSERT per batch.
struct CreditAll(String);

impl BatchHandler for CreditAll {
    fn handle_batch(&self, tx: &mut mysql::Transaction<'_>, msgs: &[Message]) -> Result<(), HandlerError> {
        let mut sql = String::from("INSERT INTO credits (grp, order_no, points) VALUES ");
        let mut params: Vec<mysql::Value> = Vec::with_capacity(msgs.len() * 3);
        for (i, m) in msgs.iter().enumerate() {
            let body: serde_json::Value = serde_json::from_slice(&m.body)?;
            sql.push_str(if i == 0 { "(?, ?, ?)" } else { ", (?, ?, ?)" });
            params.push(self.0.as_str().into());
            params.push(body["order"].as_str().unwrap_or_default().into());
            params.push(body["points"].as_i64().unwrap_or(0).into());
        }
        tx.exec_drop(sql, params)?;
        Ok(())
    }
}

/// How a consumer of a run is set up.
#[derive(Clone, Copy)]
struct Shape {
    inbox: bool,
    batch_max: usize,
    batch_handler: bool,
}

const DEFAULTS: Shape = Shape {
    inbox: true,
    batch_max: outbox::config::DEFAULT_BATCH_MAX,
    batch_handler: false,
};

fn start_consumer(dbs: &Dbs, topic: &str, group: &str, shape: Shape) -> Consumer {
    let mut cfg = ConsumerConfig::new(group);
    cfg.inbox = shape.inbox;
    cfg.batch_max = shape.batch_max;
    let src = Arc::new(RocketMqSource::start(&SourceConfig::for_consumer(NAMESRV, topic, &cfg)).expect("source"));
    if shape.batch_handler {
        Consumer::start_batch(cfg, dbs.points.clone(), src, Arc::new(CreditAll(group.into())))
    } else {
        Consumer::start(cfg, dbs.points.clone(), src, Arc::new(credit_with(group.into())))
    }
    .expect("consumer")
}

fn wait_for(deadline: Duration, mut done: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + deadline;
    while !done() {
        if Instant::now() > end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// The relay's unordered drain of `n` seeded events into `topic` ([`relay_drain_seeded`]).
fn relay_drain(dbs: &Dbs, topic: &str, n: u64) -> f64 {
    dbs.seed(n);
    relay_drain_seeded(dbs, topic, n)
}

/// The lite pull consumer alone: messages/s from the first message to the last.
fn raw_pull(topic: &str, n: u64) -> f64 {
    let src = RocketMqSource::start(&SourceConfig::new(NAMESRV, topic, &group("raw"))).expect("source");
    let (mut got, mut t0) = (0u64, None);
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

/// One consumer reading the whole topic: credits/s on the database clock, and its final stats.
fn consume(dbs: &Dbs, topic: &str, n: u64, tag: &str, shape: Shape) -> (f64, ConsumerStats) {
    let g = group(tag);
    let c = start_consumer(dbs, topic, &g, shape);
    assert!(
        wait_for(Duration::from_secs(900), || {
            let s = c.stats();
            s.processed + s.duplicates >= n
        }),
        "consumer {tag} did not finish"
    );
    let stats = c.stop();
    let (credits, secs) = dbs.credited(&g);
    (credits as f64 / secs, stats)
}

/// The relay's unordered drain of the `n` events already in the table into `topic`: events/s
/// from the first send to the last (wall clock; the first send's events not counted).
fn relay_drain_seeded(dbs: &Dbs, topic: &str, n: u64) -> f64 {
    let cfg = relay_config(dbs, topic);
    let relay = Relay::start(cfg.clone(), Arc::new(RocketMqPublisher::start(&cfg).unwrap())).unwrap();
    let mut first: Option<(Instant, u64)> = None;
    assert!(
        wait_for(Duration::from_secs(900), || {
            let sent = relay.counters().sent;
            if sent > 0 && first.is_none() {
                first = Some((Instant::now(), sent));
            }
            sent >= n
        }),
        "the relay did not drain {n} events"
    );
    let (t0, s0) = first.expect("sent");
    let rate = (n - s0) as f64 / t0.elapsed().as_secs_f64();
    relay.stop(Duration::from_secs(10));
    rate
}

/// The points handler: the order's credit, and its user's balance (a row every order of the
/// user updates).
fn credit_and_add(group: String) -> impl Fn(&mut mysql::Transaction<'_>, &Message) -> Result<(), HandlerError> {
    let credit = credit_with(group.clone());
    move |tx, m| {
        credit(tx, m)?;
        tx.exec_drop(
            "UPDATE balances SET points = points + 1 WHERE grp = ? AND user_id = ?",
            (&group, m.property("userId").ok_or("no userId property")?),
        )?;
        Ok(())
    }
}

/// The points handler as a batch handler: the batch's credits in one multi-row INSERT, and each
/// user's total in one multi-row upsert of the balances, users in order (two batches sharing
/// users lock them in the same order).
struct CreditAndAddAll(String);

impl BatchHandler for CreditAndAddAll {
    fn handle_batch(&self, tx: &mut mysql::Transaction<'_>, msgs: &[Message]) -> Result<(), HandlerError> {
        CreditAll(self.0.clone()).handle_batch(tx, msgs)?;
        let mut per_user: std::collections::BTreeMap<&str, i64> = std::collections::BTreeMap::new();
        for m in msgs {
            *per_user
                .entry(m.property("userId").ok_or("no userId property")?)
                .or_default() += 1;
        }
        let mut sql = String::from("INSERT INTO balances (grp, user_id, points) VALUES ");
        let mut params: Vec<mysql::Value> = Vec::with_capacity(per_user.len() * 3);
        for (i, (user, points)) in per_user.into_iter().enumerate() {
            sql.push_str(if i == 0 { "(?, ?, ?)" } else { ", (?, ?, ?)" });
            params.push(self.0.as_str().into());
            params.push(user.into());
            params.push(points.into());
        }
        sql.push_str(" ON DUPLICATE KEY UPDATE points = points + VALUES(points)");
        tx.exec_drop(sql, params)?;
        Ok(())
    }
}

fn points(n: u64) {
    println!("== points: a handler that updates a shared row (credit INSERT + the user's balance UPDATE), {n} events per topic");
    for users in [200u64, 20] {
        let dbs = Dbs::fresh(&format!("points{users}"));
        let t = topic(&format!("points{users}"));
        let mut c = dbs.orders.get_conn().unwrap();
        c.query_drop(format!(
            "INSERT INTO t_event_record (biz_no, event_type, payload, headers, status, event_key) \
             SELECT CONCAT('ORD-', seq), 'ORDER_PAID', \
             CONCAT('{{\"order\":\"ORD-', seq, '\",\"points\":1,\"note\":\"', REPEAT('x', 140), '\"}}'), \
             CONCAT('{{\"userId\":\"u', seq % {users}, '\"}}'), 'WAIT', UUID() FROM seq_1_to_{n}"
        ))
        .unwrap();
        dbs.points
            .get_conn()
            .unwrap()
            .query_drop(
                "CREATE TABLE balances (grp VARCHAR(64) NOT NULL, user_id VARCHAR(16) NOT NULL, \
                 points BIGINT NOT NULL, PRIMARY KEY (grp, user_id))",
            )
            .unwrap();
        let relay = relay_drain_seeded(&dbs, &t, n);
        println!(
            "  {users:>3} users: {:<48} {relay:>9.0} events/s",
            "relay, unordered drain (defaults)"
        );
        for (name, route, threads, batch) in [
            ("consumer defaults (routed by queue)", "queue", None, false),
            ("consumer routed by business key (biz_no)", "biz_no", None, false),
            (
                "consumer routed by user (property:userId)",
                "property:userId",
                None,
                false,
            ),
            ("consumer, one handler thread", "queue", Some(1), false),
            ("consumer defaults, the handler per batch", "queue", None, true),
        ] {
            let g = group("pts");
            dbs.points
                .get_conn()
                .unwrap()
                .query_drop(format!(
                    "INSERT INTO balances SELECT '{g}', CONCAT('u', seq - 1), 0 FROM seq_1_to_{users}"
                ))
                .unwrap();
            let mut cfg = ConsumerConfig::new(&g);
            let mut all = Config::default();
            all.set("consumer.route", route).unwrap();
            cfg.route = all.consumer.route;
            if let Some(th) = threads {
                cfg.threads = th;
            }
            let src = Arc::new(RocketMqSource::start(&SourceConfig::for_consumer(NAMESRV, &t, &cfg)).expect("source"));
            let consumer = if batch {
                Consumer::start_batch(cfg, dbs.points.clone(), src, Arc::new(CreditAndAddAll(g.clone())))
            } else {
                Consumer::start(cfg, dbs.points.clone(), src, Arc::new(credit_and_add(g.clone())))
            }
            .expect("consumer");
            assert!(
                wait_for(Duration::from_secs(900), || {
                    let s = consumer.stats();
                    s.processed + s.duplicates >= n
                }),
                "consumer {name} did not finish"
            );
            let s = consumer.stop();
            let (credits, secs) = dbs.credited(&g);
            let total: Option<i64> = dbs
                .points
                .get_conn()
                .unwrap()
                .exec_first("SELECT CAST(SUM(points) AS SIGNED) FROM balances WHERE grp = ?", (&g,))
                .unwrap()
                .flatten();
            assert_eq!(total, Some(n as i64), "{name}: the balances add up to the orders");
            let rate = credits as f64 / secs;
            let per_tx = (s.processed + s.duplicates) as f64 / s.transactions.max(1) as f64;
            println!(
                "  {users:>3} users: {name:<48} {rate:>9.0} msg/s  {:.2}x relay  {per_tx:>5.1} msg/tx  batch retries {}  fallbacks {}",
                rate / relay,
                s.batch_retries,
                s.batch_fallbacks
            );
        }
    }
}

fn rates(n: u64, rounds: u32) {
    println!("== rates: {n} events, one topic, same run (database clock, start-up not counted)");
    let dbs = Dbs::fresh("rates");
    let t = topic("rates");
    let relay = relay_drain(&dbs, &t, n);
    println!("  {:<58} {relay:>9.0} events/s", "relay, unordered drain (defaults)");
    let raw = raw_pull(&t, n);
    println!(
        "  {:<58} {raw:>9.0} msg/s",
        "raw pull (lite pull consumer, no database)"
    );
    let noinbox = Shape {
        inbox: false,
        ..DEFAULTS
    };
    // The inbox's cost is a ratio of two rates that each move by ±10 % from one read of the topic
    // to the next: `rounds` pairs, the order alternating (defaults first, then the other way
    // round) so that neither side always reads a warmer broker, compared by their medians.
    let mut runs: Vec<(String, String, Shape)> = Vec::new();
    for r in 0..rounds {
        let pair = [
            (
                "consumer defaults (inbox, batches, one INSERT per message)",
                "defaults",
                DEFAULTS,
            ),
            ("consumer without the inbox", "noinbox", noinbox),
        ];
        let order = if r % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            let (name, tag, shape) = pair[i];
            runs.push((format!("{name}, round {}", r + 1), format!("{tag}{r}"), shape));
        }
        if r == 0 {
            runs.push((
                "consumer, one message per transaction (batch.max 1)".into(),
                "single".into(),
                Shape {
                    batch_max: 1,
                    ..DEFAULTS
                },
            ));
            runs.push((
                "consumer, batch handler (one multi-row INSERT per batch)".into(),
                "batchh".into(),
                Shape {
                    batch_handler: true,
                    ..DEFAULTS
                },
            ));
        }
    }
    let mut got: Vec<(String, f64)> = Vec::new();
    for (name, tag, shape) in runs {
        let (rate, s) = consume(&dbs, &t, n, &tag, shape);
        let per_tx = (s.processed + s.duplicates) as f64 / s.transactions.max(1) as f64;
        println!(
            "  {name:<68} {rate:>9.0} msg/s  {per_tx:>5.1} msg/tx  fallbacks {}  dups {}",
            s.batch_fallbacks, s.duplicates
        );
        got.push((tag, rate));
    }
    let median = |prefix: &str| {
        let mut v: Vec<f64> = got
            .iter()
            .filter(|(t, _)| t.strip_prefix(prefix).is_some_and(|r| r.parse::<u32>().is_ok()))
            .map(|(_, r)| *r)
            .collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let one = |tag: &str| got.iter().find(|(t, _)| t == tag).map(|(_, r)| *r).unwrap_or(f64::NAN);
    let (defaults, plain) = (median("defaults"), median("noinbox"));
    println!(
        "  medians over {rounds} rounds: consumer defaults {defaults:.0} msg/s, without the inbox {plain:.0} msg/s"
    );
    println!(
        "  consumer defaults / relay drain: {:.2}x; inbox / no inbox: {:.0} %; batches / one per transaction: {:.1}x; batch handler / relay: {:.2}x",
        defaults / relay,
        100.0 * defaults / plain,
        defaults / one("single"),
        one("batchh") / relay
    );
}

/// Writers committing orders (an order row and its event in one transaction) at `rate` per
/// second in all (0: flat out) until `stop`, each on a connection of the order service's pool
/// `service`; returns the commits made.
fn start_writers(
    relay: Arc<Relay>,
    service: Pool,
    writers: usize,
    rate: u64,
    ordered_keys: Option<u64>,
    stop: Arc<AtomicBool>,
    committed: Arc<AtomicU64>,
) -> Vec<std::thread::JoinHandle<()>> {
    (0..writers)
        .map(|w| {
            let (relay, service, stop, committed) = (relay.clone(), service.clone(), stop.clone(), committed.clone());
            std::thread::spawn(move || {
                // The order service's own connection (not the relay's pool, which its scanner and
                // workers need).
                let mut conn = service.get_conn().unwrap();
                let every = (rate > 0).then(|| Duration::from_secs_f64(writers as f64 / rate as f64));
                let mut next = Instant::now();
                let mut i = 0u64;
                while !stop.load(Relaxed) {
                    if let Some(every) = every {
                        let now = Instant::now();
                        if now < next {
                            std::thread::sleep(next - now);
                        }
                        next += every;
                    }
                    let order = format!("W{w}-{i}");
                    let key = match ordered_keys {
                        Some(k) => format!("USER-{}", (i * writers as u64 + w as u64) % k),
                        None => order.clone(),
                    };
                    let payload = format!(
                        "{{\"order\":\"{order}\",\"points\":{},\"note\":\"{}\"}}",
                        i % 100,
                        "x".repeat(140)
                    );
                    let mut tx = conn.start_transaction(mysql::TxOpts::default()).unwrap();
                    tx.exec_drop("INSERT INTO orders (order_no, amount) VALUES (?, ?)", (&order, i % 100))
                        .unwrap();
                    relay
                        .enqueue_in_tx(&mut tx, &NewEvent::new(key, "ORDER_PAID", payload.into_bytes()))
                        .unwrap();
                    relay.commit(tx).unwrap();
                    committed.fetch_add(1, Relaxed);
                    i += 1;
                }
            })
        })
        .collect()
}

/// A running pipeline: relay and consumer on a topic of its own.
struct Pipeline {
    dbs: Dbs,
    relay: Arc<Relay>,
    consumer: Consumer,
    group: String,
}

impl Pipeline {
    fn start(tag: &str, ordered: bool) -> Pipeline {
        let dbs = Dbs::fresh(tag);
        let t = topic(tag);
        let mut cfg = relay_config(&dbs, &t);
        if ordered {
            cfg.ordering = outbox::config::Ordering::PerBizNo;
        }
        let publisher = Arc::new(RocketMqPublisher::start(&cfg).unwrap());
        let relay = Arc::new(Relay::start(cfg, publisher).unwrap());
        // The topic exists (and the consumer has its queues) before the first order.
        let mut conn = relay.pool().get_conn().unwrap();
        let mut tx = conn.start_transaction(mysql::TxOpts::default()).unwrap();
        let warm = "{\"order\":\"WARM\",\"points\":0}";
        relay
            .enqueue_in_tx(&mut tx, &NewEvent::new("WARM", "ORDER_PAID", warm.as_bytes().to_vec()))
            .unwrap();
        relay.commit(tx).unwrap();
        drop(conn);
        let group = group(tag);
        let consumer = start_consumer(&dbs, &t, &group, DEFAULTS);
        assert!(
            wait_for(Duration::from_secs(120), || consumer.stats().processed >= 1),
            "the pipeline {tag} does not deliver"
        );
        Pipeline {
            dbs,
            relay,
            consumer,
            group,
        }
    }

    fn credited(&self) -> u64 {
        self.dbs.credited(&self.group).0.saturating_sub(1)
    }

    /// A pool of the order service's own (the mysql crate's default: up to 100 connections).
    fn service_pool(&self) -> Pool {
        Pool::new(Opts::from_url(&self.dbs.orders_url).unwrap()).unwrap()
    }

    fn stop(self) {
        self.consumer.stop();
        self.relay.stop(Duration::from_secs(10));
    }
}

fn latency(secs: u64) {
    println!("== commit -> credited at 1 000 orders/s for {secs} s (database clock), 4 writers");
    for (name, ordered) in [("unordered", false), ("ordered (per-biz-no, 400 keys)", true)] {
        let p = Pipeline::start(if ordered { "lat_o" } else { "lat_u" }, ordered);
        let (stop, committed) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
        let writers = start_writers(
            p.relay.clone(),
            p.service_pool(),
            4,
            1000,
            ordered.then_some(400),
            stop.clone(),
            committed.clone(),
        );
        std::thread::sleep(Duration::from_secs(secs));
        stop.store(true, Relaxed);
        writers.into_iter().for_each(|w| w.join().unwrap());
        let n = committed.load(Relaxed);
        assert!(
            wait_for(Duration::from_secs(120), || p.credited() >= n),
            "{name}: not all credited"
        );
        let mut ms: Vec<f64> = p
            .dbs
            .points
            .get_conn()
            .unwrap()
            .exec(
                format!(
                    "SELECT TIMESTAMPDIFF(MICROSECOND, o.created_at, c.credited_at) / 1000 FROM credits c \
                     JOIN outbox_pipe_orders_{}.orders o ON o.order_no = c.order_no WHERE c.grp = ?",
                    p.dbs.tag
                ),
                (&p.group,),
            )
            .unwrap();
        ms.sort_by(f64::total_cmp);
        let q = |f: f64| ms[((ms.len() as f64 * f) as usize).min(ms.len() - 1)];
        let s = p.consumer.stats();
        println!(
            "  {name:<32} {n:>6} orders  p50 {:>6.1} ms  p99 {:>6.1} ms  max {:>6.1} ms  {:.1} msg/tx",
            q(0.50),
            q(0.99),
            ms[ms.len() - 1],
            (s.processed + s.duplicates) as f64 / s.transactions.max(1) as f64
        );
        p.stop();
    }
}

/// Writers of the sustained part by default (`--writers N`): an order service's request threads,
/// each committing one order with its event per transaction (the database's group commit is what
/// lets many of them commit more per second than a few).
const SUSTAINED_WRITERS: usize = 32;

fn sustained(secs: u64, writers: usize) {
    println!("== sustained: offered rate for {secs} s each, {writers} writers; lag = committed - credited");
    let mut best = 0.0f64;
    for rate in [2000u64, 4000, 5000, 6000, 0] {
        let p = Pipeline::start(&format!("sus{rate}"), false);
        let (stop, committed) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
        let started = Instant::now();
        let writers = start_writers(
            p.relay.clone(),
            p.service_pool(),
            writers,
            rate,
            None,
            stop.clone(),
            committed.clone(),
        );
        // (seconds, lag, the part of it not yet sent by the relay)
        let mut samples: Vec<(f64, u64, u64)> = Vec::new();
        while started.elapsed() < Duration::from_secs(secs) {
            std::thread::sleep(Duration::from_millis(500));
            let c = committed.load(Relaxed);
            let sent = p.relay.counters().sent;
            samples.push((
                started.elapsed().as_secs_f64(),
                c.saturating_sub(p.credited()),
                c.saturating_sub(sent),
            ));
        }
        stop.store(true, Relaxed);
        writers.into_iter().for_each(|w| w.join().unwrap());
        let n = committed.load(Relaxed);
        let write_secs = started.elapsed().as_secs_f64();
        let stopped = Instant::now();
        let caught_up = wait_for(Duration::from_secs(60), || p.credited() >= n);
        let catch_up = stopped.elapsed().as_secs_f64();
        let half = samples.len() / 2;
        let max_first = samples[..half].iter().map(|s| s.1).max().unwrap_or(0);
        let max_second = samples[half..].iter().map(|s| s.1).max().unwrap_or(0);
        // Where the lag sits at its largest in the second half: not yet sent, or sent and not
        // yet credited.
        let at_max = samples[half..].iter().max_by_key(|s| s.1).copied().unwrap_or_default();
        let achieved = n as f64 / write_secs;
        let r = p.relay.counters();
        let per_round = r.claimed as f64 / r.claim_rounds.max(1) as f64;
        let per_call = r.sent as f64 / r.publish_calls.max(1) as f64;
        // Bounded: no growth over the second half (beyond a second of noise), caught up soon.
        let bounded = caught_up && catch_up <= 5.0 && max_second as f64 <= (max_first as f64).max(achieved);
        if bounded {
            best = best.max(achieved);
        }
        println!(
            "  offered {:>10}  committed {achieved:>7.0}/s  max lag {max_first:>6} then {max_second:>6} (unsent {:>6})  caught up {:>5.2} s after  {}  relay: {per_round:.0}/round {per_call:.0}/send",
            if rate == 0 { "flat out".to_string() } else { format!("{rate}/s") },
            at_max.2.min(at_max.1),
            catch_up,
            if bounded { "bounded" } else { "NOT bounded" }
        );
        p.stop();
    }
    println!("  highest sustained rate with bounded lag: {best:.0} orders/s");
}

/// A count argument's value: a number of at least 1, or a panic saying `usage`.
fn at_least_one(v: Option<String>, usage: &str) -> usize {
    v.and_then(|v| v.parse().ok()).filter(|n| *n >= 1).expect(usage)
}

fn main() {
    let (mut n, mut secs, mut rounds, mut only) = (400_000u64, 20u64, 3u32, Vec::<String>::new());
    let mut writers = SUSTAINED_WRITERS;
    let mut settings = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--events" => n = args.next().and_then(|v| v.parse().ok()).expect("--events N"),
            "--secs" => secs = args.next().and_then(|v| v.parse().ok()).expect("--secs S"),
            "--rounds" => rounds = at_least_one(args.next(), "--rounds N (1 or more)") as u32,
            "--writers" => writers = at_least_one(args.next(), "--writers N (1 or more)"),
            "--only" => only.push(args.next().expect("--only rates|points|latency|sustained")),
            "--set" => {
                let kv = args.next().unwrap_or_default();
                let (k, v) = kv.split_once('=').expect("--set key=value (a relay setting)");
                settings.push((k.to_string(), v.to_string()));
            }
            "--bench" => {}
            other => {
                eprintln!(
                    "pipeline bench: unknown argument {other:?} (--events N, --secs S, --rounds N, --writers N, --only rates|points|latency|sustained, --set key=value)"
                );
                std::process::exit(2);
            }
        }
    }
    RELAY_SETTINGS.set(settings).expect("set once");
    let part = |p: &str| only.is_empty() || only.iter().any(|o| o == p);
    if part("rates") {
        rates(n, rounds);
    }
    if part("points") {
        points((n / 4).max(1));
    }
    if part("latency") {
        latency(secs);
    }
    if part("sustained") {
        sustained(secs, writers);
    }
}
