//! The outbox beside what a RocketMQ user would pick instead: RocketMQ's own transactional
//! messages. Both parts in one run, the same order workload, the same writers, the same rate.
//!
//! - **txmsg**: a `TransactionMQProducer` sends a half message; its `execute_local_transaction`
//!   runs the order's MariaDB transaction (INSERT the order, COMMIT) and answers COMMIT_MESSAGE
//!   (ROLLBACK_MESSAGE on an error); its `check_local_transaction` answers the broker's check-back
//!   from the database: COMMIT when the order row exists, UNKNOW while it may still be in flight,
//!   ROLLBACK once the half message is older than a minute without one.
//! - **outbox**: the order's transaction also enqueues its event (`outbox::enqueue_in_tx`),
//!   commits, wakes the relay (`Relay::notify`); one relay with the defaults publishes.
//!
//! Each part gets a fresh database (`outbox::migrate`, `t_order` with a unique `order_no`, which
//! the check-back looks up) and a fresh topic, created by one warm-up order through the same path
//! before anything is measured. Every order carries its `order_no` as the `bizNo` property and a
//! ~200-byte JSON payload. A consumer (`RocketMqSource`, a group of its own, polled in a loop)
//! notes when each order's message first arrives. Per part:
//!
//! 1. **flat out**: W writer threads (one connection each) write N orders as fast as they can;
//!    orders/s = N / (first order started → last message consumer-visible);
//! 2. **latency**: the same writers at a fixed rate (R orders/s, scheduled open-loop) for S s;
//!    commit → consumer-visible per order = arrival − the writer's commit (same process, one
//!    `Instant` clock), p50 and p99;
//! 3. **MariaDB CPU per order** during (2): `/proc/<mariadbd>/stat` utime + stime from before the
//!    first order to after the last message arrived and the server purged the row versions and
//!    flushed the pages the phase left (what `sent.rows = delete` defers; the work before it is
//!    settled the same way first), divided by the orders. It counts everything
//!    the server did meanwhile: run it on a quiet machine.
//!
//! The client runs `execute_local_transaction` on its runtime's blocking lane, which admits
//! 2 × the runtime's parallelism at once; the txmsg producer's runtime is sized so that all W
//! writers' local transactions can run at once.
//!
//! `cargo bench --features rocketmq --bench txmsg [-- --orders N] [--writers W] [--rate R]
//! [--secs S] [--quick]` (defaults 20 000, 8, 1 000/s, 15 s; `--quick`: 2 000 orders, 500/s for
//! 3 s). Needs MariaDB on 127.0.0.1:3306 (root) and the name server and broker (`scripts/rocketmq
//! start`).

use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use cheetah_string::CheetahString;
use mysql::prelude::Queryable;
use mysql::{Opts, Pool, PooledConn, TxOpts};
use parking_lot::Mutex;
use rocketmq_client_rust::{
    ClientConfig, ClientRuntime, ClientRuntimeConfig, LocalTransactionState, TransactionListener, TransactionMQProducer,
};
use rocketmq_model::common::message::message_ext::MessageExt;
use rocketmq_model::common::message::message_single::Message as MqMessage;
use rocketmq_model::common::message::MessageTrait;
use rocketmq_observability::TelemetryRuntimeGuard;
use rocketmq_runtime::{RuntimeConfig, RuntimeOwner};

use outbox::consumer::Source;
use outbox::rocketmq::{describe, RocketMqPublisher, RocketMqSource, SourceConfig};
use outbox::{Config, NewEvent, Relay};

mod support;
use support::{at_least_one, server_cpu, server_pid};

const SERVER: &str = "mysql://root@127.0.0.1:3306";
const NAMESRV: &str = "127.0.0.1:9876";
const INSERT_ORDER: &str = "INSERT INTO t_order (order_no, user_id, amount_cents, status) VALUES (?, ?, ?, 'CREATED')";
/// How long the arrivals may stand still before a phase gives up on the missing messages (longer
/// than the broker's check-back period, 30 s by default, plus its 6 s transaction timeout).
const STALL: Duration = Duration::from_secs(40);

struct Args {
    orders: usize,
    writers: usize,
    rate: u64,
    secs: u64,
    quick: bool,
}

fn args() -> Args {
    let mut a = Args {
        orders: 20_000,
        writers: 8,
        rate: 1000,
        secs: 15,
        quick: false,
    };
    let (mut orders, mut rate, mut secs) = (None, None, None);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--orders" => orders = Some(at_least_one("--orders", it.next())),
            "--writers" => a.writers = at_least_one("--writers", it.next()),
            "--rate" => rate = Some(at_least_one("--rate", it.next()) as u64),
            "--secs" => secs = Some(at_least_one("--secs", it.next()) as u64),
            "--quick" => a.quick = true,
            "--bench" => {}
            other => panic!("unknown argument {other:?} (--orders N, --writers W, --rate R, --secs S, --quick)"),
        }
    }
    if a.quick {
        (a.orders, a.rate, a.secs) = (2_000, 500, 3);
    }
    a.orders = orders.unwrap_or(a.orders);
    a.rate = rate.unwrap_or(a.rate);
    a.secs = secs.unwrap_or(a.secs);
    a
}

// ---------------------------------------------------------------- the server's side

fn history_length(pool: &Pool) -> u64 {
    pool.get_conn()
        .unwrap()
        .query_first("SELECT `COUNT` FROM information_schema.INNODB_METRICS WHERE NAME = 'trx_rseg_history_len'")
        .unwrap()
        .unwrap_or(0)
}

/// Waits (at most 60 s) until the server has done what the work before left for later: the
/// purge of old row versions (the history list back to `history0` or below a few hundred) and
/// the flush of the pages it dirtied (forced with `innodb_max_dirty_pages_pct = 0`, back to
/// the default 90 after), so that each measured window pays for its own writes only.
fn purged(pool: &Pool, history0: u64) {
    let mut c = pool.get_conn().unwrap();
    c.query_drop("SET GLOBAL innodb_max_dirty_pages_pct = 0").unwrap();
    let started = Instant::now();
    loop {
        let dirty: u64 = c
            .query_first::<(String, u64), _>("SHOW GLOBAL STATUS LIKE 'Innodb_buffer_pool_pages_dirty'")
            .unwrap()
            .map(|r| r.1)
            .unwrap_or(0);
        let settled = dirty < 50 && history_length(pool) <= history0.max(500);
        if settled || started.elapsed() > Duration::from_secs(60) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    c.query_drop("SET GLOBAL innodb_max_dirty_pages_pct = 90").unwrap();
}

/// A database of its own: the outbox's tables and `t_order`, dropped at the end.
struct Db {
    name: String,
    url: String,
    pool: Pool,
}

impl Db {
    fn fresh(tag: &str) -> Db {
        let name = format!("outbox_txmsg_{tag}_{}", std::process::id());
        let server = Pool::new(Opts::from_url(SERVER).unwrap()).expect("MariaDB on 127.0.0.1:3306");
        let mut c = server.get_conn().unwrap();
        c.query_drop(format!("DROP DATABASE IF EXISTS {name}")).unwrap();
        c.query_drop(format!("CREATE DATABASE {name}")).unwrap();
        let url = format!("{SERVER}/{name}");
        let pool = Pool::new(Opts::from_url(&url).unwrap()).unwrap();
        outbox::migrate(&pool).unwrap();
        // The unique order_no is what the check-back looks orders up by.
        pool.get_conn()
            .unwrap()
            .query_drop(
                "CREATE TABLE t_order (id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY, \
                 order_no VARCHAR(64) NOT NULL, user_id BIGINT UNSIGNED NOT NULL, amount_cents BIGINT NOT NULL, \
                 status VARCHAR(16) NOT NULL, created_at DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3), \
                 UNIQUE KEY uk_order_no (order_no), KEY idx_user (user_id)) ENGINE = InnoDB",
            )
            .unwrap();
        Db { name, url, pool }
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

// ---------------------------------------------------------------- orders and their arrivals

/// One phase's orders `<prefix>-<i>`: when each committed and when its message first arrived
/// (nanoseconds after `base` plus one; 0: not yet).
struct Timeline {
    prefix: String,
    base: Instant,
    committed: Vec<AtomicU64>,
    arrived: Vec<AtomicU64>,
    arrivals: AtomicU64,
    duplicates: AtomicU64,
}

impl Timeline {
    fn new(prefix: String, n: usize) -> Arc<Timeline> {
        Arc::new(Timeline {
            prefix,
            base: Instant::now(),
            committed: (0..n).map(|_| AtomicU64::new(0)).collect(),
            arrived: (0..n).map(|_| AtomicU64::new(0)).collect(),
            arrivals: AtomicU64::new(0),
            duplicates: AtomicU64::new(0),
        })
    }

    fn len(&self) -> usize {
        self.committed.len()
    }

    fn order_no(&self, i: usize) -> String {
        format!("{}-{i}", self.prefix)
    }

    fn stamp(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.base).as_nanos() as u64 + 1
    }

    fn commit(&self, i: usize) {
        self.committed[i].store(self.stamp(Instant::now()), Relaxed);
    }

    fn arrive(&self, i: usize, at: Instant) {
        let Some(slot) = self.arrived.get(i) else { return };
        if slot.compare_exchange(0, self.stamp(at), Relaxed, Relaxed).is_ok() {
            self.arrivals.fetch_add(1, Relaxed);
        } else {
            self.duplicates.fetch_add(1, Relaxed);
        }
    }

    fn commits(&self) -> u64 {
        self.committed.iter().filter(|c| c.load(Relaxed) > 0).count() as u64
    }

    /// Seconds from `base` to the latest stamp in `slots`.
    fn last(slots: &[AtomicU64]) -> f64 {
        slots.iter().map(|s| s.load(Relaxed)).max().unwrap_or(0) as f64 / 1e9
    }

    /// Commit → arrival of every order that did both, in milliseconds, sorted.
    fn latencies(&self) -> Vec<f64> {
        let mut v: Vec<f64> = self
            .committed
            .iter()
            .zip(&self.arrived)
            .filter_map(|(c, a)| match (c.load(Relaxed), a.load(Relaxed)) {
                (0, _) | (_, 0) => None,
                (c, a) => Some(a.saturating_sub(c) as f64 / 1e6),
            })
            .collect();
        v.sort_by(f64::total_cmp);
        v
    }
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// ~200 bytes of JSON, the same for both parts.
fn payload(order_no: &str, i: usize) -> String {
    format!(
        "{{\"order\":\"{order_no}\",\"user_id\":{},\"amount_cents\":1999,\"currency\":\"CNY\",\"note\":\"{}\"}}",
        i % 10_000,
        "x".repeat(120)
    )
}

fn insert_order(tx: &mut mysql::Transaction<'_>, order_no: &str, i: usize) -> mysql::Result<()> {
    tx.exec_drop(INSERT_ORDER, (order_no, (i % 10_000) as u64, 1999i64))
}

/// A consumer of the part's topic noting each order's arrival on its phase's timeline.
struct Watcher {
    phases: Arc<Mutex<HashMap<String, Arc<Timeline>>>>,
    /// Messages without a known order (no `bizNo`, or of no phase).
    foreign: Arc<AtomicU64>,
    /// What the first of them looked like.
    first_foreign: Arc<Mutex<Option<String>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watcher {
    /// Starts consuming `topic`, noting the orders of `first` from the first message on.
    fn start(topic: &str, first: &Arc<Timeline>) -> Watcher {
        let group = format!("bench_txmsg_{:08x}", rand::random::<u32>());
        let src = RocketMqSource::start(&SourceConfig::new(NAMESRV, topic, &group)).expect("consumer source");
        let phases = Arc::new(Mutex::new(HashMap::from([(first.prefix.clone(), first.clone())])));
        let foreign = Arc::new(AtomicU64::new(0));
        let first_foreign: Arc<Mutex<Option<String>>> = Arc::default();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let thread = {
            let (phases, foreign, first_foreign, stop) =
                (phases.clone(), foreign.clone(), first_foreign.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Relaxed) {
                    let batch = match src.poll(Duration::from_millis(100)) {
                        Ok(b) => b,
                        Err(e) => {
                            eprintln!("  consumer poll: {e}");
                            std::thread::sleep(Duration::from_millis(100));
                            continue;
                        }
                    };
                    let at = Instant::now();
                    let phases = phases.lock();
                    for m in &batch {
                        let found = m
                            .biz_no()
                            .and_then(|no| no.rsplit_once('-'))
                            .and_then(|(prefix, i)| Some((phases.get(prefix)?, i.parse::<usize>().ok()?)));
                        match found {
                            Some((tl, i)) => tl.arrive(i, at),
                            None => {
                                if foreign.fetch_add(1, Relaxed) == 0 {
                                    *first_foreign.lock() = Some(format!(
                                        "key {:?}, tag {:?}, properties {:?}, body {:?}",
                                        m.key,
                                        m.tag,
                                        m.properties,
                                        String::from_utf8_lossy(&m.body[..m.body.len().min(40)])
                                    ));
                                }
                            }
                        }
                    }
                }
                src.shutdown();
            })
        };
        Watcher {
            phases,
            foreign,
            first_foreign,
            stop,
            thread: Some(thread),
        }
    }

    fn watch(&self, tl: &Arc<Timeline>) {
        self.phases.lock().insert(tl.prefix.clone(), tl.clone());
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Waits until every committed order's message arrived, or nothing new arrived for [`STALL`]
/// after the writers ended. Whether all did.
fn all_arrived(tl: &Timeline) -> bool {
    let mut seen = (u64::MAX, Instant::now());
    loop {
        let n = tl.arrivals.load(Relaxed);
        if n >= tl.commits() {
            return true;
        }
        if n != seen.0 {
            seen = (n, Instant::now());
        } else if seen.1.elapsed() > STALL {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

// ---------------------------------------------------------------- the two ways

/// One way of writing an order with its message.
trait Part: Sync {
    /// Writes order `i` of `tl` on the writer's connection, committed, its commit stamped.
    fn order(&self, conn: &Arc<Mutex<PooledConn>>, tl: &Arc<Timeline>, i: usize) -> Result<(), String>;
    /// What the part saw on its side (client retries, check-backs), for the notes.
    fn notes(&self) -> Vec<String>;
    /// Stops the relay, or the producer and its runtimes.
    fn stop(self: Box<Self>);
}

struct OutboxPart {
    relay: Relay,
}

impl Part for OutboxPart {
    fn order(&self, conn: &Arc<Mutex<PooledConn>>, tl: &Arc<Timeline>, i: usize) -> Result<(), String> {
        let order_no = tl.order_no(i);
        let mut c = conn.lock();
        let mut tx = c.start_transaction(TxOpts::default()).map_err(|e| e.to_string())?;
        insert_order(&mut tx, &order_no, i).map_err(|e| e.to_string())?;
        let event = NewEvent::new(order_no.as_str(), "ORDER_CREATED", payload(&order_no, i));
        outbox::enqueue_in_tx(&mut tx, &event).map_err(|e| e.to_string())?;
        tx.commit().map_err(|e| e.to_string())?;
        tl.commit(i);
        self.relay.notify();
        Ok(())
    }

    fn notes(&self) -> Vec<String> {
        let s = self.relay.counters();
        let mut notes = vec![format!("relay sent {}", s.sent)];
        if s.retried > 0 || s.dead_lettered > 0 || s.possible_duplicates > 0 {
            notes.push(format!(
                "relay retried {}, dead-lettered {}, possible duplicates {}",
                s.retried, s.dead_lettered, s.possible_duplicates
            ));
        }
        notes
    }

    fn stop(self: Box<Self>) {
        self.relay.stop(Duration::from_secs(10));
    }
}

/// What the transaction listener did.
#[derive(Default)]
struct ListenerCounts {
    local_errors: AtomicU64,
    first_error: Mutex<Option<String>>,
    checks: AtomicU64,
    checks_commit: AtomicU64,
    checks_unknown: AtomicU64,
    checks_rollback: AtomicU64,
}

/// What the writer hands the local transaction: its connection and the order.
struct Job {
    conn: Arc<Mutex<PooledConn>>,
    tl: Arc<Timeline>,
    i: usize,
}

/// Runs the order's transaction for a half message, and answers check-backs from `t_order`.
struct OrderListener {
    pool: Pool,
    counts: Arc<ListenerCounts>,
}

impl OrderListener {
    fn local(job: &Job) -> Result<(), String> {
        let order_no = job.tl.order_no(job.i);
        let mut c = job.conn.lock();
        let mut tx = c.start_transaction(TxOpts::default()).map_err(|e| e.to_string())?;
        insert_order(&mut tx, &order_no, job.i).map_err(|e| e.to_string())?;
        tx.commit().map_err(|e| e.to_string())?;
        job.tl.commit(job.i);
        Ok(())
    }

    fn check(&self, msg: &MessageExt) -> Result<LocalTransactionState, String> {
        let order_no = msg
            .property(&CheetahString::from_static_str("bizNo"))
            .ok_or("the half message has no bizNo")?;
        let mut c = self.pool.get_conn().map_err(|e| e.to_string())?;
        let found: Option<u8> = c
            .exec_first("SELECT 1 FROM t_order WHERE order_no = ?", (order_no.as_str(),))
            .map_err(|e| e.to_string())?;
        if found.is_some() {
            return Ok(LocalTransactionState::CommitMessage);
        }
        // No order: still in flight (a local transaction runs for milliseconds here), or rolled back.
        let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64;
        Ok(if now_ms - msg.born_timestamp() > 60_000 {
            LocalTransactionState::RollbackMessage
        } else {
            LocalTransactionState::Unknown
        })
    }
}

impl TransactionListener for OrderListener {
    fn execute_local_transaction(
        &self,
        _msg: &dyn MessageTrait,
        arg: Option<&(dyn Any + Send + Sync)>,
    ) -> LocalTransactionState {
        let result = match arg.and_then(|a| a.downcast_ref::<Job>()) {
            Some(job) => Self::local(job),
            None => Err("no order was handed to the local transaction".into()),
        };
        match result {
            Ok(()) => LocalTransactionState::CommitMessage,
            Err(e) => {
                self.counts.local_errors.fetch_add(1, Relaxed);
                self.counts.first_error.lock().get_or_insert(e);
                LocalTransactionState::RollbackMessage
            }
        }
    }

    fn check_local_transaction(&self, msg: &MessageExt) -> LocalTransactionState {
        self.counts.checks.fetch_add(1, Relaxed);
        let state = self.check(msg).unwrap_or_else(|e| {
            self.counts.first_error.lock().get_or_insert(format!("check-back: {e}"));
            LocalTransactionState::Unknown
        });
        match state {
            LocalTransactionState::CommitMessage => &self.counts.checks_commit,
            LocalTransactionState::Unknown => &self.counts.checks_unknown,
            LocalTransactionState::RollbackMessage => &self.counts.checks_rollback,
        }
        .fetch_add(1, Relaxed);
        state
    }
}

struct TxMsgPart {
    topic: String,
    owner: RuntimeOwner,
    client_runtime: Arc<ClientRuntime>,
    producer: TransactionMQProducer,
    telemetry: Option<TelemetryRuntimeGuard>,
    counts: Arc<ListenerCounts>,
    /// Half messages that failed to send and were sent again (the order was not written).
    resends: AtomicU64,
}

impl TxMsgPart {
    /// A runtime of its own, the client runtime on it and a started transactional producer, as
    /// `RocketMqPublisher::start` does it.
    fn start(pool: &Pool, topic: &str, writers: usize) -> Result<TxMsgPart, String> {
        // Parallelism p gives the blocking lane that runs the local transactions 2p slots.
        let parallelism = writers.div_ceil(2).max(2);
        let owner = RuntimeOwner::plan(RuntimeConfig::for_parallelism("bench-txmsg", parallelism))
            .map_err(|e| format!("runtime configuration: {e}"))?
            .build()
            .map_err(|e| format!("runtime: {e}"))?;
        let telemetry = TelemetryRuntimeGuard::noop();
        let client_runtime = ClientRuntime::try_new(
            owner.root_context().component("bench-txmsg-client"),
            ClientRuntimeConfig::default(),
            telemetry.handle(),
        )
        .map_err(|e| format!("client runtime: {}", describe(&e)))?;
        let mut client_config = ClientConfig::new();
        client_config.set_instance_name(CheetahString::from_string(format!(
            "bench-txmsg-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        )));
        let counts = Arc::new(ListenerCounts::default());
        let mut producer = TransactionMQProducer::builder(client_runtime.clone())
            .client_config(client_config)
            .producer_group(format!("bench_txmsg_{:08x}", rand::random::<u32>()))
            .name_server_addr(NAMESRV)
            .send_msg_timeout(3000)
            .transaction_listener(OrderListener {
                pool: pool.clone(),
                counts: counts.clone(),
            })
            .build();
        owner
            .block_on(producer.start())
            .map_err(|e| format!("transactional producer start: {}", describe(&e)))?;
        Ok(TxMsgPart {
            topic: topic.into(),
            owner,
            client_runtime,
            producer,
            telemetry: Some(telemetry),
            counts,
            resends: AtomicU64::new(0),
        })
    }

    fn message(&self, order_no: &str, i: usize) -> Result<MqMessage, String> {
        MqMessage::builder()
            .topic(self.topic.as_str())
            .tags("ORDER_CREATED")
            .key(order_no)
            .body(payload(order_no, i).into_bytes())
            .raw_property("bizNo", order_no)
            .map_err(|e| e.to_string())?
            .build()
            .map_err(|e| e.to_string())
    }

    fn shutdown(mut self) {
        self.owner.block_on(async {
            let _ = tokio::time::timeout(Duration::from_secs(5), self.producer.shutdown()).await;
            let _ = tokio::time::timeout(Duration::from_secs(5), self.client_runtime.shutdown()).await;
        });
        drop(self.producer);
        drop(self.client_runtime);
        if let Err(e) = self
            .owner
            .shutdown_runtime_blocking_with_timeout(Duration::from_secs(5))
        {
            eprintln!("  txmsg runtime shutdown: {e}");
        }
        drop(self.telemetry.take());
    }
}

impl Part for TxMsgPart {
    fn order(&self, conn: &Arc<Mutex<PooledConn>>, tl: &Arc<Timeline>, i: usize) -> Result<(), String> {
        let order_no = tl.order_no(i);
        let mut last = String::new();
        // A half message that failed to send ran no local transaction: send it again.
        for attempt in 0..3 {
            if attempt > 0 {
                self.resends.fetch_add(1, Relaxed);
                std::thread::sleep(Duration::from_millis(100));
            }
            let job = Job {
                conn: conn.clone(),
                tl: tl.clone(),
                i,
            };
            let msg = self.message(&order_no, i)?;
            match self
                .owner
                .block_on(self.producer.send_message_in_transaction(msg, Some(job)))
            {
                Ok(r) => {
                    return match r.local_transaction_state {
                        Some(LocalTransactionState::CommitMessage) => Ok(()),
                        other => Err(format!("local transaction ended {other:?}")),
                    }
                }
                Err(e) => last = describe(&e),
            }
        }
        Err(format!("half message not sent: {last}"))
    }

    fn notes(&self) -> Vec<String> {
        let c = &self.counts;
        let mut notes = vec![format!(
            "check-backs answered {} (commit {}, unknown {}, rollback {})",
            c.checks.load(Relaxed),
            c.checks_commit.load(Relaxed),
            c.checks_unknown.load(Relaxed),
            c.checks_rollback.load(Relaxed)
        )];
        let resends = self.resends.load(Relaxed);
        if resends > 0 {
            notes.push(format!("half messages sent again {resends}"));
        }
        let errors = c.local_errors.load(Relaxed);
        if errors > 0 {
            notes.push(format!("local transactions failed {errors}"));
        }
        if let Some(e) = c.first_error.lock().as_ref() {
            notes.push(format!("first error: {e}"));
        }
        notes
    }

    fn stop(self: Box<Self>) {
        self.shutdown();
    }
}

// ---------------------------------------------------------------- a part's run

/// W writers, one connection each, writing every order of `tl`: as fast as they can, or at
/// `rate` per second on an open-loop schedule (order i at `base + i / rate`). The errors, and
/// the first.
fn write(part: &dyn Part, pool: &Pool, tl: &Arc<Timeline>, writers: usize, rate: Option<u64>) -> (u64, Option<String>) {
    let next = AtomicUsize::new(0);
    let errors = AtomicU64::new(0);
    let first = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..writers {
            s.spawn(|| {
                let conn = Arc::new(Mutex::new(pool.get_conn().unwrap()));
                loop {
                    let i = next.fetch_add(1, Relaxed);
                    if i >= tl.len() {
                        break;
                    }
                    if let Some(rate) = rate {
                        let at = tl.base + Duration::from_secs_f64(i as f64 / rate as f64);
                        if let Some(wait) = at.checked_duration_since(Instant::now()) {
                            std::thread::sleep(wait);
                        }
                    }
                    if let Err(e) = part.order(&conn, tl, i) {
                        errors.fetch_add(1, Relaxed);
                        first.lock().get_or_insert(e);
                    }
                }
            });
        }
    });
    (errors.into_inner(), first.into_inner())
}

/// One part's line of the table.
struct Row {
    name: &'static str,
    flat_rate: f64,
    p50: f64,
    p99: f64,
    cpu_us: f64,
    notes: Vec<String>,
}

/// Both phases of one part, on its own database, topic and consumer.
fn run(name: &'static str, a: &Args, pid: u32) -> Row {
    let db = Db::fresh(name);
    let history0 = history_length(&db.pool);
    let topic = format!(
        "BENCH_txmsg_{name}_{}_{:08x}",
        std::process::id(),
        rand::random::<u32>()
    );
    let tag = if name == "outbox" { "OB" } else { "TX" };
    let part: Box<dyn Part> = if name == "outbox" {
        let mut cfg = Config::new(&db.url);
        cfg.topic = topic.clone();
        cfg.rocketmq.namesrv = NAMESRV.into();
        let publisher = Arc::new(RocketMqPublisher::start(&cfg).expect("publisher"));
        Box::new(OutboxPart {
            relay: Relay::builder(cfg).publisher(publisher).start().expect("relay"),
        })
    } else {
        match TxMsgPart::start(&db.pool, &topic, a.writers) {
            Ok(p) => Box::new(p),
            Err(e) => {
                return Row {
                    name,
                    flat_rate: f64::NAN,
                    p50: f64::NAN,
                    p99: f64::NAN,
                    cpu_us: f64::NAN,
                    notes: vec![format!("DID NOT RUN: {e}")],
                }
            }
        }
    };
    let mut notes = Vec::new();

    // The topic comes to exist with the first message, through the part's own path.
    let warm = Timeline::new(format!("{tag}-W"), 1);
    let (errors, first) = write(part.as_ref(), &db.pool, &warm, 1, None);
    let watcher = Watcher::start(&topic, &warm);
    let warmed = errors == 0 && all_arrived(&warm);
    println!(
        "{name}: warm-up order {} ({:.0} ms to consumer-visible)",
        if warmed { "arrived" } else { "DID NOT ARRIVE" },
        Timeline::last(&warm.arrived) * 1e3
    );
    if !warmed {
        notes.push(format!(
            "warm-up failed: {}",
            first.unwrap_or_else(|| "the message never arrived".into())
        ));
    }

    // 1. Flat out.
    let flat = Timeline::new(format!("{tag}-F"), a.orders);
    watcher.watch(&flat);
    let (errors, first) = write(part.as_ref(), &db.pool, &flat, a.writers, None);
    let commit_secs = Timeline::last(&flat.committed);
    let complete = all_arrived(&flat);
    let visible_secs = Timeline::last(&flat.arrived);
    let arrived = flat.arrivals.load(Relaxed);
    let flat_rate = if complete && arrived == a.orders as u64 {
        a.orders as f64 / visible_secs
    } else {
        f64::NAN
    };
    println!(
        "{name}: flat out: {} orders committed in {commit_secs:.2} s ({:.0}/s), {arrived} visible after {visible_secs:.2} s",
        flat.commits(),
        flat.commits() as f64 / commit_secs
    );
    notes.push(format!("commits {:.0}/s flat out", flat.commits() as f64 / commit_secs));
    if errors > 0 {
        notes.push(format!(
            "flat out: {errors} orders failed ({})",
            first.unwrap_or_default()
        ));
    }
    if arrived < flat.commits() {
        notes.push(format!("flat out: {} messages MISSING", flat.commits() - arrived));
    }

    // 2 and 3. The fixed rate, and what it cost the server.
    purged(&db.pool, history0);
    let n = (a.rate * a.secs) as usize;
    let paced = Timeline::new(format!("{tag}-R"), n);
    watcher.watch(&paced);
    let cpu0 = server_cpu(pid);
    let (errors, first) = write(part.as_ref(), &db.pool, &paced, a.writers, Some(a.rate));
    let write_secs = Timeline::last(&paced.committed);
    let complete = all_arrived(&paced);
    purged(&db.pool, history0);
    let cpu = server_cpu(pid) - cpu0;
    let lat = paced.latencies();
    let arrived = paced.arrivals.load(Relaxed);
    println!(
        "{name}: {} orders at {}/s (held {:.0}/s): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; MariaDB {:.2} s CPU",
        paced.commits(),
        a.rate,
        paced.commits() as f64 / write_secs,
        percentile(&lat, 0.5),
        percentile(&lat, 0.99),
        lat.last().copied().unwrap_or(f64::NAN),
        cpu
    );
    if errors > 0 {
        notes.push(format!(
            "at {}/s: {errors} orders failed ({})",
            a.rate,
            first.unwrap_or_default()
        ));
    }
    if !complete {
        notes.push(format!(
            "at {}/s: {} messages MISSING",
            a.rate,
            paced.commits() - arrived
        ));
    }
    let rate_held = paced.commits() as f64 / write_secs;
    if rate_held < a.rate as f64 * 0.95 {
        notes.push(format!("rate NOT held: {rate_held:.0}/s"));
    }
    let dups = [&warm, &flat, &paced]
        .iter()
        .map(|t| t.duplicates.load(Relaxed))
        .sum::<u64>();
    notes.push(format!("duplicates {dups}"));
    let foreign = watcher.foreign.load(Relaxed);
    if foreign > 0 {
        notes.push(format!(
            "messages of no order {foreign} (the first: {})",
            watcher.first_foreign.lock().as_deref().unwrap_or("?")
        ));
    }
    notes.extend(part.notes());
    drop(watcher);
    part.stop();
    Row {
        name,
        flat_rate,
        p50: percentile(&lat, 0.5),
        p99: percentile(&lat, 0.99),
        cpu_us: cpu * 1e6 / paced.commits().max(1) as f64,
        notes,
    }
}

fn fmt(v: f64, decimals: usize) -> String {
    if v.is_nan() {
        "-".into()
    } else {
        format!("{v:.decimals$}")
    }
}

fn main() {
    let a = args();
    let pid = server_pid();
    let command: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    println!(
        "command: cargo bench --features rocketmq --bench txmsg -- {}",
        command.join(" ")
    );
    println!(
        "txmsg: {} orders flat out, then {}/s for {} s; {} writers; payload {} bytes; MariaDB pid {pid}",
        a.orders,
        a.rate,
        a.secs,
        a.writers,
        payload("TX-R-10000", 10_000).len()
    );
    let started = Instant::now();
    let rows: Vec<Row> = ["txmsg", "outbox"].iter().map(|name| run(name, &a, pid)).collect();
    println!();
    println!(
        "| part | orders/s flat out | p50 ms | p99 ms | MariaDB CPU µs per order (at {}/s) | notes |",
        a.rate
    );
    println!("|---|---:|---:|---:|---:|---|");
    for r in &rows {
        let name = match r.name {
            "txmsg" => "RocketMQ transactional messages",
            _ => "outbox (relay defaults)",
        };
        println!(
            "| {name} | {} | {} | {} | {} | {} |",
            fmt(r.flat_rate, 0),
            fmt(r.p50, 1),
            fmt(r.p99, 1),
            fmt(r.cpu_us, 1),
            r.notes.join("; ")
        );
    }
    println!();
    println!(
        "{} writers, flat out {} orders, then {}/s for {} s; the whole run took {:.0} s{}",
        a.writers,
        a.orders,
        a.rate,
        a.secs,
        started.elapsed().as_secs_f64(),
        if a.quick {
            " (--quick: a smoke run, not a measurement)"
        } else {
            ""
        }
    );
}
