//! A fleet (`shards`, docs/fleet.md) on this machine's MariaDB and broker, one run:
//!
//! - **drain**: one relay draining `--events` from one database, then one fleet draining the
//!   same number spread over `--shards` databases (defaults for both; the RocketMQ publisher),
//!   taking turns for `--rounds` rounds; events per second from the start to the last ack, and
//!   the medians;
//! - **idle**: `--idle-shards` databases, nothing to send, for `--idle-secs`: MariaDB's CPU time
//!   (`/proc/<mariadbd>/stat`) without a relay, then with the fleet over them, as a share of one
//!   core; and the queries per second it costs the server (`Questions`);
//! - **fresh events beside a hot shard**: shard 0 holds a backlog of `--hot` events when the
//!   fleet starts; while it drains, a writer commits `--probe-rate` events per second, each on a
//!   random other shard; commit → broker ack of those (the database's clock) p50/p99/max.
//!
//! - **isolation** (`--isolation` alone): `--isolation-shards` databases of
//!   `--isolation-events` each, shard 0 reached through a TCP proxy; the other shards' drain
//!   with the proxy passing everything, then with it stalling (3 s) and dropping (2 s) shard 0's
//!   connections in turn, rounds taking turns; and what the fleet said of shard 0 meanwhile.
//!
//! `cargo bench --features rocketmq --bench fleet [-- --shards 64] [--events 128000]
//! [--idle-shards 256] [--idle-secs 20] [--hot 200000] [--probe-rate 100] [--probe-secs 15]
//! [--rounds 3 | --no-drain] [--set KEY=VALUE]...` (`--set` applies to every fleet of the run);
//! `cargo bench --features rocketmq --bench fleet -- --isolation [--isolation-shards 16]
//! [--isolation-events 3000] [--rounds 3]`
//!
//! Shard databases are made by creating one migrated database and copying its tables (`CREATE
//! TABLE … LIKE`, the migration history with them); `max_connections` is raised for the run
//! (every shard holds two connections at least) and set back at the end.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mysql::prelude::Queryable;

use parking_lot::Mutex;

use outbox::rocketmq::RocketMqPublisher;
use outbox::{Config, Fleet, NewEvent, Publisher, Relay};

mod support;
use support::{at_least_one, server_cpu, server_pid};
#[allow(dead_code)]
#[path = "../tests/it/proxy.rs"]
mod proxy;
#[path = "support/shards.rs"]
mod shards;
use shards::{server, Dbs};

const NAMESRV: &str = "127.0.0.1:9876";
const PREFIX: &str = "outbox_bench_fleet";

struct Args {
    shards: usize,
    events: usize,
    idle_shards: usize,
    idle_secs: u64,
    hot: usize,
    probe_rate: u64,
    probe_secs: u64,
    /// `--set KEY=VALUE`: settings of every fleet of the run (`shard.watch.ms=500`).
    sets: Vec<(String, String)>,
    /// Drain rounds, one relay and the fleet taking turns (`--no-drain`: none).
    rounds: usize,
    /// `--isolation`: only the isolation part, over `isolation_shards` of `isolation_events`.
    isolation: bool,
    isolation_shards: usize,
    isolation_events: usize,
}

fn args() -> Args {
    let mut a = Args {
        shards: 64,
        events: 128_000,
        idle_shards: 256,
        idle_secs: 20,
        hot: 200_000,
        probe_rate: 100,
        probe_secs: 15,
        sets: Vec::new(),
        rounds: 3,
        isolation: false,
        isolation_shards: 16,
        isolation_events: 3000,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut num = || at_least_one(&flag, it.next());
        match flag.as_str() {
            "--shards" => a.shards = num(),
            "--rounds" => a.rounds = num(),
            "--no-drain" => a.rounds = 0,
            "--events" => a.events = num(),
            "--idle-shards" => a.idle_shards = num().max(2),
            "--idle-secs" => a.idle_secs = num() as u64,
            "--hot" => a.hot = num(),
            "--probe-rate" => a.probe_rate = num() as u64,
            "--probe-secs" => a.probe_secs = num() as u64,
            "--isolation" => a.isolation = true,
            "--isolation-shards" => a.isolation_shards = num().max(2),
            "--isolation-events" => a.isolation_events = num(),
            "--set" => {
                let kv = it.next().expect("--set needs KEY=VALUE");
                let (k, v) = kv
                    .split_once('=')
                    .unwrap_or_else(|| panic!("--set {kv}: expected KEY=VALUE"));
                a.sets.push((k.into(), v.into()));
            }
            "--bench" => {}
            other => panic!("unknown flag {other}"),
        }
    }
    a
}

fn config(topic: &str) -> Config {
    let mut c = Config {
        topic: topic.into(),
        ..Config::default()
    };
    c.rocketmq.namesrv = NAMESRV.into();
    c
}

/// A fleet's configuration: [`config`] with the run's `--set`s.
fn fleet_config(a: &Args, topic: &str, shards: String) -> Config {
    let mut c = config(topic);
    c.shards = Some(shards);
    for (k, v) in &a.sets {
        c.set(k, v).unwrap_or_else(|e| panic!("--set {k}={v}: {e}"));
    }
    c
}

fn publisher(c: &Config) -> Arc<dyn Publisher> {
    Arc::new(RocketMqPublisher::start(c).unwrap())
}

fn wait_for(limit: Duration, mut done: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < end, "not done within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------- the server's side

fn questions() -> u64 {
    let row: Option<(String, u64)> = server()
        .get_conn()
        .unwrap()
        .query_first("SHOW GLOBAL STATUS LIKE 'Questions'")
        .unwrap();
    row.unwrap().1
}

/// MariaDB's CPU (share of one core) and queries per second over `secs` of what runs now.
fn idle_cost(pid: u32, secs: u64) -> (f64, f64) {
    let (c0, q0, t0) = (server_cpu(pid), questions(), Instant::now());
    std::thread::sleep(Duration::from_secs(secs));
    let (c1, q1, t) = (server_cpu(pid), questions(), t0.elapsed().as_secs_f64());
    ((c1 - c0) / t, (q1 - q0) as f64 / t)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    let a = args();
    let pid = server_pid();
    let mut c = server().get_conn().unwrap();
    let old_max: u64 = c.query_first("SELECT @@max_connections").unwrap().unwrap();
    let need = 6 * a.idle_shards.max(a.shards) as u64 + 100;
    c.query_drop(format!("SET GLOBAL max_connections = {}", old_max.max(need)))
        .unwrap();
    let run = std::panic::catch_unwind(|| {
        if a.isolation {
            isolation(&a);
            return;
        }
        if a.rounds > 0 {
            drain(&a);
        }
        idle_and_hot(&a, pid);
    });
    c.query_drop(format!("SET GLOBAL max_connections = {old_max}")).unwrap();
    if let Err(e) = run {
        std::panic::resume_unwind(e);
    }
}

fn drain(a: &Args) {
    let per = a.events / a.shards;
    let total = per * a.shards;
    println!(
        "== drain: {total} events, one relay on one database and a fleet of {} shards, taking turns for {} rounds",
        a.shards, a.rounds
    );
    let one = Dbs::new(PREFIX, "one", 1);
    let dbs = Dbs::new(PREFIX, "drain", a.shards);
    let (mut ones, mut fleets) = (Vec::new(), Vec::new());
    for round in 0..a.rounds {
        one.fill(0, total);
        let cfg = {
            let mut c = config(&format!("{PREFIX}_one_{}_{round}", std::process::id()));
            c.db_url = one.url(0);
            c
        };
        let t0 = Instant::now();
        let relay = Relay::builder(cfg.clone()).publisher(publisher(&cfg)).start().unwrap();
        wait_for(Duration::from_secs(600), || relay.counters().sent >= total as u64);
        let one_rate = total as f64 / t0.elapsed().as_secs_f64();
        relay.stop(Duration::from_secs(10));
        dbs.fill_all(per);
        let cfg = fleet_config(
            a,
            &format!("{PREFIX}_drain_{}_{round}", std::process::id()),
            dbs.shards(0..a.shards),
        );
        let t0 = Instant::now();
        let fleet = Fleet::builder(cfg.clone(), publisher(&cfg)).start().unwrap();
        let sent = || -> u64 {
            fleet
                .shards()
                .iter()
                .filter_map(|v| v.relay().map(|r| r.counters().sent))
                .sum()
        };
        wait_for(Duration::from_secs(300), || {
            fleet.shards().iter().all(|v| v.relay().is_some())
        });
        let started = t0.elapsed().as_secs_f64();
        wait_for(Duration::from_secs(600), || sent() >= total as u64);
        let fleet_rate = total as f64 / t0.elapsed().as_secs_f64();
        fleet.stop(Duration::from_secs(10));
        println!(
            "round {}: one relay {one_rate:>7.0} events/s; fleet of {} shards ({per} each) {fleet_rate:>7.0} events/s \
             ({:.0} %; every shard's relay running {started:.1} s after the start)",
            round + 1,
            a.shards,
            100.0 * fleet_rate / one_rate
        );
        ones.push(one_rate);
        fleets.push(fleet_rate);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (o, f) = (median(&mut ones), median(&mut fleets));
    println!(
        "medians: one relay {o:.0} events/s, the fleet {f:.0} events/s ({:.0} % of one relay)",
        100.0 * f / o
    );
}

fn idle_and_hot(a: &Args, pid: u32) {
    let n = a.idle_shards;
    println!(
        "== idle: {n} shards; then shard 0 with a backlog of {} while the others get {} fresh events/s",
        a.hot, a.probe_rate
    );
    let dbs = Dbs::new(PREFIX, "idle", n);
    let (cpu0, q0) = idle_cost(pid, a.idle_secs);
    println!(
        "no relay                        MariaDB {:>5.1} % of a core, {q0:>7.0} queries/s",
        100.0 * cpu0
    );
    let cfg = fleet_config(a, &format!("{PREFIX}_idle_{}", std::process::id()), dbs.shards(0..n));
    let fleet = Fleet::builder(cfg.clone(), publisher(&cfg)).start().unwrap();
    wait_for(Duration::from_secs(300), || {
        fleet.shards().iter().all(|v| v.relay().is_some())
    });
    let (cpu1, q1) = idle_cost(pid, a.idle_secs);
    println!(
        "fleet over {n} idle shards       MariaDB {:>5.1} % of a core, {q1:>7.0} queries/s \
         (the fleet's share: {:.1} %, {:.1} queries/s per shard)",
        100.0 * cpu1,
        100.0 * (cpu1 - cpu0),
        (q1 - q0) / n as f64
    );
    fleet.stop(Duration::from_secs(10));

    // The hot shard's backlog first, then the fleet, then fresh events on the others.
    dbs.fill(0, a.hot);
    let latencies: Arc<Mutex<Vec<f64>>> = Arc::default();
    let hot_sent = Arc::new(AtomicU64::new(0));
    let (l2, h2) = (latencies.clone(), hot_sent.clone());
    let hot_name = format!("{PREFIX}_idle_0");
    let fleet = Fleet::builder(cfg.clone(), publisher(&cfg))
        .latency_hook(move |shard, d| {
            if shard == hot_name {
                h2.fetch_add(1, Relaxed);
            } else {
                l2.lock().push(d.to_broker.as_secs_f64() * 1000.0);
            }
        })
        .start()
        .unwrap();
    wait_for(Duration::from_secs(300), || {
        fleet.shards().iter().all(|v| v.relay().is_some())
    });
    // One small pool for the writer: each probe picks its shard's database with USE.
    let writer = server();
    let probes = a.probe_rate * a.probe_secs;
    let t0 = Instant::now();
    for k in 0..probes {
        let due = t0 + Duration::from_secs_f64(k as f64 / a.probe_rate as f64);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let mut conn = writer.get_conn().unwrap();
        conn.query_drop(format!("USE {}", dbs.names[rand::random_range(1..n)]))
            .unwrap();
        let mut tx = conn.start_transaction(mysql::TxOpts::default()).unwrap();
        outbox::enqueue_in_tx(&mut tx, &NewEvent::new(format!("PROBE-{k}"), "ORDER_CREATED", "{}")).unwrap();
        tx.commit().unwrap();
    }
    wait_for(Duration::from_secs(120), || latencies.lock().len() as u64 >= probes);
    let hot_done = hot_sent.load(Relaxed);
    fleet.stop(Duration::from_secs(10));
    let mut l = latencies.lock().clone();
    l.sort_by(f64::total_cmp);
    println!(
        "{probes} fresh events on {} shards, commit -> ack: p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms \
         (the hot shard had sent {hot_done} of {} when the last was acked)",
        n - 1,
        percentile(&l, 0.5),
        percentile(&l, 0.99),
        l.last().copied().unwrap_or(0.0),
        a.hot
    );
}

/// The other shards' drain with shard 0 healthy, then with its connections stalled and dropped.
fn isolation(a: &Args) {
    use proxy::{Mode, Proxy};
    let n = a.isolation_shards;
    let per = a.isolation_events;
    println!(
        "== isolation: {n} shards of {per} events, shard 0 through a proxy: healthy, then stalling 3 s and dropping 2 s in turn; {} rounds",
        a.rounds
    );
    let dbs = Dbs::new(PREFIX, "iso", n);
    let proxy = Proxy::start("127.0.0.1:3306");
    let list = std::iter::once(proxy.url(&dbs.names[0]))
        .chain((1..n).map(|i| dbs.url(i)))
        .collect::<Vec<_>>()
        .join(" ");
    let (mut healthy, mut faulty) = (Vec::new(), Vec::new());
    for round in 0..a.rounds.max(1) {
        for faults in [false, true] {
            proxy.set(Mode::Pass);
            let mut c = server().get_conn().unwrap();
            for name in &dbs.names {
                c.query_drop(format!("TRUNCATE TABLE {name}.t_event_record")).unwrap();
            }
            dbs.fill_all(per);
            let cfg = fleet_config(a, &format!("{PREFIX}_iso_{}_{round}", std::process::id()), list.clone());
            let fleet = Fleet::builder(cfg.clone(), publisher(&cfg)).start().unwrap();
            let bad = dbs.names[0].clone();
            let others_sent = || -> u64 {
                fleet
                    .shards()
                    .iter()
                    .filter(|v| v.spec.name != bad)
                    .filter_map(|v| v.relay().map(|r| r.counters().sent))
                    .sum()
            };
            let stop = std::sync::atomic::AtomicBool::new(false);
            let (mut samples, mut named) = (0u32, 0u32);
            let t0 = Instant::now();
            // Taken when the others are done, not when the fault thread ends its cycle.
            let elapsed = std::thread::scope(|s| {
                if faults {
                    let (proxy, stop) = (&proxy, &stop);
                    s.spawn(move || {
                        while !stop.load(Relaxed) {
                            proxy.set(Mode::Stall);
                            std::thread::sleep(Duration::from_secs(3));
                            proxy.set(Mode::Drop);
                            std::thread::sleep(Duration::from_secs(2));
                        }
                    });
                }
                let goal = ((n - 1) * per) as u64;
                let end = Instant::now() + Duration::from_secs(600);
                while others_sent() < goal {
                    assert!(Instant::now() < end, "the other shards did not drain");
                    // What the fleet says of shard 0 (what /healthz prints).
                    if faults {
                        samples += 1;
                        let view = fleet.shards().into_iter().find(|v| v.spec.name == bad).unwrap();
                        let said = match view.relay() {
                            None => true,
                            Some(r) => !r.health().0 || r.stalled().is_some(),
                        } || !fleet.watch_problems().is_empty();
                        named += u32::from(said);
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                stop.store(true, Relaxed);
                t0.elapsed()
            });
            let rate = ((n - 1) * per) as f64 / elapsed.as_secs_f64();
            proxy.set(Mode::Pass);
            fleet.stop(Duration::from_secs(10));
            if faults {
                println!(
                    "round {}: the other {} shards {rate:>7.0} events/s with shard 0 stalled and dropped \
                     (shard 0 named as not relaying, db down, stalled or unwatched in {named} of {samples} samples)",
                    round + 1,
                    n - 1
                );
                faulty.push(rate);
            } else {
                println!(
                    "round {}: the other {} shards {rate:>7.0} events/s with shard 0 healthy",
                    round + 1,
                    n - 1
                );
                healthy.push(rate);
            }
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (h, f) = (median(&mut healthy), median(&mut faulty));
    println!(
        "medians: the other shards {h:.0} events/s with shard 0 healthy, {f:.0} with it faulty ({:.0} %)",
        100.0 * f / h
    );
}
