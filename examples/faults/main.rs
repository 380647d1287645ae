//! The fault suite behind `scripts/faults`: the real daemon, the real MariaDB and the real
//! broker, verified by consuming the topic.
//!
//! Default mode (`--events 100000 --instances 3 --kills 20`): creates its own database and
//! topic, starts K `outboxd run` processes, writers commit events concurrently (some
//! transactions rolled back on purpose), and meanwhile a random instance is SIGKILLed at random
//! moments (and restarted), MariaDB is restarted once, at a moment rows are in flight if one
//! comes within 2 s (`--no-db-restart` skips that), and the broker is SIGKILLed and restarted
//! once. Then it waits until every committed row is SUCCESS, reads the topic back and checks:
//! nothing lost, nothing rolled back delivered, no FAIL row, and duplicates bounded by the rows
//! that were in flight at the faults: SENDING rows under a lease, and under held claims the WAIT
//! rows a round has locked, named by its journal row in `outbox_claim`. Every duplicated event is
//! explained, row by row: copies <= 1 + retry_count + its claim-lost audits (a held round that
//! ended without recording its sends).
//!
//! The relays run with `claim.strategy` = `--strategy` (held, the default, unless told) and
//! `sent.rows = keep`: the harness reads every outcome from the table.
//!
//! `--stale-claim`: an instance is paused with SIGSTOP while it holds claimed rows, past its
//! lease; another instance takes them over and delivers them once the claim ended (a lease: it
//! expired and the rows are reclaimed; held: the server dropped the paused instance's idle
//! connection after its `wait_timeout`, the lease, and the locks went with it; the lost round is
//! audited as claim-lost); then SIGCONT. What the first instance does late must change nothing
//! (the rows stay SUCCESS under the other owner, same claim token): its late acks are fenced
//! (`outbox_stale_acks`), held its settle fails on the dropped connection
//! (`outbox_possible_duplicates`); and every event is delivered.
//!
//! `--points`: the points service (the consuming half): relays and consumer processes killed,
//! the broker killed; every committed order credited exactly once (`points.rs`).
//!
//! The `outboxd` binary is the one next to this example's profile directory
//! (`$CARGO_TARGET_DIR/<profile>/outboxd`); build it first:
//! `cargo build --release --features rocketmq,daemon --bin outboxd`.
//! Everything listens on and talks to 127.0.0.1 only.

use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mysql::prelude::Queryable;
use mysql::{Opts, OptsBuilder, Pool, TxOpts};
use parking_lot::Mutex;
use rand::Rng;

use outbox::rocketmq::testing;
use outbox::NewEvent;

mod fleet;
mod points;
#[path = "../../tests/it/proxy.rs"]
mod proxy;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const MARIADBD: &str = "/usr/sbin/mariadbd";

/// How long the MariaDB restart may wait for a moment with rows in flight.
const DB_WAITS_FOR_ROUND: Duration = Duration::from_secs(2);

/// The outbox table the relays work on (the default `table`).
const TABLE: &str = "t_event_record";

/// A held round's journal row (`outbox_claim`): the round locked these rows (still WAIT) and may
/// be sending them, or its connection died and no relay has recovered the row yet.
struct Journaled {
    token: u64,
    ids: Vec<u64>,
    /// By the database's clock.
    claimed_at: String,
}

/// The journal rows of the outbox table's held rounds, of `owner` or of every relay, claimed at
/// or before `claimed_by` (a database time plus a margin) when given.
fn journal_rows<Q: Queryable>(
    q: &mut Q,
    owner: Option<&str>,
    claimed_by: Option<(&str, Duration)>,
) -> Res<Vec<Journaled>> {
    let rows: Vec<(u64, String, String)> = q.exec(
        "SELECT token, ids, CAST(claimed_at AS CHAR) FROM outbox_claim WHERE table_name = ? \
         AND (? IS NULL OR owner = ?) \
         AND (? IS NULL OR claimed_at <= TIMESTAMPADD(MICROSECOND, ?, CAST(? AS DATETIME(3))))",
        (
            TABLE,
            owner,
            owner,
            claimed_by.map(|c| c.0),
            claimed_by.map(|c| c.1.as_micros() as u64),
            claimed_by.map(|c| c.0),
        ),
    )?;
    rows.into_iter()
        .map(|(token, text, claimed_at)| {
            let ids = outbox::store::decode_ids(&text)
                .ok_or_else(|| format!("outbox_claim row {token} names its rows as {text:?}, not an id list"))?;
            Ok(Journaled { token, ids, claimed_at })
        })
        .collect()
}

#[derive(Clone)]
struct Args {
    events: usize,
    instances: usize,
    kills: usize,
    writers: usize,
    db_restart: bool,
    broker_kill: bool,
    stale_claim: bool,
    points: bool,
    consumers: usize,
    /// `--fleet`: relays over a fleet of `shards` databases (`fleet.rs`).
    fleet: bool,
    shards: usize,
    cycles: usize,
    lease_ms: u64,
    kill_gap_ms: u64,
    deadline: Duration,
    server: String,
    namesrv: String,
    outboxd: PathBuf,
    keep: bool,
    sets: Vec<String>,
    /// `claim.strategy` of every relay (`OUTBOX_CLAIM_STRATEGY`): held (the default) or a lease.
    strategy: String,
}

fn usage() -> &'static str {
    "faults [--events N] [--instances K] [--kills N] [--writers W] [--no-db-restart] [--no-broker-kill]\n\
     \x20      [--stale-claim [--cycles N]] [--points [--consumers N]] [--fleet [--shards N]] [--lease-ms MS] [--kill-gap-ms MS] [--deadline-s S]\n\
     \x20      [--strategy held|skip-locked|per-row] [--mysql URL-without-db] [--namesrv host:port] [--outboxd PATH]\n\
     \x20      [--keep] [--set key=value]..."
}

fn parse_args() -> Result<Args, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    // target/<profile>/examples/faults -> target/<profile>/outboxd
    let default_outboxd = exe
        .parent()
        .and_then(Path::parent)
        .map(|p| p.join("outboxd"))
        .unwrap_or_else(|| PathBuf::from("outboxd"));
    let mut a = Args {
        events: 100_000,
        instances: 3,
        kills: 20,
        writers: 4,
        db_restart: true,
        broker_kill: true,
        stale_claim: false,
        points: false,
        consumers: 2,
        fleet: false,
        shards: 16,
        cycles: 3,
        lease_ms: 3000,
        kill_gap_ms: 3000,
        deadline: Duration::from_secs(1200),
        server: std::env::var("OUTBOX_FAULTS_MYSQL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306".into()),
        namesrv: std::env::var("OUTBOX_FAULTS_NAMESRV").unwrap_or_else(|_| "127.0.0.1:9876".into()),
        outboxd: std::env::var_os("OUTBOX_FAULTS_OUTBOXD")
            .map(PathBuf::from)
            .unwrap_or(default_outboxd),
        keep: false,
        sets: Vec::new(),
        strategy: "held".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        fn num<T: std::str::FromStr>(name: &str, v: String) -> Result<T, String> {
            v.parse().map_err(|_| format!("{name} {v:?} is not a whole number"))
        }
        match flag.as_str() {
            "--events" => a.events = num("--events", value("--events")?)?,
            "--instances" => a.instances = num("--instances", value("--instances")?)?,
            "--kills" => a.kills = num("--kills", value("--kills")?)?,
            "--writers" => a.writers = num("--writers", value("--writers")?)?,
            "--cycles" => a.cycles = num("--cycles", value("--cycles")?)?,
            "--lease-ms" => a.lease_ms = num("--lease-ms", value("--lease-ms")?)?,
            "--kill-gap-ms" => a.kill_gap_ms = num("--kill-gap-ms", value("--kill-gap-ms")?)?,
            "--deadline-s" => a.deadline = Duration::from_secs(num("--deadline-s", value("--deadline-s")?)?),
            "--no-db-restart" => a.db_restart = false,
            "--no-broker-kill" => a.broker_kill = false,
            "--stale-claim" => a.stale_claim = true,
            "--points" => a.points = true,
            "--consumers" => a.consumers = num("--consumers", value("--consumers")?)?,
            "--fleet" => a.fleet = true,
            "--shards" => a.shards = num("--shards", value("--shards")?)?,
            "--mysql" => a.server = value("--mysql")?,
            "--namesrv" => a.namesrv = value("--namesrv")?,
            "--outboxd" => a.outboxd = PathBuf::from(value("--outboxd")?),
            "--keep" => a.keep = true,
            "--set" => a.sets.push(value("--set")?),
            "--strategy" => a.strategy = value("--strategy")?,
            "-h" | "--help" => {
                println!("{}", usage());
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}\n{}", usage())),
        }
    }
    if a.events == 0 || a.instances == 0 || a.instances > 16 || a.writers == 0 || a.writers > 64 {
        return Err("--events, --instances (1-16) and --writers (1-64) must be positive".into());
    }
    if a.fleet && !(2..=64).contains(&a.shards) {
        return Err(format!("--shards {}: 2 to 64", a.shards));
    }
    if a.stale_claim && a.instances < 2 {
        a.instances = 2;
    }
    if !["held", "skip-locked", "per-row"].contains(&a.strategy.as_str()) {
        return Err(format!("--strategy {:?}: held, skip-locked or per-row", a.strategy));
    }
    if a.lease_ms < 400 {
        return Err("--lease-ms must be at least 400".into());
    }
    for host in [
        host_of_url(&a.server),
        a.namesrv.rsplit_once(':').map(|(h, _)| h.to_string()),
    ] {
        match host.as_deref() {
            Some("127.0.0.1") => {}
            other => return Err(format!("only 127.0.0.1 is allowed, not {other:?}")),
        }
    }
    if !a.outboxd.is_file() {
        return Err(format!(
            "{} not found: build it first with `cargo build --release --features rocketmq,daemon --bin outboxd` \
             (or pass --outboxd PATH)",
            a.outboxd.display()
        ));
    }
    Ok(a)
}

/// `host:port` of a `mysql://` URL (3306 when it names no port).
fn host_port_of_url(url: &str) -> Option<String> {
    let host = host_of_url(url)?;
    let rest = url.split_once("://")?.1;
    let authority = rest.split('/').next()?;
    let hostport = authority.rsplit('@').next()?;
    Some(match hostport.rsplit_once(':') {
        Some((_, port)) => format!("{host}:{port}"),
        None => format!("{host}:3306"),
    })
}

fn host_of_url(url: &str) -> Option<String> {
    let rest = url.split_once("://")?.1;
    let hostport = rest.rsplit_once('@').map(|(_, h)| h).unwrap_or(rest);
    let hostport = hostport.split('/').next()?;
    Some(
        hostport
            .rsplit_once(':')
            .map(|(h, _)| h)
            .unwrap_or(hostport)
            .to_string(),
    )
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("--consume") {
        let _ = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).try_init();
        std::process::exit(consume_main());
    }
    let _ = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("error")).try_init();
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("faults: {e}");
            std::process::exit(2);
        }
    };
    let result = if args.fleet {
        fleet::fleet_run(&args)
    } else if args.points {
        points::points_run(&args)
    } else if args.stale_claim {
        stale_claim(&args)
    } else {
        fault_run(&args)
    };
    match result {
        Ok(true) => {}
        Ok(false) => {
            eprintln!("faults: VIOLATIONS (see above)");
            std::process::exit(1);
        }
        Err(e) => {
            eprintln!("faults failed: {e}");
            std::process::exit(1);
        }
    }
}

/// `faults --consume --db-url URL --namesrv ADDR --topic T --group G --stats-file PATH`: one
/// consumer process of the `--points` run.
fn consume_main() -> i32 {
    let mut flags: HashMap<String, String> = HashMap::new();
    let mut it = std::env::args().skip(2);
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        flags.insert(k, v);
    }
    let get = |k: &str| flags.get(k).cloned().ok_or_else(|| format!("--consume needs {k}"));
    let run = || -> Res<()> {
        points::consume(
            &get("--db-url")?,
            &get("--namesrv")?,
            &get("--topic")?,
            &get("--group")?,
            &get("--stats-file")?,
        )
    };
    match run() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("consumer failed: {e}");
            1
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The environment: database, topic, outboxd processes, broker and MariaDB control.

struct Env {
    args: Args,
    db: String,
    url: String,
    pool: Pool,
    topic: String,
    group: String,
    dir: PathBuf,
    started: Instant,
}

impl Env {
    fn new(args: &Args, tag: &str) -> Res<Env> {
        let run = format!("{:06x}", rand::random::<u32>() & 0xff_ffff);
        let db = format!("outbox_faults_{tag}_{run}");
        let server = Pool::new(Opts::from_url(&args.server)?)?;
        server.get_conn()?.query_drop(format!("CREATE DATABASE {db}"))?;
        let url = format!("{}/{db}", args.server);
        let opts = OptsBuilder::from_opts(Opts::from_url(&url)?)
            .tcp_connect_timeout(Some(Duration::from_secs(3)))
            .read_timeout(Some(Duration::from_secs(30)))
            .write_timeout(Some(Duration::from_secs(30)));
        let pool = Pool::new(opts)?;
        outbox::migrate(&pool)?;
        pool.get_conn()?.query_drop(
            "CREATE TABLE faults_orders (order_no VARCHAR(64) PRIMARY KEY, events INT NOT NULL, \
             created DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3))",
        )?;
        let dir = std::env::temp_dir().join(format!("outbox-faults-{tag}-{run}"));
        std::fs::create_dir_all(&dir)?;
        let e = Env {
            args: args.clone(),
            db,
            url,
            pool,
            topic: format!("OUTBOX_FAULTS_{}", run.to_uppercase()),
            group: format!("outbox_faults_{run}"),
            dir,
            started: Instant::now(),
        };
        println!(
            "database {} | topic {} | claim.strategy {} | lease {} ms | logs in {}",
            e.db,
            e.topic,
            args.strategy,
            args.lease_ms,
            e.dir.display()
        );
        Ok(e)
    }

    fn t(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    fn conn(&self) -> Res<mysql::PooledConn> {
        Ok(self.pool.get_conn()?)
    }

    fn count(&self, cond: &str) -> Res<u64> {
        self.scalar(&format!("SELECT COUNT(*) FROM t_event_record WHERE {cond}"))
    }

    /// The one number `sql` selects (0 for no row).
    fn scalar(&self, sql: &str) -> Res<u64> {
        Ok(self.conn()?.query_first(sql)?.unwrap_or(0))
    }

    /// Rows in flight, of `owner` or of every relay: SENDING rows (claimed under a lease) and
    /// the rows named by held rounds' journal rows (WAIT, locked by a round that may be sending
    /// them, or left by a round whose connection died, until a relay recovers it). With
    /// `claimed_by` (a database time plus a margin), only rows claimed by then.
    fn in_flight_where(&self, owner: Option<&str>, claimed_by: Option<(&str, Duration)>) -> Res<HashSet<u64>> {
        let mut conn = self.conn()?;
        let sending: Vec<u64> = conn.exec(
            "SELECT id FROM t_event_record WHERE status = 'SENDING' AND (? IS NULL OR claim_owner = ?) \
             AND (? IS NULL OR claimed_at <= TIMESTAMPADD(MICROSECOND, ?, CAST(? AS DATETIME(3))))",
            (
                owner,
                owner,
                claimed_by.map(|c| c.0),
                claimed_by.map(|c| c.1.as_micros() as u64),
                claimed_by.map(|c| c.0),
            ),
        )?;
        let mut ids: HashSet<u64> = sending.into_iter().collect();
        for j in journal_rows(&mut conn, owner, claimed_by)? {
            ids.extend(j.ids);
        }
        Ok(ids)
    }

    fn in_flight(&self, owner: Option<&str>) -> Res<HashSet<u64>> {
        self.in_flight_where(owner, None)
    }

    /// The rows `owner` holds right now, each with the time its claim began (database clock):
    /// its SENDING rows (their `claimed_at`, moved on by each lease renewal) and the rows of its
    /// held rounds whose journal row it has locked (the journal row's `claimed_at`; a journal row
    /// nobody holds is a lost round, not a claim).
    fn holding(&self, owner: &str) -> Res<HashMap<u64, String>> {
        let mut conn = self.conn()?;
        let mut held: HashMap<u64, String> = conn
            .exec(
                "SELECT id, CAST(claimed_at AS CHAR) FROM t_event_record WHERE status = 'SENDING' AND claim_owner = ?",
                (owner,),
            )?
            .into_iter()
            .collect();
        let mut tx = conn.start_transaction(TxOpts::default())?;
        let all = journal_rows(&mut tx, Some(owner), None)?;
        // The unlocked ones: locking them for a moment delays nobody (a lost round's recovery
        // skips locked rows and comes back; a round locks its own row before it sends).
        let free: HashSet<u64> = tx
            .exec(
                "SELECT token FROM outbox_claim WHERE table_name = ? AND owner = ? FOR UPDATE SKIP LOCKED",
                (TABLE, owner),
            )?
            .into_iter()
            .collect();
        tx.rollback()?;
        for j in all.into_iter().filter(|j| !free.contains(&j.token)) {
            for id in j.ids {
                held.insert(id, j.claimed_at.clone());
            }
        }
        Ok(held)
    }

    /// Held rounds' journal rows on the outbox table, and the events they name.
    fn journal_counts(&self) -> Res<(u64, u64)> {
        let row: Option<(u64, u64)> = self.conn()?.exec_first(
            "SELECT COUNT(*), CAST(COALESCE(SUM(events), 0) AS UNSIGNED) FROM outbox_claim WHERE table_name = ?",
            (TABLE,),
        )?;
        Ok(row.unwrap_or((0, 0)))
    }

    fn by_status(&self) -> Res<HashMap<String, u64>> {
        let rows: Vec<(String, u64)> = self
            .conn()?
            .query("SELECT status, COUNT(*) FROM t_event_record GROUP BY status")?;
        Ok(rows.into_iter().collect())
    }

    fn drop_db(&self) {
        if let Ok(server) = Pool::new(Opts::from_url(&self.args.server).unwrap()) {
            if let Ok(mut c) = server.get_conn() {
                let _ = c.query_drop(format!("DROP DATABASE IF EXISTS {}", self.db));
            }
        }
    }

    /// Starts `outboxd run` as instance `slot`, incarnation `gen`, with its own instance id and
    /// metrics port; waits until its metrics endpoint answers (it has started relaying).
    fn spawn(&self, slot: usize, gen: u32) -> Res<Instance> {
        self.spawn_with(slot, gen, &[])
    }

    /// [`Env::spawn`] with extra settings (`key=value`, after the run's own).
    fn spawn_with(&self, slot: usize, gen: u32, extra: &[&str]) -> Res<Instance> {
        let id = format!("faults-{slot}-g{gen}-{:04x}", rand::random::<u16>());
        let place = [
            ("OUTBOX_DB_URL", self.url.clone()),
            ("OUTBOX_TOPIC", self.topic.clone()),
            ("OUTBOX_SCAN_INTERVAL_MS", "100".to_string()),
        ];
        Instance::start(&self.args, &self.dir, id, &self.group, &place, extra)
    }
}

struct Instance {
    id: String,
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Instance {
    /// Starts `outboxd run` as relay `id` (its log in `dir`, producer group `group`), with what
    /// every mode gives its relays (the run's claim strategy and lease, sent rows kept, a metrics
    /// port of its own, the broker), what it relays (`place`: the `OUTBOX_*` variables of its
    /// database or fleet and topic), the run's `--set`s and `extra`; waits until it listens.
    fn start(
        args: &Args,
        dir: &Path,
        id: String,
        group: &str,
        place: &[(&str, String)],
        extra: &[&str],
    ) -> Res<Instance> {
        let port = free_port()?;
        let log_path = dir.join(format!("{id}.log"));
        let log = std::fs::File::create(&log_path)?;
        let lease = args.lease_ms;
        let mut cmd = Command::new(&args.outboxd);
        cmd.env_remove("OUTBOX_CONFIG")
            .env_remove("OUTBOX_DB_URL")
            .env(
                "RUST_LOG",
                std::env::var("OUTBOX_FAULTS_LOG").unwrap_or_else(|_| "info".into()),
            )
            .env("OUTBOX_INSTANCE_ID", &id)
            .env("OUTBOX_CLAIM_STRATEGY", &args.strategy)
            // The harness reads every outcome from the table (each committed row SUCCESS, its
            // owner and token, retry_count): sent rows are kept, not deleted.
            .env("OUTBOX_SENT_ROWS", "keep")
            .env("OUTBOX_LEASE_MS", lease.to_string())
            .env("OUTBOX_RECLAIM_INTERVAL_MS", (lease / 6).max(100).to_string())
            .env("OUTBOX_SEND_TIMEOUT_MS", (lease / 4).to_string())
            .env("OUTBOX_METRICS_LISTEN", format!("127.0.0.1:{port}"))
            .env("OUTBOX_ROCKETMQ_NAMESRV", &args.namesrv)
            .env("OUTBOX_ROCKETMQ_PRODUCER_GROUP", group);
        for (k, v) in place {
            cmd.env(k, v);
        }
        for s in args.sets.iter().map(String::as_str).chain(extra.iter().copied()) {
            cmd.arg("--set").arg(s);
        }
        cmd.args(["run", "--drain", "5s"])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let mut inst = Instance {
            id,
            child: cmd.spawn()?,
            port,
            log: log_path,
        };
        inst.wait_listening()?;
        Ok(inst)
    }

    /// Waits until the instance's metrics endpoint answers (it has started relaying); an error
    /// with its last log lines if it exits first, or after 60 s.
    fn wait_listening(&mut self) -> Res<()> {
        let end = Instant::now() + Duration::from_secs(60);
        loop {
            if TcpStream::connect_timeout(&([127, 0, 0, 1], self.port).into(), Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            if let Some(status) = self.child.try_wait()? {
                return Err(format!(
                    "{} exited at start ({status}); last lines of {}:\n{}",
                    self.id,
                    self.log.display(),
                    tail(&self.log, 15)
                )
                .into());
            }
            if Instant::now() > end {
                return Err(format!("{} did not start within 60 s; see {}", self.id, self.log.display()).into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn signal(&self, sig: i32) {
        // SAFETY: plain kill(2) on the pid of a child we own and have not reaped.
        unsafe {
            libc::kill(self.pid(), sig);
        }
    }

    fn sigkill(&mut self) -> Res<()> {
        kill_child(&mut self.child)
    }

    /// SIGTERM (drain), then SIGKILL if it has not exited within `limit`.
    fn stop(&mut self, limit: Duration) -> Res<Option<i32>> {
        stop_child(&mut self.child, &self.id, limit)
    }

    /// A counter from the instance's /metrics (`name` without the `_total` suffix).
    fn metric(&self, name: &str) -> Option<u64> {
        let body = http_get(self.port, "/metrics")?;
        body.lines()
            .filter(|l| !l.starts_with('#'))
            .find(|l| {
                let n = l.split([' ', '{']).next().unwrap_or("");
                n == name || n == format!("{name}_total")
            })
            .and_then(|l| l.split_whitespace().last())
            .and_then(|v| v.parse::<f64>().ok())
            .map(|v| v as u64)
    }
}

/// Whatever path the run takes (an error included), no instance outlives it.
impl Drop for Instance {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = kill_child(&mut self.child);
        }
    }
}

/// SIGCONT and SIGTERM (a clean stop), then SIGKILL if `child` has not exited within `limit`;
/// its exit code, `None` when it had to be killed.
fn stop_child(child: &mut Child, id: &str, limit: Duration) -> Res<Option<i32>> {
    for sig in [libc::SIGCONT, libc::SIGTERM] {
        // SAFETY: plain kill(2) on the pid of a child we own and have not reaped.
        unsafe {
            libc::kill(child.id() as i32, sig);
        }
    }
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if let Some(s) = child.try_wait()? {
            return Ok(s.code());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("  {id} did not stop within {limit:?}; killing it");
    kill_child(child)?;
    Ok(None)
}

/// SIGKILL, and reap it.
fn kill_child(child: &mut Child) -> Res<()> {
    child.kill()?;
    child.wait()?;
    Ok(())
}

fn free_port() -> Res<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

fn http_get(port: u16, path: &str) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    buf.split_once("\r\n\r\n").map(|(_, b)| b.to_string())
}

fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Figures an instance logged over its life (log lines of the relay and of outboxd).
#[derive(Default, Debug, Clone)]
struct LogFigures {
    reclaimed: u64,
    stale_acks: u64,
    /// Events whose lease renewal found them claimed by someone else (a lost lease noticed).
    lost_leases: u64,
    breaker_opened: u64,
    dead_letters: u64,
    db_errors: u64,
    /// Held rounds found ended without recording their sends (their connection died), and
    /// their events, audited as claim-lost.
    lost_rounds: u64,
    claim_lost: u64,
    /// Held rounds of this instance whose settle failed, and the sends they had made.
    unrecorded_rounds: u64,
    unrecorded_sends: u64,
    /// Their tokens (a round's token is the claim_token of the rows it records).
    unrecorded_tokens: Vec<u64>,
}

fn log_figures(path: &Path) -> LogFigures {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut f = LogFigures::default();
    let first_number = |s: &str| -> u64 {
        s.split(|c: char| !c.is_ascii_digit())
            .find(|w| !w.is_empty())
            .and_then(|w| w.parse().ok())
            .unwrap_or(0)
    };
    for line in text.lines() {
        if let Some(i) = line.find("reclaimed ") {
            if line.contains("whose lease expired") {
                f.reclaimed += first_number(&line[i + "reclaimed ".len()..]);
            }
        }
        if line.contains("acks matched no row") {
            // "{n} of {want} acks matched no row"
            if let Some(msg) = line.split("] ").last() {
                f.stale_acks += first_number(msg);
            }
        }
        if line.contains("events were no longer ours") {
            // "lease renewal: {lost} of {n} events were no longer ours"
            if let Some(i) = line.find("lease renewal: ") {
                f.lost_leases += first_number(&line[i + "lease renewal: ".len()..]);
            }
        }
        if line.contains("held rounds that ended without recording their sends") {
            // "recovered {rounds} held rounds that ended without recording their sends: {events} events audited ..."
            if let Some(i) = line.find("recovered ") {
                f.lost_rounds += first_number(&line[i + "recovered ".len()..]);
            }
            if let Some(i) = line.find("their sends: ") {
                f.claim_lost += first_number(&line[i + "their sends: ".len()..]);
            }
        }
        if line.contains("could not record its sends") {
            // "held round {token} could not record its sends ({e}): ... claimable again and the {sent} sent among them ..."
            f.unrecorded_rounds += 1;
            if let Some(i) = line.find("held round ") {
                f.unrecorded_tokens.push(first_number(&line[i + "held round ".len()..]));
            }
            if let Some(i) = line.find("claimable again and the ") {
                f.unrecorded_sends += first_number(&line[i + "claimable again and the ".len()..]);
            }
        }
        if line.contains("circuit breaker opened") {
            f.breaker_opened += 1;
        }
        if line.contains("dead letter: event") {
            f.dead_letters += 1;
        }
        // The first failure of each streak of failing database work (later ones are rate-limited
        // ERRORs with counts), and each state change given up at the end of its lease.
        if line.contains(" failed, retrying") || line.contains("failed and the lease is ending") {
            f.db_errors += 1;
        }
    }
    f
}

fn script(args: &[&str]) -> Res<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/rocketmq");
    let out = Command::new(path).args(args).stdin(Stdio::null()).output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(format!("scripts/rocketmq {} failed ({}):\n{text}", args.join(" "), out.status).into())
    }
}

/// `scripts/rocketmq start`, tried up to three times: its readiness check can mistake a broker
/// that has not exec'd yet for one that exited (it then fails although the broker comes up).
fn start_broker() -> Res<()> {
    let mut last = String::new();
    for attempt in 1..=3 {
        match script(&["start"]) {
            Ok(_) => return Ok(()),
            Err(e) => {
                last = e.to_string();
                eprintln!("  scripts/rocketmq start failed (attempt {attempt} of 3); checking again in 2 s");
                std::thread::sleep(Duration::from_secs(2));
                if script(&["status"]).is_ok() {
                    return Ok(());
                }
            }
        }
    }
    Err(last.into())
}

fn mariadb_up() -> bool {
    Command::new("mariadb")
        .args(["-h127.0.0.1", "-uroot", "-e", "SELECT 1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Stops MariaDB (waiting for the process to end) and starts it again; returns the time the stop
/// took and the time it was unreachable.
fn restart_mariadb() -> Res<(Duration, Duration)> {
    let t0 = Instant::now();
    let st = Command::new("start-stop-daemon")
        .args(["--stop", "--exec", MARIADBD, "--retry", "60"])
        .status()?;
    if !st.success() {
        return Err(format!("start-stop-daemon --stop failed: {st}").into());
    }
    let stopped = t0.elapsed();
    let _ = std::fs::create_dir_all("/run/mysqld");
    let _ = Command::new("chown").args(["mysql:mysql", "/run/mysqld"]).status();
    let st = Command::new("start-stop-daemon")
        .args([
            "--start",
            "--oknodo",
            "--background",
            "--exec",
            MARIADBD,
            "--",
            "--user=mysql",
        ])
        .status()?;
    if !st.success() {
        return Err(format!("start-stop-daemon --start failed: {st}").into());
    }
    let end = Instant::now() + Duration::from_secs(120);
    while !mariadb_up() {
        if Instant::now() > end {
            return Err("MariaDB did not come back within 120 s".into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok((stopped, t0.elapsed()))
}

// ---------------------------------------------------------------------------------------------
// Writers.

/// (biz_no, id, payload) of an event whose commit returned an error.
type UncertainEvent = (String, u64, Vec<u8>);

/// What the writers did, by `biz_no` (unique per event).
#[derive(Default)]
struct Ledger {
    /// biz_no -> (id, payload) of events whose transaction committed.
    committed: HashMap<String, (u64, Vec<u8>)>,
    /// biz_no of events whose transaction was rolled back on purpose.
    rolled_back: HashSet<String>,
    /// biz_no of events whose transaction failed before its commit (database down).
    failed: HashSet<String>,
    /// Transactions whose COMMIT returned an error: (order_no, events). Resolved afterwards by
    /// whether the business row exists.
    uncertain: Vec<(String, Vec<UncertainEvent>)>,
    deliberate_rollbacks: u64,
}

struct Writers {
    ledger: Arc<Mutex<Ledger>>,
    written: Arc<AtomicU64>,
    done: Arc<AtomicBool>,
    handles: Vec<std::thread::JoinHandle<Result<(), String>>>,
}

/// Starts `w` writer threads that commit `total` events over about `span` (paced), 1 to 4 events
/// per transaction with a business row, about one transaction in eight rolled back on purpose.
fn start_writers(env: &Env, w: usize, total: usize, span: Duration) -> Writers {
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let written = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let rate = total as f64 / span.as_secs_f64().max(0.001);
    let per_writer = total.div_ceil(w);
    let mut handles = Vec::new();
    for wi in 0..w {
        let n = per_writer.min(total.saturating_sub(wi * per_writer));
        let (pool, ledger, written) = (env.pool.clone(), ledger.clone(), written.clone());
        let writer_rate = rate / w as f64;
        handles.push(std::thread::spawn(move || -> Result<(), String> {
            let mut rng = rand::rng();
            let start = Instant::now();
            let mut done = 0usize;
            let mut tx_no = 0u64;
            let mut down_since: Option<Instant> = None;
            while done < n {
                // Pace: never ahead of the planned rate.
                let due = Duration::from_secs_f64(done as f64 / writer_rate);
                if let Some(wait) = due.checked_sub(start.elapsed()) {
                    std::thread::sleep(wait.min(Duration::from_millis(200)));
                    continue;
                }
                tx_no += 1;
                let order = format!("W{wi}-T{tx_no}");
                let k = rng.random_range(1..=4usize).min(n - done);
                let rollback = rng.random_range(0..8) == 0;
                let events: Vec<(String, Vec<u8>)> = (0..k)
                    .map(|i| {
                        let biz = format!("{order}-E{i}");
                        let pad = "x".repeat(rng.random_range(0..200));
                        (
                            biz.clone(),
                            format!("{{\"biz\":\"{biz}\",\"pad\":\"{pad}\"}}").into_bytes(),
                        )
                    })
                    .collect();
                match write_tx(&pool, &order, &events, rollback) {
                    Ok(WriteOutcome::Committed(ids)) => {
                        let mut l = ledger.lock();
                        for ((biz, p), id) in events.into_iter().zip(ids) {
                            l.committed.insert(biz, (id, p));
                        }
                        done += k;
                        written.fetch_add(k as u64, Relaxed);
                        down_since = None;
                    }
                    Ok(WriteOutcome::RolledBack) => {
                        let mut l = ledger.lock();
                        l.deliberate_rollbacks += 1;
                        l.rolled_back.extend(events.into_iter().map(|(b, _)| b));
                        down_since = None;
                    }
                    Err((phase, e, ids)) => {
                        let mut l = ledger.lock();
                        if phase == Phase::Commit {
                            let evs = events.into_iter().zip(ids).map(|((b, p), id)| (b, id, p)).collect();
                            l.uncertain.push((order, evs));
                            // Counted as done: whether it committed is resolved at the end.
                            done += k;
                            written.fetch_add(k as u64, Relaxed);
                        } else {
                            l.failed.extend(events.into_iter().map(|(b, _)| b));
                        }
                        drop(l);
                        let since = *down_since.get_or_insert_with(Instant::now);
                        if since.elapsed() > Duration::from_secs(180) {
                            return Err(format!("writer {wi}: the database failed for 180 s: {e}"));
                        }
                        std::thread::sleep(Duration::from_millis(200));
                    }
                }
            }
            Ok(())
        }));
    }
    Writers {
        ledger,
        written,
        done,
        handles,
    }
}

#[derive(PartialEq, Eq, Clone, Copy)]
enum Phase {
    Before,
    Commit,
}

enum WriteOutcome {
    Committed(Vec<u64>),
    RolledBack,
}

fn write_tx(
    pool: &Pool,
    order: &str,
    events: &[(String, Vec<u8>)],
    rollback: bool,
) -> Result<WriteOutcome, (Phase, String, Vec<u64>)> {
    let before = |e: mysql::Error| (Phase::Before, e.to_string(), Vec::new());
    let mut conn = pool.get_conn().map_err(before)?;
    let mut tx = conn.start_transaction(TxOpts::default()).map_err(before)?;
    tx.exec_drop(
        "INSERT INTO faults_orders (order_no, events) VALUES (?, ?)",
        (order, events.len()),
    )
    .map_err(before)?;
    let mut ids = Vec::new();
    for (biz, payload) in events {
        let e = NewEvent::new(biz.clone(), "ORDER_CREATED", payload.clone());
        let id = outbox::enqueue_in_tx(&mut tx, &e).map_err(|e| (Phase::Before, e.to_string(), Vec::new()))?;
        ids.push(id);
    }
    if rollback {
        tx.rollback().map_err(before)?;
        return Ok(WriteOutcome::RolledBack);
    }
    match tx.commit() {
        Ok(()) => Ok(WriteOutcome::Committed(ids)),
        Err(e) => Err((Phase::Commit, e.to_string(), ids)),
    }
}

// ---------------------------------------------------------------------------------------------
// The fault run.

#[derive(Debug, Clone)]
enum FaultKind {
    Kill { slot: usize, id: String },
    Broker,
    Db,
}

#[derive(Debug, Clone)]
struct Fault {
    at: f64,
    kind: FaultKind,
    /// Rows in flight anywhere right before the fault (see [`Env::in_flight`]).
    in_flight_global: u64,
    /// Rows that could be delivered twice because of this fault, SENDING rows and rows locked by
    /// held rounds (named by their journal rows) alike: for a kill, the killed instance's (before
    /// the kill, and after it: frozen until their lease expires or their round is recovered);
    /// for the broker, every one right before; for the database, every one right before, and
    /// those claimed after that until the server stopped (their rounds died with it).
    at_risk: HashSet<u64>,
}

enum Planned {
    Kill,
    Broker,
    Db,
}

fn fault_run(args: &Args) -> Res<bool> {
    let env = Env::new(args, "run")?;
    let mut rng = rand::rng();
    let gap = Duration::from_millis(args.kill_gap_ms);
    let span = gap * args.kills.max(3) as u32;
    // The plan: kills at random moments (gaps 0.5..1.5 x the mean), the database at ~25 %, the
    // broker at ~55 % of the span; writers spread over the span. The database first: its restart
    // should find the relays sending, and the broker's outage lasts long (in the short form, to
    // the end of the span), the relays' breakers open and nothing in flight.
    let mut plan: Vec<(Duration, Planned)> = Vec::new();
    let mut t = Duration::from_millis(1500);
    for _ in 0..args.kills {
        t += gap.mul_f64(rng.random_range(0.5..1.5));
        plan.push((t, Planned::Kill));
    }
    let span = span.max(t);
    if args.broker_kill {
        plan.push((span.mul_f64(0.55), Planned::Broker));
    }
    if args.db_restart {
        plan.push((span.mul_f64(0.25), Planned::Db));
    }
    plan.sort_by_key(|(t, _)| *t);
    plan.reverse(); // pop from the end

    println!(
        "{} outboxd instance(s), {} writer(s), {} events over ~{:.0} s; {} kills, broker kill {}, MariaDB restart {}",
        args.instances,
        args.writers,
        args.events,
        span.as_secs_f64(),
        args.kills,
        if args.broker_kill { "yes" } else { "no" },
        if args.db_restart { "yes" } else { "no" }
    );
    let mut slots: Vec<Option<Instance>> = Vec::new();
    let mut gens = vec![0u32; args.instances];
    for s in 0..args.instances {
        slots.push(Some(env.spawn(s, 0)?));
    }
    let mut all_logs: Vec<PathBuf> = slots.iter().flatten().map(|i| i.log.clone()).collect();
    let run_start = Instant::now();
    let writers = start_writers(&env, args.writers, args.events, span.mul_f64(0.9));
    let mut faults: Vec<Fault> = Vec::new();
    let mut restarts: Vec<(Instant, usize)> = Vec::new();
    let mut last_print = Instant::now() - Duration::from_secs(10);
    let mut db_down = Duration::ZERO;
    let mut broker_down = Duration::ZERO;
    let mut broker_back: Option<std::thread::JoinHandle<Result<Duration, String>>> = None;
    let min_gap = gap.mul_f64(0.3);
    let deadline = Instant::now() + args.deadline;
    let total = args.events as u64;
    let mut drained_at: Option<f64> = None;

    loop {
        // Restart killed instances whose pause is over.
        let now = Instant::now();
        let (due, later): (Vec<_>, Vec<_>) = restarts.drain(..).partition(|(at, _)| *at <= now);
        restarts = later;
        for (_, slot) in due {
            gens[slot] += 1;
            match env.spawn(slot, gens[slot]) {
                Ok(i) => {
                    all_logs.push(i.log.clone());
                    println!("  {:>6.1} s  restarted slot {slot} as {}", env.t(), i.id);
                    slots[slot] = Some(i);
                }
                Err(e) => {
                    eprintln!("  restart of slot {slot} failed ({e}); trying again in 2 s");
                    restarts.push((Instant::now() + Duration::from_secs(2), slot));
                }
            }
        }
        // The next fault, when due.
        if plan.last().is_some_and(|(at, _)| run_start.elapsed() >= *at) {
            let (_, what) = plan.pop().unwrap();
            // A fault that ran late (a restart took long) does not bunch the next kills up.
            let earliest = run_start.elapsed() + min_gap;
            for (at, p) in plan.iter_mut() {
                if matches!(p, Planned::Kill) && *at < earliest {
                    *at = earliest;
                }
            }
            plan.sort_by_key(|(at, _)| std::cmp::Reverse(*at));
            match what {
                Planned::Kill => {
                    let alive: Vec<usize> = (0..slots.len()).filter(|&s| slots[s].is_some()).collect();
                    if alive.is_empty() {
                        // Every instance is down or restarting: try this kill a bit later.
                        plan.push((run_start.elapsed() + Duration::from_millis(500), Planned::Kill));
                    } else {
                        let slot = alive[rng.random_range(0..alive.len())];
                        let mut inst = slots[slot].take().unwrap();
                        let in_flight_global = env.in_flight(None).map(|s| s.len() as u64).unwrap_or(0);
                        let mut at_risk = env.in_flight(Some(&inst.id)).unwrap_or_default();
                        inst.sigkill()?;
                        // Dead now: its SENDING rows are frozen until their lease expires, its
                        // held rounds' journal rows until a relay recovers them (JOURNAL_GRACE
                        // after their claim at the earliest); their rows are claimable at once.
                        at_risk.extend(env.in_flight(Some(&inst.id)).unwrap_or_default());
                        println!(
                            "  {:>6.1} s  SIGKILL {} (slot {slot}): {} of its rows in flight, {} in flight in all",
                            env.t(),
                            inst.id,
                            at_risk.len(),
                            in_flight_global
                        );
                        faults.push(Fault {
                            at: env.t(),
                            kind: FaultKind::Kill {
                                slot,
                                id: inst.id.clone(),
                            },
                            in_flight_global,
                            at_risk,
                        });
                        let pause = Duration::from_millis(rng.random_range(0..1500));
                        restarts.push((Instant::now() + pause, slot));
                    }
                }
                Planned::Broker => {
                    let ids = env.in_flight(None).unwrap_or_default();
                    let t0 = Instant::now();
                    script(&["kill-broker"])?;
                    println!(
                        "  {:>6.1} s  broker SIGKILLed with {} rows in flight",
                        env.t(),
                        ids.len()
                    );
                    faults.push(Fault {
                        at: env.t(),
                        kind: FaultKind::Broker,
                        in_flight_global: ids.len() as u64,
                        at_risk: ids,
                    });
                    // Back after a few seconds, while the kills go on.
                    let down_for = Duration::from_millis(rng.random_range(3000..6000));
                    let started = env.started;
                    broker_back = Some(std::thread::spawn(move || -> Result<Duration, String> {
                        std::thread::sleep(down_for);
                        start_broker().map_err(|e| e.to_string())?;
                        let down = t0.elapsed();
                        println!(
                            "  {:>6.1} s  broker back (down {:.1} s)",
                            started.elapsed().as_secs_f64(),
                            down.as_secs_f64()
                        );
                        Ok(down)
                    }));
                }
                Planned::Db => {
                    // A moment with rows in flight, if one comes soon: a restart between two
                    // rounds would catch none (no settle failing, no round lost).
                    let mut ids = env.in_flight(None).unwrap_or_default();
                    let until = Instant::now() + DB_WAITS_FOR_ROUND;
                    while ids.is_empty() && Instant::now() < until {
                        std::thread::sleep(Duration::from_millis(5));
                        ids = env.in_flight(None).unwrap_or_default();
                    }
                    let in_flight_global = ids.len() as u64;
                    let db_now: Option<String> = env
                        .conn()
                        .ok()
                        .and_then(|mut c| c.query_first("SELECT CAST(NOW(3) AS CHAR)").ok().flatten());
                    let at = env.t();
                    println!("  {at:>6.1} s  restarting MariaDB with {in_flight_global} rows in flight");
                    let stopped;
                    (stopped, db_down) = restart_mariadb()?;
                    // Rows claimed between the sample and the stop were in flight too: their
                    // rounds died with the server, and their journal rows and SENDING rows are
                    // still there (unless a relay already recovered or reclaimed them).
                    let mut late = 0;
                    if let Some(t) = db_now.as_deref() {
                        for id in env
                            .in_flight_where(None, Some((t, stopped + Duration::from_millis(100))))
                            .unwrap_or_default()
                        {
                            late += u64::from(ids.insert(id));
                        }
                    }
                    println!(
                        "  {:>6.1} s  MariaDB back (unreachable {:.1} s); {late} more rows were claimed before it stopped",
                        env.t(),
                        db_down.as_secs_f64()
                    );
                    faults.push(Fault {
                        at,
                        kind: FaultKind::Db,
                        in_flight_global,
                        at_risk: ids,
                    });
                }
            }
        }
        if broker_back.as_ref().is_some_and(|h| h.is_finished()) {
            broker_down = broker_back
                .take()
                .unwrap()
                .join()
                .map_err(|_| "broker restart panicked")??;
        }
        // Progress, and the end condition.
        let writers_done = writers.handles.iter().all(|h| h.is_finished());
        if writers_done {
            writers.done.store(true, Relaxed);
        }
        if last_print.elapsed() >= Duration::from_secs(2) || (plan.is_empty() && writers_done) {
            match env.by_status().and_then(|s| Ok((s, env.journal_counts()?))) {
                Ok((s, (rounds, held))) => {
                    let g = |k: &str| s.get(k).copied().unwrap_or(0);
                    let written = writers.written.load(Relaxed);
                    if last_print.elapsed() >= Duration::from_secs(2) {
                        println!(
                            "  {:>6.1} s  written {written:>7}/{total}  SUCCESS {:>7}  WAIT {:>6} (held {held:>5} in {rounds:>2} rounds)  SENDING {:>5}  FAIL {}  | faults {}/{}  instances up {}",
                            env.t(),
                            g("SUCCESS"),
                            g("WAIT"),
                            g("SENDING"),
                            g("FAIL"),
                            faults.len(),
                            faults.len() + plan.len(),
                            slots.iter().flatten().count()
                        );
                        last_print = Instant::now();
                    }
                    if plan.is_empty()
                        && restarts.is_empty()
                        && broker_back.is_none()
                        && writers_done
                        && g("WAIT") == 0
                        && g("SENDING") == 0
                        // Lost held rounds recovered (audited) before the checks read the audit.
                        && rounds == 0
                    {
                        drained_at = Some(env.t());
                        break;
                    }
                }
                Err(e) => {
                    if last_print.elapsed() >= Duration::from_secs(2) {
                        println!("  {:>6.1} s  (database unreachable: {e})", env.t());
                        last_print = Instant::now();
                    }
                }
            }
        }
        if Instant::now() > deadline {
            println!("  deadline of {:?} passed before every row was SUCCESS", args.deadline);
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }

    let mut writer_errors = Vec::new();
    for h in writers.handles {
        match h.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => writer_errors.push(e),
            Err(_) => writer_errors.push("a writer panicked".into()),
        }
    }
    // The figures of the live instances, then stop them (drain).
    let mut live_stale = 0u64;
    for inst in slots.iter_mut().flatten() {
        live_stale += inst.metric("outbox_stale_acks").unwrap_or(0);
        let code = inst.stop(Duration::from_secs(20))?;
        if code != Some(0) {
            eprintln!("  {} exited with {code:?}", inst.id);
        }
    }
    let logs: Vec<LogFigures> = all_logs.iter().map(|p| log_figures(p)).collect();
    let sum = |f: fn(&LogFigures) -> u64| logs.iter().map(f).sum::<u64>();

    // Resolve the uncertain commits by the business row.
    let mut ledger = std::mem::take(&mut *writers.ledger.lock());
    let uncertain = std::mem::take(&mut ledger.uncertain);
    let (mut unc_committed, mut unc_rolled_back) = (0, 0);
    {
        let mut c = env.conn()?;
        for (order, events) in uncertain {
            let exists: u64 = c
                .exec_first("SELECT COUNT(*) FROM faults_orders WHERE order_no = ?", (&order,))?
                .unwrap_or(0);
            for (biz, id, p) in events {
                if exists == 1 {
                    unc_committed += 1;
                    ledger.committed.insert(biz, (id, p));
                } else {
                    unc_rolled_back += 1;
                    ledger.failed.insert(biz);
                }
            }
        }
    }

    // The table: every committed row SUCCESS, no row of a rolled-back transaction.
    let rows: Vec<(u64, String, String, u32)> = env
        .conn()?
        .query("SELECT id, biz_no, status, retry_count FROM t_event_record")?;
    let mut status_counts: HashMap<String, u64> = HashMap::new();
    let mut retry_of: HashMap<u64, u32> = HashMap::new();
    let mut rows_of_rolled_back = 0u64;
    let mut rows_unexpected = 0u64;
    let mut rows_id_mismatch = 0u64;
    for (id, biz, status, rc) in &rows {
        *status_counts.entry(status.clone()).or_default() += 1;
        retry_of.insert(*id, *rc);
        match ledger.committed.get(biz) {
            Some((cid, _)) if cid == id => {}
            Some(_) => rows_id_mismatch += 1,
            None if ledger.rolled_back.contains(biz) || ledger.failed.contains(biz) => rows_of_rolled_back += 1,
            None => rows_unexpected += 1,
        }
    }
    let committed = ledger.committed.len();
    let st = |k: &str| status_counts.get(k).copied().unwrap_or(0);
    let max_retry_count = retry_of.values().copied().max().unwrap_or(0);
    let sum_retry_count: u64 = retry_of.values().map(|&r| r as u64).sum();

    // Read the topic back.
    println!("reading topic {} back ({committed} events expected) ...", env.topic);
    let t_read = Instant::now();
    let back = testing::read_topic(&args.namesrv, &env.topic, committed, Duration::from_secs(900))?;
    println!(
        "  read {} messages ({} distinct) in {:.1} s{}",
        back.messages.len(),
        back.distinct,
        t_read.elapsed().as_secs_f64(),
        if back.timed_out { " (timed out)" } else { "" }
    );
    let by_id: HashMap<u64, &str> = ledger.committed.iter().map(|(b, (id, _))| (*id, b.as_str())).collect();
    let mut copies: HashMap<u64, u64> = HashMap::new();
    let (mut rb_delivered, mut unexpected, mut mismatched) = (0u64, 0u64, 0u64);
    for m in &back.messages {
        let biz = m.biz_no().unwrap_or("");
        if ledger.rolled_back.contains(biz) || ledger.failed.contains(biz) {
            rb_delivered += 1;
            continue;
        }
        match m.event_id() {
            Some(id) if by_id.get(&id) == Some(&biz) => {
                if m.body != ledger.committed[biz].1 {
                    mismatched += 1;
                }
                *copies.entry(id).or_default() += 1;
            }
            _ => unexpected += 1,
        }
    }
    let delivered = copies.len();
    let lost = committed - delivered;
    let duplicates: u64 = copies.values().map(|c| c - 1).sum();
    let at_risk_all: HashSet<u64> = faults.iter().flat_map(|f| f.at_risk.iter().copied()).collect();
    let bound: u64 = faults.iter().map(|f| f.at_risk.len() as u64).sum();
    let dup_ids: Vec<(u64, u64)> = copies.iter().filter(|(_, &c)| c > 1).map(|(&i, &c)| (i, c)).collect();
    let dup_outside_faults = dup_ids.iter().filter(|(id, _)| !at_risk_all.contains(id)).count();
    // Each resend needs the row claimable again after a send: a reclaim or a retry (both add
    // one to retry_count), or a held round that ended without recording its sends (its
    // connection died), which the recovery audits as claim-lost (and counts an attempt only on
    // rows still pending by then: another relay has often resent the row already). So
    // copies <= 1 + retry_count + claim-lost audits, row by row.
    let claim_lost: HashMap<u64, u64> = env.conn()?.exec_map(
        "SELECT event_id, COUNT(*) FROM outbox_audit WHERE table_name = ? AND action = 'claim-lost' GROUP BY event_id",
        (TABLE,),
        |(id, n): (u64, u64)| (id, n),
    )?
    .into_iter()
    .collect();
    let claim_lost_audits: u64 = claim_lost.values().sum();
    let per_row_violations: Vec<(u64, u64, u32, u64)> = dup_ids
        .iter()
        .filter_map(|&(id, c)| {
            let rc = retry_of.get(&id).copied().unwrap_or(0);
            let lost = claim_lost.get(&id).copied().unwrap_or(0);
            (c > 1 + rc as u64 + lost).then_some((id, c, rc, lost))
        })
        .collect();
    let dup_claim_lost = dup_ids.iter().filter(|(id, _)| claim_lost.contains_key(id)).count();
    // Rows recorded by a held round whose settle reported a failure (it logs that they will be
    // sent again): its COMMIT was applied though its answer was lost with the connection.
    let unrecorded_tokens: Vec<String> = logs
        .iter()
        .flat_map(|f| f.unrecorded_tokens.iter().map(|t| t.to_string()))
        .collect();
    let recorded_anyway = if unrecorded_tokens.is_empty() {
        0
    } else {
        env.count(&format!("claim_token IN ({})", unrecorded_tokens.join(",")))?
    };

    let kills = faults
        .iter()
        .filter(|f| matches!(f.kind, FaultKind::Kill { .. }))
        .count();
    let kill_risk: u64 = faults
        .iter()
        .filter(|f| matches!(f.kind, FaultKind::Kill { .. }))
        .map(|f| f.at_risk.len() as u64)
        .sum();
    let risk_of = |k: fn(&FaultKind) -> bool| -> u64 {
        faults
            .iter()
            .filter(|f| k(&f.kind))
            .map(|f| f.at_risk.len() as u64)
            .sum()
    };
    let broker_risk = risk_of(|k| matches!(k, FaultKind::Broker));
    let db_risk = risk_of(|k| matches!(k, FaultKind::Db));

    println!();
    println!("faults");
    for f in &faults {
        let what = match &f.kind {
            FaultKind::Kill { slot, id } => format!("SIGKILL slot {slot} ({id})"),
            FaultKind::Broker => "broker SIGKILL + restart".into(),
            FaultKind::Db => "MariaDB restart".into(),
        };
        println!(
            "  {:>6.1} s  {what:<40} in flight {:>5} (in flight in all {})",
            f.at,
            f.at_risk.len(),
            f.in_flight_global
        );
    }
    println!();
    println!("summary");
    println!(
        "  committed            {committed} ({} transactions rolled back on purpose: {} events; {} events in transactions the outage failed; {} uncertain commits resolved: {unc_committed} committed, {unc_rolled_back} not)",
        ledger.deliberate_rollbacks,
        ledger.rolled_back.len(),
        ledger.failed.len() - unc_rolled_back as usize,
        unc_committed + unc_rolled_back
    );
    println!("  delivered            {delivered} distinct events read back");
    println!("  lost                 {lost}");
    println!("  rolled-back delivered {rb_delivered}");
    println!(
        "  rows                 SUCCESS {} WAIT {} SENDING {} FAIL {} | rows of rolled-back transactions {rows_of_rolled_back}, unexpected {rows_unexpected}, id mismatches {rows_id_mismatch}",
        st("SUCCESS"),
        st("WAIT"),
        st("SENDING"),
        st("FAIL")
    );
    println!(
        "  duplicates           {duplicates} ({} events), bound {bound} = in flight at {kills} kills {kill_risk} + broker {broker_risk} + MariaDB {db_risk}; {dup_outside_faults} duplicated events were not in flight at a fault",
        dup_ids.len()
    );
    println!(
        "  per-row bound        copies <= 1 + retry_count + claim-lost audits: {} violations; highest retry_count {max_retry_count}, sum {sum_retry_count}; \
         {claim_lost_audits} claim-lost audits on {} events ({dup_claim_lost} of the duplicated events among them)",
        per_row_violations.len(),
        claim_lost.len()
    );
    println!(
        "  relays (logs)        reclaimed {} | stale acks {} (live instances' metric {live_stale}) | breaker opened {} | dead letters {} | db retries {}",
        sum(|f| f.reclaimed),
        sum(|f| f.stale_acks),
        sum(|f| f.breaker_opened),
        sum(|f| f.dead_letters),
        sum(|f| f.db_errors)
    );
    println!(
        "  held rounds (logs)   lost and recovered {} ({} events audited claim-lost) | settles that failed {} ({} sends among them; \
         {recorded_anyway} rows recorded by them all the same: the COMMIT applied, its answer lost)",
        sum(|f| f.lost_rounds),
        sum(|f| f.claim_lost),
        sum(|f| f.unrecorded_rounds),
        sum(|f| f.unrecorded_sends)
    );
    println!(
        "  outages              broker down {:.1} s, MariaDB unreachable {:.1} s; drained at {}",
        broker_down.as_secs_f64(),
        db_down.as_secs_f64(),
        drained_at
            .map(|t| format!("{t:.1} s"))
            .unwrap_or_else(|| "never".into())
    );
    println!(
        "strategy={} committed={committed} delivered={delivered} lost={lost} rolled_back_delivered={rb_delivered} fail_rows={} duplicates={duplicates} dup_bound={bound} kills={kills} broker_kills={} db_restarts={} reclaimed={} lost_rounds={} claim_lost_audits={claim_lost_audits} failed_settles={} recorded_anyway={recorded_anyway} max_retry_count={max_retry_count} unexpected={unexpected} mismatched={mismatched}",
        args.strategy,
        st("FAIL"),
        faults.iter().filter(|f| matches!(f.kind, FaultKind::Broker)).count(),
        faults.iter().filter(|f| matches!(f.kind, FaultKind::Db)).count(),
        sum(|f| f.reclaimed),
        sum(|f| f.lost_rounds),
        sum(|f| f.unrecorded_rounds),
    );

    let mut violations = Vec::new();
    let mut check = |ok: bool, what: String| {
        if !ok {
            violations.push(what);
        }
    };
    check(lost == 0, format!("{lost} committed events were never delivered"));
    check(
        rb_delivered == 0,
        format!("{rb_delivered} messages of rolled-back transactions"),
    );
    check(st("FAIL") == 0, format!("{} rows ended FAIL", st("FAIL")));
    check(
        st("SUCCESS") as usize == committed && st("WAIT") == 0 && st("SENDING") == 0,
        format!("not every committed row is SUCCESS: {status_counts:?}"),
    );
    check(
        rows_of_rolled_back == 0,
        format!("{rows_of_rolled_back} rows of rolled-back transactions"),
    );
    check(
        rows_unexpected == 0 && rows_id_mismatch == 0 && unexpected == 0 && mismatched == 0,
        format!(
            "unexpected rows {rows_unexpected}, id mismatches {rows_id_mismatch}, unexpected messages {unexpected}, altered bodies {mismatched}"
        ),
    );
    check(
        duplicates <= bound,
        format!("{duplicates} duplicates exceed the {bound} rows in flight at the faults"),
    );
    check(
        per_row_violations.is_empty(),
        format!(
            "events delivered more often than 1 + retry_count + claim-lost audits (id, copies, retry_count, audits): {:?}",
            &per_row_violations[..per_row_violations.len().min(10)]
        ),
    );
    check(
        kills >= args.kills,
        format!("only {kills} of {} kills happened", args.kills),
    );
    let is_broker = |k: &FaultKind| matches!(k, FaultKind::Broker);
    let is_db = |k: &FaultKind| matches!(k, FaultKind::Db);
    for (what, wanted, kind) in [
        (
            "broker kills",
            args.broker_kill,
            &is_broker as &dyn Fn(&FaultKind) -> bool,
        ),
        ("MariaDB restarts", args.db_restart, &is_db),
    ] {
        let happened = faults.iter().filter(|f| kind(&f.kind)).count();
        check(
            happened == usize::from(wanted),
            format!("{what}: {happened} happened, {} planned", usize::from(wanted)),
        );
    }
    check(writer_errors.is_empty(), format!("writers failed: {writer_errors:?}"));
    check(
        !back.timed_out,
        format!("the read-back timed out with {} distinct", back.distinct),
    );
    for v in &violations {
        println!("VIOLATION: {v}");
    }
    if violations.is_empty() {
        println!("OK: nothing lost, nothing rolled back delivered, no FAIL row, duplicates within the bound");
        if !args.keep {
            env.drop_db();
            let _ = std::fs::remove_dir_all(&env.dir);
        }
    } else {
        println!("kept database {} and logs in {}", env.db, env.dir.display());
    }
    Ok(violations.is_empty())
}

// ---------------------------------------------------------------------------------------------
// The stale-claim mode.

fn seed(env: &Env, n: usize, cycle: usize) -> Res<Vec<u64>> {
    let mut conn = env.conn()?;
    let mut ids = Vec::with_capacity(n);
    let all: Vec<usize> = (0..n).collect();
    for chunk in all.chunks(1000) {
        let mut tx = conn.start_transaction(TxOpts::default())?;
        for i in chunk {
            let e = NewEvent::new(
                format!("S{cycle}-{i}"),
                "ORDER_CREATED",
                format!("{{\"c\":{cycle},\"n\":{i}}}"),
            );
            ids.push(outbox::enqueue_in_tx(&mut tx, &e)?);
        }
        tx.commit()?;
    }
    Ok(ids)
}

type RowState = (String, Option<String>, Option<u64>, Option<String>, Option<String>);

fn row_states(env: &Env, ids: &[u64]) -> Res<HashMap<u64, RowState>> {
    let list = ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",");
    let rows: Vec<(u64, RowState)> = env.conn()?.query_map(
        format!(
            "SELECT id, status, claim_owner, claim_token, CAST(sent_at AS CHAR), broker_msg_id \
             FROM t_event_record WHERE id IN ({list})"
        ),
        |(id, s, o, t, at, m): (u64, String, Option<String>, Option<u64>, Option<String>, Option<String>)| {
            (id, (s, o, t, at, m))
        },
    )?;
    Ok(rows.into_iter().collect())
}

fn stale_claim(args: &Args) -> Res<bool> {
    let env = Env::new(args, "stale")?;
    let lease = Duration::from_millis(args.lease_ms);
    let held = args.strategy == "held";
    let per_cycle = args.events.max(2000);
    // A sends its claimed rows one at a time from one worker: it holds claimed rows (SENDING
    // under a lease; WAIT rows locked by its round, held) for most of a second after each
    // claim, a window the pause below cannot miss however fast B drains.
    let mut a = env.spawn_with(0, 0, &["workers=1", "publish.batch.max=1"])?;
    let mut b = env.spawn(1, 0)?;
    println!(
        "instance A {} and instance B {}; {} events per cycle, claim.strategy {}, lease {} ms",
        a.id,
        b.id,
        per_cycle,
        args.strategy,
        lease.as_millis()
    );
    let mut all_ids: Vec<u64> = Vec::new();
    let mut paused_rows: HashSet<u64> = HashSet::new();
    let mut violations: Vec<String> = Vec::new();
    let mut stale_metric = 0u64;
    let mut possible_dups = 0u64;
    let mut lost_leases = 0u64;
    let mut unrecorded = 0u64;
    let mut cycles_done = 0;
    for cycle in 0..args.cycles.max(1) {
        cycles_done = cycle + 1;
        let ids = seed(&env, per_cycle, cycle)?;
        all_ids.extend(&ids);
        // Pause A at a moment it holds claimed rows; what it holds then, with the time each
        // claim began (see Env::holding).
        let mut a_claimed: HashMap<u64, String> = HashMap::new();
        let mut paused_at = Instant::now();
        for _ in 0..200 {
            if !env.holding(&a.id)?.is_empty() {
                a.signal(libc::SIGSTOP);
                paused_at = Instant::now();
                // Statements A had already sent the server finish; then its claims are frozen.
                std::thread::sleep(Duration::from_millis(300));
                a_claimed = env.holding(&a.id)?;
                if !a_claimed.is_empty() {
                    break;
                }
                a.signal(libc::SIGCONT);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        if a_claimed.is_empty() {
            violations.push(format!("cycle {cycle}: never caught A holding claimed rows"));
            continue;
        }
        let mut p: Vec<u64> = a_claimed.keys().copied().collect();
        p.sort_unstable();
        let before_token: HashMap<u64, Option<u64>> =
            row_states(&env, &p)?.into_iter().map(|(id, s)| (id, s.2)).collect();
        println!(
            "cycle {cycle}: A (pid {}) paused with SIGSTOP holding {} {}",
            a.pid(),
            p.len(),
            if held {
                "rows locked by its held round(s)"
            } else {
                "SENDING rows"
            }
        );
        // B takes them over once A's claim ends (its lease expired and B reclaims them; held,
        // the server dropped A's idle connection after its wait_timeout, the lease, and the
        // locks went with it) and delivers them.
        let limit = Instant::now() + lease * 10 + Duration::from_secs(60);
        let mut taken_over = false;
        while Instant::now() < limit {
            let s = row_states(&env, &p)?;
            if s.values()
                .all(|r| r.0 == "SUCCESS" && r.1.as_deref() == Some(b.id.as_str()))
            {
                taken_over = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let snapshot = row_states(&env, &p)?;
        if !taken_over {
            violations.push(format!(
                "cycle {cycle}: B did not deliver A's paused rows: {:?}",
                snapshot.values().take(5).collect::<Vec<_>>()
            ));
        }
        let paused_for = paused_at.elapsed();
        let new_tokens = snapshot.iter().filter(|(id, s)| s.2 != before_token[id]).count();
        println!(
            "  B ({}) took over and delivered all {} after {:.1} s (lease {:.1} s); {new_tokens} rows under a new claim token",
            b.id,
            p.len(),
            paused_for.as_secs_f64(),
            lease.as_secs_f64()
        );
        // B may take a row only once A's claim on it has ended, by the database's clock: its
        // claim (held: its settle, which stamps claimed_at) at or after A's claim time plus the
        // lease (a row with no claim time fails too). Under a lease A's claim time is the row's
        // claimed_at, moved on by each renewal; held it is the claimed_at of A's journal row,
        // which A's round locked right after writing it: from then on A's connection was idle,
        // and the server drops it after wait_timeout, the lease rounded up to whole seconds.
        // The pause itself may be shorter than a lease: A claimed the rows before it began.
        let mut conn = env.conn()?;
        let mut early = Vec::new();
        for (id, a_at) in &a_claimed {
            let taken_early: Option<u64> = conn.exec_first(
                "SELECT id FROM t_event_record WHERE id = ? \
                 AND (claimed_at IS NULL OR claimed_at < TIMESTAMPADD(MICROSECOND, ?, CAST(? AS DATETIME(3))))",
                (id, lease.as_micros() as u64, a_at),
            )?;
            early.extend(taken_early);
        }
        if !early.is_empty() {
            violations.push(format!(
                "cycle {cycle}: B claimed {} of A's rows before A's claim on them ended (ids {:?})",
                early.len(),
                &early[..early.len().min(5)]
            ));
        }
        // Resume A: its late acks (and releases) must change nothing; held, its round's
        // settle fails (its connection is gone) and writes nothing.
        a.signal(libc::SIGCONT);
        let drained = {
            let end = Instant::now() + Duration::from_secs(300);
            loop {
                let open = env.count("status IN ('WAIT', 'SENDING')")?;
                // A's lost round recovered (its rows audited) too.
                let (rounds, _) = env.journal_counts()?;
                if open == 0 && rounds == 0 {
                    break true;
                }
                if Instant::now() > end {
                    break false;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        };
        // A's late acks happen at once after SIGCONT; give it a moment past the drain.
        std::thread::sleep(Duration::from_secs(2));
        if !drained {
            violations.push(format!("cycle {cycle}: rows left unsent or lost rounds unrecovered"));
        }
        let after = row_states(&env, &p)?;
        let changed: Vec<u64> = p
            .iter()
            .copied()
            .filter(|id| after.get(id) != snapshot.get(id))
            .collect();
        stale_metric = a.metric("outbox_stale_acks").unwrap_or(0);
        possible_dups = a.metric("outbox_possible_duplicates").unwrap_or(0);
        let figures = log_figures(&a.log);
        lost_leases = figures.lost_leases;
        unrecorded = figures.unrecorded_rounds;
        let audited: u64 = env.scalar(&format!(
            "SELECT COUNT(DISTINCT event_id) FROM outbox_audit WHERE table_name = '{TABLE}' \
             AND action = 'claim-lost' AND event_id IN ({})",
            p.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",")
        ))?;
        println!(
            "  A resumed: {} of the {} rows changed after the resume; A's outbox_stale_acks = {stale_metric}, \
             outbox_possible_duplicates = {possible_dups}; its log: {} late acks, {} lost leases noticed at renewal, \
             {} held rounds that could not record their sends; {audited} of the rows audited claim-lost",
            changed.len(),
            p.len(),
            figures.stale_acks,
            figures.lost_leases,
            figures.unrecorded_rounds
        );
        if !changed.is_empty() {
            violations.push(format!(
                "cycle {cycle}: late acks changed rows: {:?}",
                changed
                    .iter()
                    .take(5)
                    .map(|id| (id, &snapshot[id], &after[id]))
                    .collect::<Vec<_>>()
            ));
        }
        if held && audited < p.len() as u64 {
            violations.push(format!(
                "cycle {cycle}: only {audited} of the {} rows of A's lost round(s) were audited claim-lost",
                p.len()
            ));
        }
        paused_rows.extend(p);
        if stale_metric > 0 || possible_dups > 0 {
            break;
        }
        if held {
            println!(
                "  A's lost round had recorded no send (none made before the pause; the rest released unsent after it, \
                 their time up); trying another cycle to catch one"
            );
        } else {
            println!(
                "  A's resumed sends ended without a late ack (their deadline had passed: timed out or released unsent, \
                 both fenced); trying another cycle to catch one"
            );
        }
    }
    let st = env.by_status()?;
    a.stop(Duration::from_secs(20))?;
    b.stop(Duration::from_secs(20))?;
    let fail = st.get("FAIL").copied().unwrap_or(0);
    let back = testing::read_topic(&args.namesrv, &env.topic, all_ids.len(), Duration::from_secs(300))?;
    let got: HashSet<u64> = back.messages.iter().filter_map(|m| m.event_id()).collect();
    let lost = all_ids.iter().filter(|id| !got.contains(id)).count();
    let dups = back.duplicates();
    println!();
    println!(
        "stale_claim: strategy={} cycles={cycles_done} paused_rows={} stale_acks={stale_metric} possible_duplicates={possible_dups} \
         lost_leases_logged={lost_leases} unrecorded_rounds_logged={unrecorded} events={} delivered={} lost={lost} duplicates={dups} (bound {}) fail_rows={fail}",
        args.strategy,
        paused_rows.len(),
        all_ids.len(),
        got.len(),
        paused_rows.len()
    );
    if stale_metric == 0 && possible_dups == 0 && lost_leases == 0 && unrecorded == 0 {
        violations.push(
            "neither A's metrics (outbox_stale_acks, outbox_possible_duplicates) nor its log shows the lost claim"
                .into(),
        );
    } else if stale_metric == 0 && possible_dups == 0 {
        println!(
            "note: no late *ack* in {cycles_done} cycles (A's sends ended by their deadline after SIGCONT); \
             A's log shows the {lost_leases} lost leases and {unrecorded} held rounds that could not record their sends, \
             and the rows were unchanged"
        );
    }
    if lost > 0 {
        violations.push(format!("{lost} events lost"));
    }
    if dups > paused_rows.len() {
        violations.push(format!(
            "{dups} duplicates exceed the {} paused rows",
            paused_rows.len()
        ));
    }
    if fail > 0 {
        violations.push(format!("{fail} FAIL rows"));
    }
    for v in &violations {
        println!("VIOLATION: {v}");
    }
    if violations.is_empty() {
        println!("OK: the late acks changed nothing and every event was delivered");
        if !args.keep {
            env.drop_db();
            let _ = std::fs::remove_dir_all(&env.dir);
        }
    } else {
        println!("kept database {} and logs in {}", env.db, env.dir.display());
    }
    Ok(violations.is_empty())
}
