//! Several relays splitting one fleet (`shard.coordination.url`, docs/fleet.md) under SIGKILLs,
//! on this machine's MariaDB and broker:
//!
//! `--relays` processes (this program with `--serve`, each a `Fleet` over the same `--shards`
//! databases, split through a coordination database, `shard.lease.ms` = `--lease-ms`) relay
//! while a writer commits `--rate` events a second, each on a random shard, for `--secs`; every
//! `--kill-every` seconds one relay (in turn) is SIGKILLed and started again at once. Then: the
//! time until every committed row is SUCCESS, and the topic read back by business key: lost
//! events (none may be), duplicates, each explained row by row (copies <= 1 + retry_count +
//! the row's claim-lost audits, as in the fault suite), how long each killed relay's shards
//! stayed held by the dead, and the most connections the relays held on the server.
//!
//! `cargo bench --features rocketmq --bench fleet_share [-- --shards 64] [--relays 3]
//! [--secs 80] [--rate 400] [--kill-every 20] [--lease-ms 15000] [--set KEY=VALUE]...`
//!
//! Exits non-zero when an event is lost, a duplicate is not explained, or a shard is not drained.

use std::collections::{BTreeSet, HashMap};
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mysql::prelude::Queryable;
use mysql::{Opts, Pool};

use outbox::rocketmq::testing::read_topic_by;
use outbox::rocketmq::RocketMqPublisher;
use outbox::{Config, Fleet, NewEvent};

// Shared with the other benches; this one uses a part of each.
#[allow(dead_code)]
mod support;
use support::at_least_one;
#[allow(dead_code)]
#[path = "support/shards.rs"]
mod shards;
use shards::{server, Dbs, SERVER};

const NAMESRV: &str = "127.0.0.1:9876";
const PREFIX: &str = "outbox_bench_share";

struct Args {
    shards: usize,
    relays: usize,
    secs: u64,
    rate: u64,
    kill_every: u64,
    lease_ms: u64,
    sets: Vec<String>,
}

fn args() -> Args {
    let mut a = Args {
        shards: 64,
        relays: 3,
        secs: 80,
        rate: 400,
        kill_every: 20,
        lease_ms: 15_000,
        sets: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut num = || at_least_one(&flag, it.next());
        match flag.as_str() {
            "--shards" => a.shards = num(),
            "--relays" => a.relays = num(),
            "--secs" => a.secs = num() as u64,
            "--rate" => a.rate = num() as u64,
            "--kill-every" => a.kill_every = num() as u64,
            "--lease-ms" => a.lease_ms = num() as u64,
            "--set" => a.sets.push(it.next().expect("--set needs KEY=VALUE")),
            "--bench" => {}
            other => panic!("unknown flag {other}"),
        }
    }
    a
}

fn main() {
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some("--serve") {
        serve(&argv[2..]);
        return;
    }
    let a = args();
    let mut c = server().get_conn().unwrap();
    let old_max: u64 = c.query_first("SELECT @@max_connections").unwrap().unwrap();
    c.query_drop(format!(
        "SET GLOBAL max_connections = {}",
        old_max.max(6 * a.shards as u64 + 200)
    ))
    .unwrap();
    let ok = std::panic::catch_unwind(|| run(&a));
    c.query_drop(format!("SET GLOBAL max_connections = {old_max}")).unwrap();
    match ok {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => std::panic::resume_unwind(e),
    }
}

/// `--serve INSTANCE TOPIC COORD LEASE_MS SHARDS [SET...]`: one relay of the fleet (COORD `-`:
/// no coordination, it serves every shard), until its stdin closes (then it stops and gives its
/// shards up) or it is killed.
fn serve(args: &[String]) {
    let [instance, topic, coord, lease, shards, sets @ ..] = args else {
        panic!("--serve INSTANCE TOPIC COORD LEASE_MS SHARDS [SET...]")
    };
    let mut c = Config {
        topic: topic.clone(),
        shards: Some(shards.clone()),
        shard_coordination_url: (coord != "-").then(|| coord.clone()),
        instance_id: Some(instance.clone()),
        sent_rows: outbox::SentRows::Keep,
        ..Config::default()
    };
    c.rocketmq.namesrv = NAMESRV.into();
    c.set("shard.lease.ms", lease).unwrap();
    for kv in sets {
        let (k, v) = kv
            .split_once('=')
            .unwrap_or_else(|| panic!("--set {kv}: expected KEY=VALUE"));
        c.set(k, v).unwrap_or_else(|e| panic!("--set {kv}: {e}"));
    }
    let publisher = Arc::new(RocketMqPublisher::start(&c).unwrap());
    let fleet = Fleet::builder(c, publisher).start().unwrap();
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    fleet.stop(Duration::from_secs(10));
}

/// The most connections the relays hold on the shards' server, sampled every 200 ms until `done`.
fn sample_connections(done: Arc<AtomicBool>, most: Arc<AtomicUsize>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut c = server().get_conn().unwrap();
        while !done.load(Relaxed) {
            let n: u64 = c
                .query_first(format!(
                    "SELECT COUNT(*) FROM information_schema.processlist WHERE db LIKE '{PREFIX}\\_s\\_%'"
                ))
                .unwrap()
                .unwrap();
            most.fetch_max(n as usize, Relaxed);
            std::thread::sleep(Duration::from_millis(200));
        }
    })
}

struct Relays {
    args: Vec<String>,
    children: Vec<(String, Child)>,
    started: usize,
}

impl Relays {
    /// None running yet; each will relay `shards` to `topic`, split through `coord` (`-`: none).
    fn new(a: &Args, topic: &str, coord: &str, shards: String) -> Relays {
        Relays {
            args: [topic.to_string(), coord.to_string(), a.lease_ms.to_string(), shards]
                .into_iter()
                .chain(a.sets.iter().cloned())
                .collect(),
            children: Vec::new(),
            started: 0,
        }
    }

    fn spawn(&mut self, slot: usize) {
        self.started += 1;
        let id = format!("share-{slot}-g{}", self.started);
        let child = Command::new(std::env::current_exe().unwrap())
            .arg("--serve")
            .arg(&id)
            .args(&self.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        if slot < self.children.len() {
            self.children[slot] = (id, child);
        } else {
            self.children.push((id, child));
        }
    }

    /// SIGKILLs the relay in `slot`; returns its id.
    fn kill(&mut self, slot: usize) -> String {
        let (id, child) = &mut self.children[slot];
        child.kill().unwrap();
        child.wait().unwrap();
        id.clone()
    }

    /// Closes every relay's stdin: each stops and gives its shards up.
    fn stop(&mut self) {
        for (_, child) in &mut self.children {
            drop(child.stdin.take());
        }
        for (_, child) in &mut self.children {
            let _ = child.wait();
        }
    }
}

fn run(a: &Args) -> bool {
    let dbs = Dbs::new(PREFIX, "s", a.shards);
    let coord = format!("{PREFIX}_coord");
    let mut c = server().get_conn().unwrap();
    c.query_drop(format!("DROP DATABASE IF EXISTS {coord}")).unwrap();
    c.query_drop(format!("CREATE DATABASE {coord}")).unwrap();
    let coord_url = format!("{SERVER}/{coord}");
    let coord_pool = Pool::new(Opts::from_url(&coord_url).unwrap()).unwrap();
    let topic = format!("BENCH_SHARE_{:08x}", rand::random::<u32>());
    println!(
        "== {} relays splitting {} shards (shard.lease.ms {}), {} events/s for {} s, one relay SIGKILLed every {} s",
        a.relays, a.shards, a.lease_ms, a.rate, a.secs, a.kill_every
    );
    // First, for comparison: the same relays without coordination, each serving every shard.
    let alone_most = {
        let mut alone = Relays::new(a, &topic, "-", dbs.shards(0..a.shards));
        let (done, most) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(0)));
        let sampler = sample_connections(done.clone(), most.clone());
        for slot in 0..a.relays {
            alone.spawn(slot);
        }
        std::thread::sleep(Duration::from_secs(15));
        done.store(true, Relaxed);
        sampler.join().unwrap();
        alone.stop();
        most.load(Relaxed)
    };
    let mut relays = Relays::new(a, &topic, &coord_url, dbs.shards(0..a.shards));
    for slot in 0..a.relays {
        relays.spawn(slot);
    }

    let done = Arc::new(AtomicBool::new(false));
    let most = Arc::new(AtomicUsize::new(0));
    let sampler = sample_connections(done.clone(), most.clone());
    // The writer: `rate` events a second, one per transaction, each on a random shard.
    let committed: Vec<Vec<String>> = std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let pool = server();
            let mut per: Vec<Vec<String>> = vec![Vec::new(); a.shards];
            let total = a.rate * a.secs;
            let t0 = Instant::now();
            for k in 0..total {
                let due = t0 + Duration::from_secs_f64(k as f64 / a.rate as f64);
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
                let i = rand::random_range(0..a.shards);
                let mut conn = pool.get_conn().unwrap();
                conn.query_drop(format!("USE {}", dbs.names[i])).unwrap();
                let mut tx = conn.start_transaction(mysql::TxOpts::default()).unwrap();
                let key = format!("SH-{i}-{k}");
                outbox::enqueue_in_tx(&mut tx, &NewEvent::new(key.clone(), "ORDER_CREATED", "{}")).unwrap();
                tx.commit().unwrap();
                per[i].push(key);
            }
            per
        });
        // The killer: every `kill_every` seconds one relay, in turn, SIGKILLed and started again
        // at once; a watcher per kill says how long its shards stayed held by the dead relay.
        let t0 = Instant::now();
        let mut kills = 0;
        loop {
            let next = Duration::from_secs(a.kill_every * (kills as u64 + 1));
            if next >= Duration::from_secs(a.secs) {
                break;
            }
            std::thread::sleep(next.saturating_sub(t0.elapsed()));
            let slot = kills % a.relays;
            let dead = relays.kill(slot);
            let at = Instant::now();
            relays.spawn(slot);
            kills += 1;
            let pool = &coord_pool;
            s.spawn(move || {
                let held_by_dead = || -> u64 {
                    pool.get_conn()
                        .unwrap()
                        .exec_first("SELECT COUNT(*) FROM outbox_fleet_shard WHERE owner = ?", (&dead,))
                        .unwrap()
                        .unwrap()
                };
                let had = held_by_dead();
                while held_by_dead() > 0 && at.elapsed() < Duration::from_secs(120) {
                    std::thread::sleep(Duration::from_millis(100));
                }
                println!(
                    "{:>5.1} s  SIGKILL {dead} (it held {had} shards): all taken over {:.1} s later",
                    (at - t0).as_secs_f64(),
                    at.elapsed().as_secs_f64()
                );
            });
        }
        writer.join().unwrap()
    });
    let total: usize = committed.iter().map(Vec::len).sum();
    let written = Instant::now();

    // Every committed row SUCCESS.
    let pending = || -> u64 {
        let mut c = server().get_conn().unwrap();
        dbs.names
            .iter()
            .map(|n| -> u64 {
                c.query_first(format!(
                    "SELECT COUNT(*) FROM {n}.t_event_record WHERE status <> 'SUCCESS'"
                ))
                .unwrap()
                .unwrap()
            })
            .sum()
    };
    let mut left = pending();
    while left > 0 && written.elapsed() < Duration::from_secs(300) {
        std::thread::sleep(Duration::from_millis(250));
        left = pending();
    }
    let drained = written.elapsed().as_secs_f64();
    done.store(true, Relaxed);
    sampler.join().unwrap();
    relays.stop();

    // The topic read back by business key.
    let back = read_topic_by(NAMESRV, &topic, total, Duration::from_secs(180), outbox::wire::BIZ_NO).unwrap();
    let mut copies: HashMap<String, u64> = HashMap::new();
    for m in &back.messages {
        if let Some(k) = m.biz_no() {
            *copies.entry(k.to_string()).or_insert(0) += 1;
        }
    }
    let lost: Vec<&String> = committed
        .iter()
        .flatten()
        .filter(|k| !copies.contains_key(*k))
        .collect();
    // Each duplicated event explained by its row: copies <= 1 + retry_count + claim-lost audits.
    let (mut duplicates, mut unexplained) = (0u64, Vec::new());
    let mut c = server().get_conn().unwrap();
    for (i, name) in dbs.names.iter().enumerate() {
        let keys: BTreeSet<&String> = committed[i].iter().filter(|k| copies[*k] > 1).collect();
        if keys.is_empty() {
            continue;
        }
        let rows: Vec<(u64, String, u64)> = c
            .query(format!("SELECT id, biz_no, retry_count FROM {name}.t_event_record"))
            .unwrap();
        let audits: HashMap<u64, u64> = c
            .query_map(
                format!(
                    "SELECT event_id, COUNT(*) FROM {name}.outbox_audit WHERE action = 'claim-lost' GROUP BY event_id"
                ),
                |(id, n)| (id, n),
            )
            .unwrap()
            .into_iter()
            .collect();
        for (id, biz_no, retries) in rows.into_iter().filter(|r| keys.contains(&r.1)) {
            let n = copies[&biz_no];
            duplicates += n - 1;
            if n > 1 + retries + audits.get(&id).copied().unwrap_or(0) {
                unexplained.push((name.clone(), id, n));
            }
        }
    }
    println!(
        "committed {total} events on {} shards; every row SUCCESS {drained:.1} s after the last commit ({left} not)",
        a.shards
    );
    println!(
        "read back {} messages: lost {}, duplicates {duplicates} ({} unexplained by retry_count and claim-lost audits)",
        back.messages.len(),
        lost.len(),
        unexplained.len()
    );
    println!(
        "connections of the relays on the server: at most {} with the {} shards split {} ways; {alone_most} when each of the {} relays served every shard (15 s without coordination, before the run)",
        most.load(Relaxed),
        a.shards,
        a.relays,
        a.relays
    );
    let _ = server()
        .get_conn()
        .unwrap()
        .query_drop(format!("DROP DATABASE IF EXISTS {coord}"));
    let ok = lost.is_empty() && unexplained.is_empty() && left == 0;
    if !ok {
        println!(
            "FAILED: lost {:?}, unexplained duplicates {:?}, rows not SUCCESS {left}",
            lost.iter().take(10).collect::<Vec<_>>(),
            unexplained.iter().take(10).collect::<Vec<_>>()
        );
    }
    ok
}
