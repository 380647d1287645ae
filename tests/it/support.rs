//! Shared test fixtures: a throwaway database per test and a scriptable recording publisher.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mysql::prelude::Queryable;
use mysql::{Opts, Pool};
use parking_lot::Mutex;

use outbox::{Config, NewEvent, OutboundEvent, Publisher, Relay, SendError, SendOutcome};

/// Server URL without a database; `OUTBOX_TEST_MYSQL` overrides it.
pub fn server_url() -> String {
    std::env::var("OUTBOX_TEST_MYSQL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306".into())
}

/// A database of its own for one test, migrated ([`TestDb::new`]) or empty, dropped when the
/// value is dropped.
pub struct TestDb {
    pub name: String,
    pub url: String,
    pub pool: Pool,
}

impl TestDb {
    pub fn new(tag: &str) -> TestDb {
        let db = TestDb::empty(tag);
        outbox::migrate(&db.pool).expect("migrations apply");
        db
    }

    /// A database of its own with no table in it.
    pub fn empty(tag: &str) -> TestDb {
        let _ = env_logger::builder().is_test(true).try_init();
        let name = format!("outbox_t_{}_{:08x}", tag, rand::random::<u32>());
        let server = Pool::new(Opts::from_url(&server_url()).unwrap()).expect("MariaDB on 127.0.0.1:3306");
        server
            .get_conn()
            .unwrap()
            .query_drop(format!("CREATE DATABASE {name}"))
            .unwrap();
        let url = format!("{}/{}", server_url(), name);
        let pool = Pool::new(Opts::from_url(&url).unwrap()).unwrap();
        TestDb { name, url, pool }
    }

    /// The project's defaults pointed at this database, with timings short enough for tests.
    pub fn config(&self) -> Config {
        let mut c = Config::new(&self.url);
        c.scan_interval = Duration::from_millis(50);
        c.reclaim_interval = Duration::from_millis(100);
        // Sent rows stay, so tests read every outcome from the table; `sent.rows = delete`
        // (the default) has tests of its own.
        c.sent_rows = outbox::SentRows::Keep;
        c
    }

    pub fn conn(&self) -> mysql::PooledConn {
        self.pool.get_conn().unwrap()
    }

    /// `(id, status, retry_count, claim_owner)` of every row, by id.
    pub fn rows(&self) -> Vec<(u64, String, u32, Option<String>)> {
        self.conn()
            .query("SELECT id, status, retry_count, claim_owner FROM t_event_record ORDER BY id")
            .unwrap()
    }

    pub fn count(&self, status: &str) -> u64 {
        self.conn()
            .exec_first("SELECT COUNT(*) FROM t_event_record WHERE status = ?", (status,))
            .unwrap()
            .unwrap_or(0)
    }

    /// Rows not yet sent, in flight or not (WAIT or SENDING).
    pub fn pending(&self) -> u64 {
        self.conn()
            .query_first("SELECT COUNT(*) FROM t_event_record WHERE status IN ('WAIT', 'SENDING')")
            .unwrap()
            .unwrap_or(0)
    }

    /// Enqueues `events` in one committed transaction (the library's INSERT), returns their ids.
    pub fn enqueue(&self, events: &[NewEvent]) -> Vec<u64> {
        let mut conn = self.conn();
        let mut tx = conn.start_transaction(mysql::TxOpts::default()).unwrap();
        let ids = events
            .iter()
            .map(|e| outbox::enqueue_in_tx(&mut tx, e).unwrap())
            .collect();
        tx.commit().unwrap();
        ids
    }

    /// Inserts `n` events directly (outside any relay), returns their ids.
    pub fn seed(&self, n: usize) -> Vec<u64> {
        let mut conn = self.conn();
        let mut ids = Vec::with_capacity(n);
        for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
            let mut tx = conn.start_transaction(mysql::TxOpts::default()).unwrap();
            for i in chunk {
                let e = outbox::NewEvent::new(format!("ORD-{i}"), "ORDER_CREATED", format!("{{\"n\":{i}}}"));
                ids.push(outbox::enqueue_in_tx(&mut tx, &e).unwrap());
            }
            tx.commit().unwrap();
        }
        ids
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Ok(server) = Pool::new(Opts::from_url(&server_url()).unwrap()) {
            if let Ok(mut c) = server.get_conn() {
                let _ = c.query_drop(format!("DROP DATABASE IF EXISTS {}", self.name));
            }
        }
    }
}

/// A relay of `cfg` as instance `id`, publishing through the recorder.
pub fn start_relay(cfg: &Config, id: &str, rec: &Arc<Recorder>) -> Relay {
    let mut cfg = cfg.clone();
    cfg.instance_id = Some(id.into());
    Relay::start(cfg, rec.clone()).unwrap()
}

/// Polls `cond` until it holds or `limit` passes; returns whether it held. This waits on a
/// condition (database state written by other threads), it is not a fixed sleep.
pub fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A scripted fault for the recording publisher.
#[derive(Clone)]
pub enum Fault {
    /// Fail this event id's sends with this error, `times` times (usize::MAX = always).
    Fail { id: u64, error: SendError, times: usize },
    /// Fail every send whatever the event (broker down).
    FailAll(SendError),
    /// Delay sends of this event id by this long (`times` times), then succeed.
    Delay { id: u64, by: Duration, times: usize },
    /// Panic when this event id is sent (`times` times).
    Panic { id: u64, times: usize },
}

/// Records every successful send (event id → number of sends and who sent it) and applies faults.
#[derive(Default)]
pub struct Recorder {
    pub sent: Mutex<HashMap<u64, usize>>,
    pub sent_events: Mutex<Vec<OutboundEvent>>,
    pub calls: AtomicUsize,
    faults: Mutex<Vec<Fault>>,
    hits: Mutex<HashMap<(u64, u8), usize>>,
    /// Publish calls holding events of each biz_no right now, and how often two calls held the
    /// same key at once (a key's run travels in one call; two calls could reorder it).
    in_flight_by_key: Mutex<HashMap<String, usize>>,
    pub key_overlaps: AtomicUsize,
    /// Behave as an ordered publisher: after an event of a key fails, the key's later events in
    /// the same call are not sent (outcome Parked).
    ordered: bool,
    /// Hint that keys go to this many queues (a key's queue: its hash modulo this), as the
    /// RocketMQ publisher does for ordered topics.
    queues: Option<u64>,
    /// Every call's events, in call order.
    pub call_log: Mutex<Vec<Vec<OutboundEvent>>>,
}

impl Recorder {
    pub fn new() -> Arc<Recorder> {
        Arc::new(Recorder::default())
    }

    pub fn with_faults(faults: Vec<Fault>) -> Arc<Recorder> {
        let r = Recorder::default();
        *r.faults.lock() = faults;
        Arc::new(r)
    }

    /// A recorder with the ordered publisher's contract (see the `ordered` field).
    pub fn ordered(faults: Vec<Fault>) -> Arc<Recorder> {
        let r = Recorder {
            ordered: true,
            ..Recorder::default()
        };
        *r.faults.lock() = faults;
        Arc::new(r)
    }

    /// [`Recorder::ordered`], telling the relay which of `queues` queues each key goes to.
    pub fn ordered_over_queues(queues: u64) -> Arc<Recorder> {
        Arc::new(Recorder {
            ordered: true,
            queues: Some(queues),
            ..Recorder::default()
        })
    }

    /// The queue [`Recorder::ordered_over_queues`] hints for `biz_no`.
    pub fn queue_of(&self, biz_no: &str) -> Option<u64> {
        let n = self.queues?;
        Some(outbox::ordering::queue_index(biz_no, n as usize) as u64)
    }

    pub fn set_faults(&self, faults: Vec<Fault>) {
        *self.faults.lock() = faults;
    }

    /// `(biz_no, id)` of every event sent, in the order of the sends.
    pub fn sent_keys(&self) -> Vec<(String, u64)> {
        self.sent_events
            .lock()
            .iter()
            .map(|e| (e.biz_no.clone(), e.id))
            .collect()
    }

    pub fn total_sent(&self) -> usize {
        self.sent.lock().values().sum()
    }

    pub fn sends_of(&self, id: u64) -> usize {
        self.sent.lock().get(&id).copied().unwrap_or(0)
    }

    fn hit(&self, id: u64, kind: u8, times: usize) -> bool {
        let mut h = self.hits.lock();
        let n = h.entry((id, kind)).or_insert(0);
        if *n < times {
            *n += 1;
            true
        } else {
            false
        }
    }
}

impl Publisher for Recorder {
    fn publish(&self, events: &[OutboundEvent], _timeout: Duration) -> Vec<SendOutcome> {
        self.calls.fetch_add(1, SeqCst);
        self.call_log.lock().push(events.to_vec());
        let keys: std::collections::HashSet<String> = events.iter().map(|e| e.biz_no.clone()).collect();
        for k in &keys {
            let mut m = self.in_flight_by_key.lock();
            let n = m.entry(k.clone()).or_insert(0);
            *n += 1;
            if *n > 1 {
                self.key_overlaps.fetch_add(1, SeqCst);
            }
        }
        let faults = self.faults.lock().clone();
        let mut failed_keys = std::collections::HashSet::new();
        let out = events
            .iter()
            .map(|e| {
                if self.ordered && failed_keys.contains(&e.biz_no) {
                    return SendOutcome::Failed(SendError::held_back("an earlier event of the key failed"));
                }
                let outcome = self.send_one(e, &faults);
                if matches!(outcome, SendOutcome::Failed(_)) {
                    failed_keys.insert(e.biz_no.clone());
                }
                outcome
            })
            .collect();
        for k in &keys {
            *self.in_flight_by_key.lock().get_mut(k).unwrap() -= 1;
        }
        out
    }

    fn queue_hint(&self, event: &OutboundEvent) -> Option<u64> {
        self.queue_of(&event.biz_no)
    }
}

impl Recorder {
    fn send_one(&self, e: &OutboundEvent, faults: &[Fault]) -> SendOutcome {
        for f in faults {
            match f {
                Fault::FailAll(err) => return SendOutcome::Failed(err.clone()),
                Fault::Fail { id, error, times } if *id == e.id && self.hit(e.id, 0, *times) => {
                    return SendOutcome::Failed(error.clone())
                }
                Fault::Delay { id, by, times } if *id == e.id && self.hit(e.id, 1, *times) => std::thread::sleep(*by),
                Fault::Panic { id, times } if *id == e.id && self.hit(e.id, 2, *times) => {
                    panic!("scripted panic for event {id}")
                }
                _ => {}
            }
        }
        *self.sent.lock().entry(e.id).or_insert(0) += 1;
        self.sent_events.lock().push(e.clone());
        SendOutcome::Sent {
            msg_id: Some(format!("MSG{:016X}", e.id)),
        }
    }
}

/// Whether the end-to-end parts can run: built with the RocketMQ publisher and a name server
/// answering on 127.0.0.1:9876 (`scripts/rocketmq start`).
#[allow(dead_code)]
pub fn broker_available() -> bool {
    cfg!(feature = "rocketmq")
        && std::net::TcpStream::connect_timeout(&"127.0.0.1:9876".parse().unwrap(), Duration::from_millis(500)).is_ok()
        && std::net::TcpStream::connect_timeout(&"127.0.0.1:10911".parse().unwrap(), Duration::from_millis(500)).is_ok()
}
