//! `--points`: the points service end to end, the consuming half under faults.
//!
//! Orders are committed with their events (some transactions rolled back on purpose), relayed
//! by `--instances` `outboxd run` processes, and consumed by `--consumers` consumer processes
//! (this binary with `--consume`) that credit points in the same transaction as the inbox mark.
//! Meanwhile relays and consumers are SIGKILLed at random moments (and restarted), and the broker
//! is SIGKILLed and restarted once. At the end every committed order must be credited exactly
//! once (per order and in sum), nothing of a rolled-back transaction credited, no dead letter;
//! the duplicates that reached the consumers are counted (and were absorbed by the inbox).
//!
//! The consumers run with their defaults (batches on). Some orders fail the first time a consumer
//! process handles them ("flaky": the batch rolls back, is handled one message at a time, and the
//! order is retried); a few fail every time until they are cured ("poison": parked in the dead
//! letters after `consumer.max.attempts`, the queue going on). A third consumer joins the group
//! for the middle third of the run and leaves it. At the end the poison is cured and the parked
//! orders are replayed by `outboxd dead-letters replay --consumer-group`, as an operator would.
//!
//! The relays are [`Env::spawn`]'s: `claim.strategy` of `--strategy` (held by default) and
//! `sent.rows = keep`, since the check reads every committed row SUCCESS from the table.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mysql::prelude::Queryable;
use mysql::{Opts, Pool};
use rand::Rng;

use outbox::consumer::{Consumer, ConsumerConfig, ConsumerStats, HandlerError, Message};
use outbox::rocketmq::{RocketMqSource, SourceConfig};

use super::{kill_child, script, start_broker, start_writers, stop_child, tail, Args, Env, Instance, Res};

/// The consumer group of the points service.
const GROUP_PREFIX: &str = "points";

/// The points an order earns: derived from its `biz_no`, so the check needs no other record.
pub fn points_of(biz: &str) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in biz.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    1 + (h % 100) as i64
}

/// What the handler does with an order, from its `biz_no` (so the check needs no other record).
#[derive(PartialEq)]
enum Kind {
    Normal,
    /// Fails the first time a consumer process handles it (about 3 % of orders).
    Flaky,
    /// Fails every time until `points_cure` holds a row (about 1 order in 2 000).
    Poison,
}

fn kind_of(biz: &str) -> Kind {
    let h = biz
        .bytes()
        .fold(7u64, |h, b| h.wrapping_mul(131).wrapping_add(b as u64));
    match h % 2000 {
        0 => Kind::Poison,
        1..=60 => Kind::Flaky,
        _ => Kind::Normal,
    }
}

/// The flaky orders this process has failed once.
static FAILED_ONCE: std::sync::LazyLock<std::sync::Mutex<std::collections::HashSet<String>>> =
    std::sync::LazyLock::new(Default::default);

/// The handler: one credit row per order (no unique key, so a double credit would show).
fn credit(tx: &mut mysql::Transaction<'_>, m: &Message) -> Result<(), HandlerError> {
    let biz = m.biz_no().ok_or("message without a bizNo property")?.to_string();
    match kind_of(&biz) {
        Kind::Flaky if FAILED_ONCE.lock().unwrap().insert(biz.clone()) => {
            return Err(format!("order {biz}: its first attempt fails on purpose").into());
        }
        Kind::Poison => {
            let cured: Option<u64> = tx.query_first("SELECT COUNT(*) FROM points_cure")?;
            if cured.unwrap_or(0) == 0 {
                return Err(format!("order {biz}: poison until points_cure has a row").into());
            }
        }
        _ => {}
    }
    tx.exec_drop(
        "INSERT INTO points_credits (biz_no, points, event_key) VALUES (?, ?, ?)",
        (&biz, points_of(&biz), &m.key),
    )?;
    Ok(())
}

/// `--consume`: one consumer process. Writes its counters to `stats` (JSON, replaced every
/// 200 ms) until SIGTERM, then stops cleanly.
pub fn consume(db_url: &str, namesrv: &str, topic: &str, group: &str, stats: &str) -> Res<()> {
    let pool = Pool::new(Opts::from_url(db_url)?)?;
    let source = RocketMqSource::start(&SourceConfig::new(namesrv, topic, group))?;
    let mut cfg = ConsumerConfig::new(group);
    cfg.backoff_max = Duration::from_secs(2);
    let consumer = Consumer::start(cfg, pool, Arc::new(source), Arc::new(credit))?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    let write = |s: &ConsumerStats| -> Res<()> {
        let tmp = format!("{stats}.tmp");
        std::fs::write(
            &tmp,
            serde_json::json!({"received": s.received, "processed": s.processed, "duplicates": s.duplicates,
                "dead_lettered": s.dead_lettered, "failed_attempts": s.failed_attempts, "db_errors": s.db_errors,
                "transactions": s.transactions, "batch_fallbacks": s.batch_fallbacks, "replayed": s.replayed})
            .to_string(),
        )?;
        std::fs::rename(tmp, stats)?;
        Ok(())
    };
    while !stop.load(SeqCst) {
        write(&consumer.stats())?;
        std::thread::sleep(Duration::from_millis(200));
    }
    let s = consumer.stop();
    write(&s)?;
    Ok(())
}

struct ConsumerProc {
    id: String,
    child: Child,
    log: PathBuf,
    stats: PathBuf,
}

impl ConsumerProc {
    fn spawn(env: &Env, group: &str, slot: usize, gen: u32) -> Res<ConsumerProc> {
        let id = format!("consumer-{slot}-g{gen}");
        let log = env.dir.join(format!("{id}.log"));
        let stats = env.dir.join(format!("{id}.json"));
        let f = std::fs::File::create(&log)?;
        let child = Command::new(std::env::current_exe()?)
            .args(["--consume", "--db-url", &env.url, "--namesrv", &env.args.namesrv])
            .args(["--topic", &env.topic, "--group", group, "--stats-file"])
            .arg(&stats)
            .env(
                "RUST_LOG",
                std::env::var("OUTBOX_FAULTS_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(f.try_clone()?)
            .stderr(f)
            .spawn()?;
        Ok(ConsumerProc { id, child, log, stats })
    }

    fn figures(&self) -> Option<serde_json::Value> {
        serde_json::from_str(&std::fs::read_to_string(&self.stats).ok()?).ok()
    }

    fn sigkill(&mut self) -> Res<()> {
        kill_child(&mut self.child)
    }

    fn stop(&mut self, limit: Duration) -> Res<Option<i32>> {
        stop_child(&mut self.child, &self.id, limit)
    }
}

impl Drop for ConsumerProc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = kill_child(&mut self.child);
        }
    }
}

enum Who {
    Relay(usize),
    Consumer(usize),
}

pub fn points_run(args: &Args) -> Res<bool> {
    let env = Env::new(args, "points")?;
    env.conn()?.query_drop(
        "CREATE TABLE points_credits (seq BIGINT AUTO_INCREMENT PRIMARY KEY, biz_no VARCHAR(64) NOT NULL, \
         points BIGINT NOT NULL, event_key VARBINARY(255) NOT NULL, KEY (biz_no))",
    )?;
    env.conn()?
        .query_drop("CREATE TABLE points_cure (cured INT NOT NULL)")?;
    let group = format!("{GROUP_PREFIX}_{}", env.group);
    let mut rng = rand::rng();
    let gap = Duration::from_millis(args.kill_gap_ms);
    let mut plan: Vec<Duration> = Vec::new();
    let mut t = Duration::from_millis(1500);
    for _ in 0..args.kills {
        t += gap.mul_f64(rng.random_range(0.5..1.5));
        plan.push(t);
    }
    let span = (gap * args.kills.max(3) as u32).max(t);
    let broker_at = span.mul_f64(0.4);
    let (join_at, leave_at) = (span.mul_f64(0.3), span.mul_f64(0.7));
    let mut joiner: Option<ConsumerProc> = None;
    let mut joined = false;
    let mut cured = false;
    println!(
        "points service: {} relay(s), {} consumer(s), {} writer(s), {} events over ~{:.0} s; {} kills (relays and consumers), broker kill {}",
        args.instances,
        args.consumers,
        args.writers,
        args.events,
        span.as_secs_f64(),
        args.kills,
        if args.broker_kill { "yes" } else { "no" }
    );
    let mut relays: Vec<Option<Instance>> = (0..args.instances)
        .map(|s| env.spawn(s, 0).map(Some))
        .collect::<Res<_>>()?;
    let mut consumers: Vec<Option<ConsumerProc>> = (0..args.consumers)
        .map(|s| ConsumerProc::spawn(&env, &group, s, 0).map(Some))
        .collect::<Res<_>>()?;
    let mut relay_gen = vec![0u32; args.instances];
    let mut consumer_gen = vec![0u32; args.consumers];
    // Figures of consumer incarnations that ended (killed: their last report).
    let mut ended: Vec<serde_json::Value> = Vec::new();
    let mut logs: Vec<PathBuf> = consumers.iter().flatten().map(|c| c.log.clone()).collect();
    let writers = start_writers(&env, args.writers, args.events, span.mul_f64(0.9));
    let run_start = Instant::now();
    let mut restarts: Vec<(Instant, Who)> = Vec::new();
    let mut broker_done = !args.broker_kill;
    let mut broker_back: Option<std::thread::JoinHandle<Result<(), String>>> = None;
    let (mut relay_kills, mut consumer_kills) = (0, 0);
    let deadline = Instant::now() + args.deadline;
    let mut last_print = Instant::now();
    plan.reverse();
    let finished = loop {
        let now = Instant::now();
        let (due, later): (Vec<_>, Vec<_>) = restarts.drain(..).partition(|(at, _)| *at <= now);
        restarts = later;
        for (_, who) in due {
            match who {
                Who::Relay(s) => {
                    relay_gen[s] += 1;
                    relays[s] = Some(env.spawn(s, relay_gen[s])?);
                    println!("  {:>6.1} s  relay slot {s} restarted", env.t());
                }
                Who::Consumer(s) => {
                    consumer_gen[s] += 1;
                    let c = ConsumerProc::spawn(&env, &group, s, consumer_gen[s])?;
                    logs.push(c.log.clone());
                    consumers[s] = Some(c);
                    println!("  {:>6.1} s  consumer slot {s} restarted", env.t());
                }
            }
        }
        if plan.last().is_some_and(|at| run_start.elapsed() >= *at) {
            plan.pop();
            // Relays and consumers alike; never the last live one of its kind.
            let relay_alive: Vec<usize> = (0..relays.len()).filter(|&s| relays[s].is_some()).collect();
            let cons_alive: Vec<usize> = (0..consumers.len()).filter(|&s| consumers[s].is_some()).collect();
            let pick_consumer = rng.random_bool(0.5);
            if pick_consumer && !cons_alive.is_empty() {
                let s = cons_alive[rng.random_range(0..cons_alive.len())];
                let mut c = consumers[s].take().unwrap();
                c.sigkill()?;
                if let Some(f) = c.figures() {
                    ended.push(f);
                }
                consumer_kills += 1;
                println!("  {:>6.1} s  SIGKILL {}", env.t(), c.id);
                restarts.push((
                    Instant::now() + Duration::from_millis(rng.random_range(0..1500)),
                    Who::Consumer(s),
                ));
            } else if !relay_alive.is_empty() {
                let s = relay_alive[rng.random_range(0..relay_alive.len())];
                let mut r = relays[s].take().unwrap();
                r.sigkill()?;
                relay_kills += 1;
                println!("  {:>6.1} s  SIGKILL relay {}", env.t(), r.id);
                restarts.push((
                    Instant::now() + Duration::from_millis(rng.random_range(0..1500)),
                    Who::Relay(s),
                ));
            }
        }
        if !joined && run_start.elapsed() >= join_at {
            joined = true;
            let c = ConsumerProc::spawn(&env, &group, args.consumers, 0)?;
            logs.push(c.log.clone());
            println!("  {:>6.1} s  {} joins the group", env.t(), c.id);
            joiner = Some(c);
        }
        if run_start.elapsed() >= leave_at {
            if let Some(mut c) = joiner.take() {
                let code = c.stop(Duration::from_secs(30))?;
                if let Some(f) = c.figures() {
                    ended.push(f);
                }
                println!("  {:>6.1} s  {} left the group (exit {code:?})", env.t(), c.id);
            }
        }
        if !broker_done && run_start.elapsed() >= broker_at {
            broker_done = true;
            script(&["kill-broker"])?;
            println!("  {:>6.1} s  broker SIGKILLed", env.t());
            let down_for = Duration::from_millis(rng.random_range(3000..6000));
            let started = env.started;
            broker_back = Some(std::thread::spawn(move || {
                std::thread::sleep(down_for);
                start_broker().map_err(|e| e.to_string())?;
                println!("  {:>6.1} s  broker back", started.elapsed().as_secs_f64());
                Ok(())
            }));
        }
        if broker_back.as_ref().is_some_and(|h| h.is_finished()) {
            broker_back
                .take()
                .unwrap()
                .join()
                .map_err(|_| "broker restart panicked")??;
        }
        let writers_done = writers.handles.iter().all(|h| h.is_finished());
        let rows: u64 = env.count("1").unwrap_or(0);
        let sent: u64 = env.count("status = 'SUCCESS'").unwrap_or(0);
        let credited = env
            .scalar("SELECT COUNT(DISTINCT biz_no) FROM points_credits")
            .unwrap_or(0);
        if last_print.elapsed() >= Duration::from_secs(2) {
            println!(
                "  {:>6.1} s  committed {rows:>6}  sent {sent:>6}  credited {credited:>6}  | kills {}/{}",
                env.t(),
                relay_kills + consumer_kills,
                args.kills
            );
            last_print = Instant::now();
        }
        let quiet = writers_done
            && plan.is_empty()
            && restarts.is_empty()
            && broker_back.is_none()
            && joined
            && joiner.is_none();
        // Orders parked in the dead letters (asked only once the run is quiet).
        let parked = if quiet {
            env.scalar("SELECT COUNT(DISTINCT event_key) FROM outbox_inbox_dead_letter")
                .unwrap_or(0)
        } else {
            0
        };
        // Every order credited or parked: cure the poison and replay the parked ones, as an
        // operator would.
        if quiet && !cured && rows > 0 && credited + parked == rows {
            env.conn()?.query_drop("INSERT INTO points_cure VALUES (1)")?;
            let out = Command::new(&args.outboxd)
                .env_remove("OUTBOX_CONFIG")
                .env("OUTBOX_DB_URL", &env.url)
                .args([
                    "dead-letters",
                    "replay",
                    "--consumer-group",
                    &group,
                    "--all",
                    "--actor",
                    "faults",
                ])
                .stdin(Stdio::null())
                .output()?;
            if !out.status.success() {
                return Err(format!(
                    "outboxd dead-letters replay failed ({}): {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                )
                .into());
            }
            println!(
                "  {:>6.1} s  poison cured; {parked} parked order(s) replayed: {}",
                env.t(),
                String::from_utf8_lossy(&out.stdout).trim()
            );
            cured = true;
        }
        if quiet && cured && rows > 0 && credited == rows && parked == 0 {
            break true;
        }
        if Instant::now() > deadline {
            println!(
                "  deadline of {:?} passed before every order was credited",
                args.deadline
            );
            break false;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    for h in writers.handles {
        h.join().map_err(|_| "a writer panicked")??;
    }
    for r in relays.iter_mut().flatten() {
        r.stop(Duration::from_secs(20))?;
    }
    let mut live = Vec::new();
    for c in consumers.iter_mut().flatten() {
        let code = c.stop(Duration::from_secs(30))?;
        if code != Some(0) {
            eprintln!("  {} exited with {code:?}; last lines:\n{}", c.id, tail(&c.log, 10));
        }
        if let Some(f) = c.figures() {
            live.push(f);
        }
    }

    // The checks, against what the database says was committed.
    let mut conn = env.conn()?;
    let committed: Vec<(String, String)> = conn.query("SELECT biz_no, status FROM t_event_record")?;
    let credits: Vec<(String, u64, i64)> =
        conn.query("SELECT biz_no, COUNT(*), SUM(points) FROM points_credits GROUP BY biz_no")?;
    let credit_of: HashMap<String, (u64, i64)> = credits.into_iter().map(|(b, n, p)| (b, (n, p))).collect();
    let ledger = writers.ledger.lock();
    let mut never = 0u64;
    let mut twice = 0u64;
    let mut wrong_points = 0u64;
    let mut expected_sum = 0i64;
    for (biz, _) in &committed {
        expected_sum += points_of(biz);
        match credit_of.get(biz) {
            None => never += 1,
            Some((n, _)) if *n > 1 => twice += 1,
            Some((_, p)) if *p != points_of(biz) => wrong_points += 1,
            Some(_) => {}
        }
    }
    let committed_set: std::collections::HashSet<&str> = committed.iter().map(|(b, _)| b.as_str()).collect();
    let foreign = credit_of.keys().filter(|b| !committed_set.contains(b.as_str())).count();
    let rolled_back_credited = credit_of
        .keys()
        .filter(|b| ledger.rolled_back.contains(*b) || ledger.failed.contains(*b))
        .count();
    let sum: i64 = credit_of.values().map(|(_, p)| p).sum();
    let marks: u64 = conn
        .query_first(format!(
            "SELECT COUNT(*) FROM outbox_inbox WHERE consumer_group = '{group}'"
        ))?
        .unwrap_or(0);
    let dead: u64 = conn
        .query_first("SELECT COUNT(*) FROM outbox_inbox_dead_letter")?
        .unwrap_or(0);
    let not_sent = committed.iter().filter(|(_, s)| s != "SUCCESS").count();
    let field = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap_or(0);
    let all_figures: Vec<&serde_json::Value> = ended.iter().chain(live.iter()).collect();
    // A figure summed over every consumer incarnation.
    let total = |k: &str| -> u64 { all_figures.iter().map(|v| field(v, k)).sum() };
    let received = total("received");
    let processed = total("processed");
    let duplicates = total("duplicates");
    let db_errors = total("db_errors");
    let failed_attempts = total("failed_attempts");
    let dead_lettered = total("dead_lettered");
    let replayed = total("replayed");
    let transactions = total("transactions");
    let fallbacks = total("batch_fallbacks");
    let flaky = committed.iter().filter(|(b, _)| kind_of(b) == Kind::Flaky).count();
    let poison = committed.iter().filter(|(b, _)| kind_of(b) == Kind::Poison).count();

    println!();
    println!("points service summary");
    println!("  orders committed            {}", committed.len());
    println!("  rolled back on purpose      {}", ledger.rolled_back.len());
    println!(
        "  relays / consumers killed   {relay_kills} / {consumer_kills} (broker killed once: {})",
        args.broker_kill
    );
    println!(
        "  credited exactly once       {}",
        committed.len() as u64 - never - twice - wrong_points
    );
    println!("  never credited              {never}");
    println!("  credited more than once     {twice}");
    println!("  credited with wrong points  {wrong_points}");
    println!("  credits of no committed order {foreign} (of rolled-back ones {rolled_back_credited})");
    println!("  points: sum {sum}, expected {expected_sum}");
    println!("  inbox marks                 {marks}");
    println!("  dead letters                {dead}");
    println!("  rows not SUCCESS            {not_sent}");
    println!(
        "  consumers reported: received {received}, processed {processed}, duplicates absorbed {duplicates}, database retries {db_errors}"
    );
    println!(
        "  handler failures on purpose flaky orders {flaky} (fail once per process), poison orders {poison}: failed attempts {failed_attempts}, parked {dead_lettered}, replayed {replayed}"
    );
    println!(
        "  batches                     {transactions} transactions, {:.1} messages each, {fallbacks} rolled back and handled one at a time",
        (processed + duplicates) as f64 / transactions.max(1) as f64
    );
    println!("    (figures of killed consumers are their last report, up to 200 ms old)");
    let ok = finished
        && never == 0
        && twice == 0
        && wrong_points == 0
        && foreign == 0
        && sum == expected_sum
        && marks == committed.len() as u64
        && dead == 0
        && not_sent == 0;
    println!("  verdict                     {}", if ok { "OK" } else { "VIOLATIONS" });
    if ok && !args.keep {
        env.drop_db();
        let _ = std::fs::remove_dir_all(&env.dir);
    } else {
        println!("  kept database {} and logs in {}", env.db, env.dir.display());
    }
    Ok(ok)
}
