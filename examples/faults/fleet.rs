//! `--fleet`: a fleet of shard databases split by several `outboxd` under faults.
//!
//! `--shards` databases on the one MariaDB (shard 0 reached by the relays through a TCP proxy,
//! `tests/it/proxy.rs`), `--instances` `outboxd run` processes over the whole fleet that split it
//! through a coordination database (`shard.coordination.url`, `docs/fleet.md`). Writers commit
//! events to every shard, directly, while: a random relay is SIGKILLed every `--kill-gap-ms` (and
//! started again, a new incarnation), the broker is SIGKILLed and restarted once, and shard 0's
//! connections are stalled (3 s) and dropped (2 s) in turn through the proxy. Then it waits until
//! every shard has sent every committed row, reads the topic back (events told apart by their
//! business key, unique across the fleet) and checks: nothing lost, no FAIL row, every shard
//! drained, and every duplicate explained row by row as in the other modes (copies <= 1 +
//! retry_count + the row's claim-lost audits in its shard).

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::time::{Duration, Instant};

use mysql::prelude::Queryable;
use mysql::{Opts, OptsBuilder, Pool, TxOpts};
use parking_lot::Mutex;
use rand::Rng;

use outbox::rocketmq::testing;
use outbox::{wire, NewEvent};

use super::proxy::{Mode, Proxy};
use super::{script, start_broker, tail, Args, Instance, Res};

/// The fleet: its databases, the proxy in front of shard 0, the relays' settings.
struct Fleet {
    args: Args,
    server: String,
    dbs: Vec<String>,
    pools: Vec<Pool>,
    coordination: String,
    proxy: Proxy,
    topic: String,
    group: String,
    dir: PathBuf,
    started: Instant,
}

impl Fleet {
    fn new(args: &Args) -> Res<Fleet> {
        let run = format!("{:06x}", rand::random::<u32>() & 0xff_ffff);
        let server = Pool::new(Opts::from_url(&args.server)?)?;
        let mut c = server.get_conn()?;
        let dbs: Vec<String> = (0..args.shards)
            .map(|i| format!("outbox_faults_fleet_{run}_{i}"))
            .collect();
        let coordination = format!("outbox_faults_fleet_{run}_coord");
        let mut pools = Vec::new();
        for db in &dbs {
            c.query_drop(format!("CREATE DATABASE {db}"))?;
            let opts = OptsBuilder::from_opts(Opts::from_url(&format!("{}/{db}", args.server))?)
                .tcp_connect_timeout(Some(Duration::from_secs(3)))
                .read_timeout(Some(Duration::from_secs(30)))
                .write_timeout(Some(Duration::from_secs(30)))
                .pool_opts(
                    mysql::PoolOpts::default().with_constraints(mysql::PoolConstraints::new(1, 4).expect("1 <= 4")),
                );
            let pool = Pool::new(opts)?;
            outbox::migrate(&pool)?;
            pools.push(pool);
        }
        c.query_drop(format!("CREATE DATABASE {coordination}"))?;
        let upstream = super::host_port_of_url(&args.server).ok_or("--mysql names no host:port")?;
        let dir = std::env::temp_dir().join(format!("outbox-faults-fleet-{run}"));
        std::fs::create_dir_all(&dir)?;
        let f = Fleet {
            args: args.clone(),
            server: args.server.clone(),
            dbs,
            pools,
            coordination,
            proxy: Proxy::start(&upstream),
            topic: format!("OUTBOX_FAULTS_FLEET_{}", run.to_uppercase()),
            group: format!("outbox_faults_fleet_{run}"),
            dir,
            started: Instant::now(),
        };
        println!(
            "fleet of {} shards ({}_0 through the proxy on port {}) | coordination {} | topic {} | claim.strategy {} | lease {} ms | logs in {}",
            args.shards,
            f.dbs[0].trim_end_matches("_0"),
            f.proxy.port,
            f.coordination,
            f.topic,
            args.strategy,
            args.lease_ms,
            f.dir.display()
        );
        Ok(f)
    }

    fn t(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// The `shards` value: shard 0 through the proxy, the others directly.
    fn shards_setting(&self) -> String {
        let mut urls = vec![self.proxy.url(&self.dbs[0])];
        urls.extend(self.dbs[1..].iter().map(|db| format!("{}/{db}", self.server)));
        urls.join(",")
    }

    /// Starts `outboxd run` over the fleet as relay `slot`, incarnation `gen`; waits until its
    /// metrics endpoint answers.
    fn spawn(&self, slot: usize, gen: u32) -> Res<Instance> {
        let id = format!("fleet-{slot}-g{gen}-{:04x}", rand::random::<u16>());
        let place = [
            ("OUTBOX_SHARDS", self.shards_setting()),
            (
                "OUTBOX_SHARD_COORDINATION_URL",
                format!("{}/{}", self.server, self.coordination),
            ),
            ("OUTBOX_SHARD_LEASE_MS", self.args.lease_ms.to_string()),
            ("OUTBOX_TOPIC", self.topic.clone()),
        ];
        Instance::start(&self.args, &self.dir, id, &self.group, &place, &[])
    }

    /// Rows of every shard not sent yet (WAIT or SENDING).
    fn pending(&self) -> Res<u64> {
        let mut n = 0;
        for p in &self.pools {
            n += p
                .get_conn()?
                .query_first::<u64, _>("SELECT COUNT(*) FROM t_event_record WHERE status IN ('WAIT', 'SENDING')")?
                .unwrap_or(0);
        }
        Ok(n)
    }

    fn drop_dbs(&self) {
        if let Ok(server) = Pool::new(Opts::from_url(&self.server).unwrap()) {
            if let Ok(mut c) = server.get_conn() {
                for db in self.dbs.iter().chain([&self.coordination]) {
                    let _ = c.query_drop(format!("DROP DATABASE IF EXISTS {db}"));
                }
            }
        }
    }
}

/// One committed event: its shard and row id.
type Committed = HashMap<String, (usize, u64)>;

/// Writers committing `total` events round-robin over the shards within about `span`, each in
/// its own transaction straight to its shard (not through the proxy). Returns what committed; a
/// commit whose outcome is unknown is looked up by its business key.
fn write(fleet: &Fleet, total: usize, span: Duration, errors: &Mutex<Vec<String>>) -> Committed {
    let committed = Mutex::new(Committed::new());
    let writers = fleet.args.writers;
    let per = total / writers;
    let gap = span / per.max(1) as u32;
    std::thread::scope(|s| {
        for w in 0..writers {
            let (committed, pools) = (&committed, &fleet.pools);
            s.spawn(move || {
                for i in 0..per {
                    let n = w * per + i;
                    let shard = n % pools.len();
                    let biz = format!("F{shard}-{w}-{i}");
                    let ev = NewEvent::new(&biz, "FLEET", format!("{{\"n\":{n}}}"));
                    let done = (|| -> Res<u64> {
                        let mut c = pools[shard].get_conn()?;
                        let mut tx = c.start_transaction(TxOpts::default())?;
                        let id = outbox::enqueue_in_tx(&mut tx, &ev)?;
                        tx.commit()?;
                        Ok(id)
                    })();
                    match done {
                        Ok(id) => {
                            committed.lock().insert(biz, (shard, id));
                        }
                        Err(e) => errors.lock().push(format!("{biz}: {e}")),
                    }
                    std::thread::sleep(gap);
                }
            });
        }
    });
    committed.into_inner()
}

pub(crate) fn fleet_run(args: &Args) -> Res<bool> {
    let fleet = Fleet::new(args)?;
    let mut relays = Vec::new();
    for slot in 0..args.instances {
        relays.push(fleet.spawn(slot, 0)?);
    }
    let mut gens = vec![0u32; args.instances];
    let span = Duration::from_millis(args.kill_gap_ms) * (args.kills as u32 + 1);
    let writing = AtomicBool::new(true);
    let errors = Mutex::new(Vec::new());
    let (mut kills, mut broker_kills, mut proxy_faults) = (0usize, 0usize, 0usize);
    let mut broker_down = Duration::ZERO;
    let committed = std::thread::scope(|s| -> Res<Committed> {
        let writer = s.spawn(|| {
            let c = write(&fleet, args.events, span, &errors);
            writing.store(false, SeqCst);
            c
        });
        // Shard 0's database, as the relays see it: stalled, then dropped, then back, in turn.
        let proxy = s.spawn(|| {
            let mut n = 0;
            while writing.load(SeqCst) {
                for (mode, secs) in [(Mode::Stall, 3), (Mode::Pass, 2), (Mode::Drop, 2), (Mode::Pass, 3)] {
                    if !writing.load(SeqCst) {
                        break;
                    }
                    fleet.proxy.set(mode);
                    if mode != Mode::Pass {
                        n += 1;
                        println!("  {:>6.1} s  shard 0 {mode:?} for {secs} s", fleet.t());
                    }
                    std::thread::sleep(Duration::from_secs(secs));
                }
            }
            fleet.proxy.set(Mode::Pass);
            n
        });
        let mut rng = rand::rng();
        for k in 0..args.kills {
            std::thread::sleep(Duration::from_millis(args.kill_gap_ms));
            if args.broker_kill && k == args.kills / 2 {
                script(&["kill-broker"])?;
                let down = Instant::now();
                println!("  {:>6.1} s  broker SIGKILLed", fleet.t());
                start_broker()?;
                broker_down = down.elapsed();
                broker_kills += 1;
                println!(
                    "  {:>6.1} s  broker back (down {:.1} s)",
                    fleet.t(),
                    broker_down.as_secs_f64()
                );
            }
            let slot = rng.random_range(0..relays.len());
            relays[slot].sigkill()?;
            kills += 1;
            println!("  {:>6.1} s  SIGKILL relay {slot} ({})", fleet.t(), relays[slot].id);
            gens[slot] += 1;
            relays[slot] = fleet.spawn(slot, gens[slot])?;
        }
        let committed = writer.join().expect("writers");
        proxy_faults = proxy.join().expect("proxy");
        Ok(committed)
    })?;
    let errors = errors.into_inner();
    println!(
        "  {:>6.1} s  writers done: {} committed, {} failed",
        fleet.t(),
        committed.len(),
        errors.len()
    );

    // Drained: every shard has sent what it committed.
    let deadline = Instant::now() + args.deadline;
    let drained_at = loop {
        let left = fleet.pending()?;
        if left == 0 {
            break Some(fleet.t());
        }
        if Instant::now() > deadline {
            println!("  not drained: {left} rows still pending at the deadline");
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let takes: u64 = Pool::new(Opts::from_url(&format!("{}/{}", fleet.server, fleet.coordination))?)?
        .get_conn()?
        .query_first("SELECT CAST(COALESCE(SUM(takes), 0) AS UNSIGNED) FROM outbox_fleet_shard")?
        .unwrap_or(0);
    for r in &mut relays {
        let _ = r.stop(Duration::from_secs(15));
    }

    // What every shard holds: each committed row's status, retry count and claim-lost audits.
    let mut status: HashMap<String, u64> = HashMap::new();
    let mut retry_of: HashMap<String, (u64, u64)> = HashMap::new();
    let mut undrained = Vec::new();
    let mut unexpected_rows = 0u64;
    for (shard, p) in fleet.pools.iter().enumerate() {
        let mut c = p.get_conn()?;
        let rows: Vec<(u64, String, String, u64)> =
            c.query("SELECT id, biz_no, status, retry_count FROM t_event_record")?;
        let lost: HashMap<u64, u64> = c
            .query_map(
                "SELECT event_id, COUNT(*) FROM outbox_audit WHERE action = 'claim-lost' GROUP BY event_id",
                |(id, n): (u64, u64)| (id, n),
            )?
            .into_iter()
            .collect();
        let mut success = 0;
        for (id, biz, st, retries) in rows {
            if committed.get(&biz) != Some(&(shard, id)) {
                unexpected_rows += 1;
            }
            success += u64::from(st == "SUCCESS");
            *status.entry(st).or_default() += 1;
            retry_of.insert(biz, (retries, lost.get(&id).copied().unwrap_or(0)));
        }
        let mine = committed.values().filter(|(s, _)| *s == shard).count() as u64;
        if success != mine {
            undrained.push(format!("shard {shard}: {success} of {mine} SUCCESS"));
        }
    }

    println!(
        "reading topic {} back ({} events expected) ...",
        fleet.topic,
        committed.len()
    );
    let back = testing::read_topic_by(
        &args.namesrv,
        &fleet.topic,
        committed.len(),
        Duration::from_secs(600),
        wire::BIZ_NO,
    )?;
    let mut copies: HashMap<&str, u64> = HashMap::new();
    let mut unexpected = 0u64;
    for m in &back.messages {
        match m.biz_no().and_then(|b| committed.get_key_value(b)) {
            Some((b, _)) => *copies.entry(b.as_str()).or_default() += 1,
            None => unexpected += 1,
        }
    }
    let lost = committed.len() - copies.len();
    let duplicates: u64 = copies.values().map(|c| c - 1).sum();
    let explained: Vec<(&str, u64, u64, u64)> = copies
        .iter()
        .filter_map(|(b, &n)| {
            let (retries, audits) = retry_of.get(*b).copied().unwrap_or((0, 0));
            (n > 1 + retries + audits).then_some((*b, n, retries, audits))
        })
        .collect();
    let dup_shards: HashSet<usize> = copies
        .iter()
        .filter(|(_, &n)| n > 1)
        .filter_map(|(b, _)| committed.get(*b).map(|(s, _)| *s))
        .collect();
    let logs: Vec<String> = std::fs::read_dir(&fleet.dir)?
        .flatten()
        .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
        .collect();
    let named = |what: &str| logs.iter().map(|l| l.matches(what).count()).sum::<usize>();
    let st = |k: &str| status.get(k).copied().unwrap_or(0);

    println!();
    println!("summary");
    println!(
        "  committed            {} over {} shards ({} writes failed)",
        committed.len(),
        args.shards,
        errors.len()
    );
    println!("  delivered            {} distinct events read back", copies.len());
    println!("  lost                 {lost}");
    println!(
        "  rows                 SUCCESS {} WAIT {} SENDING {} FAIL {} | unexpected {unexpected_rows} | drained at {}",
        st("SUCCESS"),
        st("WAIT"),
        st("SENDING"),
        st("FAIL"),
        drained_at
            .map(|t| format!("{t:.1} s"))
            .unwrap_or_else(|| "never".into())
    );
    println!(
        "  duplicates           {duplicates} on {} shards; over copies <= 1 + retry_count + claim-lost audits: {}",
        dup_shards.len(),
        explained.len()
    );
    println!(
        "  faults               {kills} relay SIGKILLs, {broker_kills} broker kill (down {:.1} s), shard 0 stalled or dropped {proxy_faults} times; shards taken {takes} times in all",
        broker_down.as_secs_f64()
    );
    println!(
        "  relays (logs)        database work failed {} | shard starts that failed {} | coordination failures {} | watch failures {}",
        named("failed: database error"),
        named("cannot start"),
        named("none is taken over"),
        named("fleet watch: server")
    );
    println!(
        "fleet shards={} committed={} delivered={} lost={lost} fail_rows={} duplicates={duplicates} unexplained={} kills={kills} broker_kills={broker_kills} proxy_faults={proxy_faults} takes={takes}",
        args.shards,
        committed.len(),
        copies.len(),
        st("FAIL"),
        explained.len()
    );

    let mut violations = Vec::new();
    let mut check = |ok: bool, what: String| {
        if !ok {
            violations.push(what);
        }
    };
    check(lost == 0, format!("{lost} committed events were never delivered"));
    check(st("FAIL") == 0, format!("{} rows ended FAIL", st("FAIL")));
    check(undrained.is_empty(), format!("shards not drained: {undrained:?}"));
    check(
        unexpected == 0 && unexpected_rows == 0,
        format!("unexpected messages {unexpected}, unexpected rows {unexpected_rows}"),
    );
    check(
        explained.is_empty(),
        format!(
            "events delivered more often than 1 + retry_count + claim-lost audits (biz_no, copies, retry_count, audits): {:?}",
            &explained[..explained.len().min(10)]
        ),
    );
    check(
        kills >= args.kills,
        format!("only {kills} of {} kills happened", args.kills),
    );
    check(
        broker_kills == usize::from(args.broker_kill),
        format!("broker kills: {broker_kills}"),
    );
    check(proxy_faults > 0, "shard 0 was never stalled or dropped".into());
    check(errors.is_empty(), format!("writers failed: {errors:?}"));
    check(
        !back.timed_out,
        format!("the read-back timed out with {} distinct", back.distinct),
    );
    for v in &violations {
        println!("VIOLATION: {v}");
    }
    if violations.is_empty() {
        println!("OK: nothing lost, every shard drained, no FAIL row, every duplicate explained");
        if !args.keep {
            fleet.drop_dbs();
            let _ = std::fs::remove_dir_all(&fleet.dir);
        }
    } else {
        for r in &relays {
            println!("last lines of {}:\n{}", r.log.display(), tail(&r.log, 10));
        }
        println!("kept the databases and logs in {}", fleet.dir.display());
    }
    Ok(violations.is_empty())
}
