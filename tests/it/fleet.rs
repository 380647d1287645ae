//! One relay over many shard databases (`outbox::Fleet`, `shards`): every shard relayed, a shard
//! that cannot be opened named and started once it can, shards added and removed while the
//! others run (one removed mid-send), and a backlog on one shard not holding up another's fresh
//! events. Real MariaDB databases, one per shard; a recording publisher.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use mysql::prelude::Queryable;
use mysql::{Opts, Pool};

use crate::support::{server_url, wait_until, Fault, Recorder};
use outbox::config::ShardSpec;
use outbox::{Config, Fleet, NewEvent, OutboundEvent, Publisher, SendOutcome, ShardState};

const LIMIT: Duration = Duration::from_secs(30);

/// `n` shard databases `<base>_0` .. `<base>_{n-1}`, migrated unless listed in `missing`; all
/// dropped at the end.
pub(crate) struct Shards {
    pub(crate) base: String,
    n: usize,
    server: Pool,
}

impl Shards {
    pub(crate) fn new(tag: &str, n: usize, missing: &[usize]) -> Shards {
        let _ = env_logger::builder().is_test(true).try_init();
        let s = Shards {
            base: format!("outbox_t_{tag}_{:08x}", rand::random::<u32>()),
            n,
            server: Pool::new(Opts::from_url(&server_url()).unwrap()).unwrap(),
        };
        for i in (0..n).filter(|i| !missing.contains(i)) {
            s.create(i);
        }
        s
    }

    pub(crate) fn name(&self, i: usize) -> String {
        format!("{}_{i}", self.base)
    }

    pub(crate) fn create(&self, i: usize) {
        self.server
            .get_conn()
            .unwrap()
            .query_drop(format!("CREATE DATABASE {}", self.name(i)))
            .unwrap();
        outbox::migrate(&self.pool(i)).unwrap();
    }

    pub(crate) fn pool(&self, i: usize) -> Pool {
        Pool::new(Opts::from_url(&format!("{}/{}", server_url(), self.name(i))).unwrap()).unwrap()
    }

    /// The fleet's configuration over `<base>_{from..to}`, with test timings.
    pub(crate) fn config(&self, from: usize, to: usize) -> Config {
        Config {
            shards: Some(format!("{}/{}_{{{from}..{to}}}", server_url(), self.base)),
            scan_interval: Duration::from_millis(50),
            reclaim_interval: Duration::from_millis(100),
            sent_rows: outbox::SentRows::Keep,
            ..Config::default()
        }
    }

    pub(crate) fn enqueue(&self, i: usize, prefix: &str, n: usize) {
        let pool = self.pool(i);
        let mut conn = pool.get_conn().unwrap();
        for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
            let mut tx = conn.start_transaction(mysql::TxOpts::default()).unwrap();
            for k in chunk {
                let e = NewEvent::new(format!("{prefix}-{k}"), "ORDER_CREATED", "{}");
                outbox::enqueue_in_tx(&mut tx, &e).unwrap();
            }
            tx.commit().unwrap();
        }
    }

    pub(crate) fn count(&self, i: usize, status: &str) -> u64 {
        self.pool(i)
            .get_conn()
            .unwrap()
            .exec_first("SELECT COUNT(*) FROM t_event_record WHERE status = ?", (status,))
            .unwrap()
            .unwrap_or(0)
    }
}

impl Drop for Shards {
    fn drop(&mut self) {
        if let Ok(mut c) = self.server.get_conn() {
            for i in 0..self.n {
                let _ = c.query_drop(format!("DROP DATABASE IF EXISTS {}", self.name(i)));
            }
        }
    }
}

/// Sends per business key (ids repeat across shards; the keys here do not).
pub(crate) fn sends_by_key(rec: &Recorder) -> HashMap<String, usize> {
    let mut m = HashMap::new();
    for e in rec.sent_events.lock().iter() {
        *m.entry(e.biz_no.clone()).or_insert(0) += 1;
    }
    m
}

fn sent_with_prefix(rec: &Recorder, prefix: &str) -> usize {
    sends_by_key(rec).keys().filter(|k| k.starts_with(prefix)).count()
}

fn running(fleet: &Fleet, name: &str) -> bool {
    fleet
        .shards()
        .iter()
        .any(|v| v.spec.name == name && matches!(v.state, ShardState::Running(_)))
}

#[test]
fn a_fleet_relays_every_shard_of_a_range_once_and_names_each_shard() {
    let shards = Shards::new("fleet_all", 3, &[]);
    for i in 0..3 {
        shards.enqueue(i, &format!("s{i}"), 40);
    }
    let rec = Recorder::new();
    let fleet = Fleet::builder(shards.config(0, 2), rec.clone()).start().unwrap();
    assert!(wait_until(LIMIT, || rec.sent_events.lock().len() >= 120));
    assert!(wait_until(LIMIT, || (0..3).all(|i| shards.count(i, "SUCCESS") == 40)));
    let by_key = sends_by_key(&rec);
    assert_eq!(by_key.len(), 120);
    assert!(by_key.values().all(|&n| n == 1), "a key sent twice: {by_key:?}");
    let names: Vec<String> = fleet.shards().into_iter().map(|v| v.spec.name).collect();
    assert_eq!(names, (0..3).map(|i| shards.name(i)).collect::<Vec<_>>());
    for v in fleet.shards() {
        let relay = v.relay().expect("every shard runs");
        assert_eq!(relay.counters().sent, 40, "shard {}", v.spec.name);
        // Each shard's relay has the shard's own senders and pool.
        assert_eq!(relay.config().workers, 1);
        assert_eq!(relay.config().db_pool_max, 2);
    }
    let reports = fleet.stop(Duration::from_secs(5));
    assert_eq!(reports.len(), 3);
    assert!(
        fleet.stop(Duration::from_secs(1)).is_empty(),
        "a second stop does nothing"
    );
}

#[test]
fn a_shard_that_cannot_be_opened_is_named_while_the_others_relay_and_joins_once_it_can() {
    let shards = Shards::new("fleet_down", 3, &[1]);
    shards.enqueue(0, "a", 20);
    shards.enqueue(2, "c", 20);
    let rec = Recorder::new();
    let fleet = Fleet::builder(shards.config(0, 2), rec.clone()).start().unwrap();
    assert!(wait_until(LIMIT, || sent_with_prefix(&rec, "a-") == 20
        && sent_with_prefix(&rec, "c-") == 20));
    // The missing shard is named, with the database's own words, and tried again.
    let down = shards.name(1);
    assert!(wait_until(LIMIT, || fleet.shards().iter().any(|v| v.spec.name == down
        && matches!(&v.state, ShardState::Starting { attempts, last_error: Some(e), .. }
            if *attempts >= 1 && e.contains(&down)))));
    assert!(fleet.relay(&down).is_none());
    // Created later: it is started on a later attempt and relayed like the others.
    shards.create(1);
    shards.enqueue(1, "b", 20);
    assert!(wait_until(LIMIT, || running(&fleet, &down)));
    assert!(wait_until(LIMIT, || sent_with_prefix(&rec, "b-") == 20));
    assert!(sends_by_key(&rec).values().all(|&n| n == 1));
    fleet.stop(Duration::from_secs(5));
}

#[test]
fn shards_are_added_replaced_and_removed_while_the_others_run_and_a_removal_mid_send_loses_nothing() {
    let shards = Shards::new("fleet_reload", 3, &[]);
    let rec = Recorder::new();
    let fleet = Fleet::builder(shards.config(0, 1), rec.clone()).start().unwrap();
    assert!(wait_until(LIMIT, || running(&fleet, &shards.name(0))
        && running(&fleet, &shards.name(1))));
    // Shard 0 has an event whose send takes a while: it is in flight when the shard is removed.
    // Its id is 1 (the first row of a fresh table; no other shard has a row yet), so the delay is
    // in place before the relay can see it.
    rec.set_faults(vec![Fault::Delay {
        id: 1,
        by: Duration::from_millis(800),
        times: 1,
    }]);
    shards.enqueue(0, "slow", 1);
    let slow_id: u64 = shards
        .pool(0)
        .get_conn()
        .unwrap()
        .query_first("SELECT id FROM t_event_record WHERE biz_no = 'slow-0'")
        .unwrap()
        .unwrap();
    assert_eq!(slow_id, 1);
    fleet.relay(&shards.name(0)).unwrap().notify();
    assert!(wait_until(LIMIT, || fleet
        .relay(&shards.name(0))
        .is_some_and(|r| r.counters().in_flight == 1)));
    // Shard 1 keeps running through the reload; shard 2 comes in with a table of its own.
    outbox::migrate_table(&shards.pool(2), "outbox_b").unwrap();
    let server = server_url();
    let spec = |i: usize, table: &str| ShardSpec {
        name: shards.name(i),
        url: format!("{server}/{}", shards.name(i)),
        table: table.into(),
    };
    let before = fleet.relay(&shards.name(1)).unwrap();
    let change = fleet
        .reload(
            vec![spec(1, "t_event_record"), spec(2, "outbox_b")],
            Duration::from_secs(5),
        )
        .unwrap();
    assert_eq!(change.added, [shards.name(2)]);
    assert_eq!(change.removed, [shards.name(0)]);
    assert!(change.replaced.is_empty());
    assert!(
        Arc::ptr_eq(&before, &fleet.relay(&shards.name(1)).unwrap()),
        "shard 1 left alone"
    );
    // The send in flight at the removal finished and was recorded once.
    assert_eq!(sent_with_prefix(&rec, "slow-"), 1);
    assert_eq!(shards.count(0, "SUCCESS"), 1);
    // Shard 0 is no longer relayed: what it gets now waits for whoever serves it next.
    shards.enqueue(0, "late", 5);
    shards.enqueue(1, "b", 5);
    let pool2 = shards.pool(2);
    {
        let mut conn = pool2.get_conn().unwrap();
        let mut tx = conn.start_transaction(mysql::TxOpts::default()).unwrap();
        let mut cfg = Config::new(format!("{server}/{}", shards.name(2)));
        cfg.table = "outbox_b".into();
        for k in 0..5 {
            outbox::enqueue_in_tx_with(&mut tx, &cfg, &NewEvent::new(format!("c-{k}"), "T", "{}")).unwrap();
        }
        tx.commit().unwrap();
    }
    assert!(wait_until(LIMIT, || sent_with_prefix(&rec, "b-") == 5
        && sent_with_prefix(&rec, "c-") == 5));
    assert_eq!(sent_with_prefix(&rec, "late-"), 0);
    assert_eq!(shards.count(0, "WAIT"), 5);
    // A shard whose table changes is replaced: stopped, then started on the new one.
    outbox::migrate_table(&shards.pool(1), "outbox_b1").unwrap();
    let change = fleet
        .reload(vec![spec(1, "outbox_b1"), spec(2, "outbox_b")], Duration::from_secs(5))
        .unwrap();
    assert_eq!(change.replaced, [shards.name(1)]);
    assert!(wait_until(LIMIT, || fleet
        .relay(&shards.name(1))
        .is_some_and(|r| r.config().table == "outbox_b1")));
    // Adding a shard the fleet already serves is refused by name.
    let e = fleet.add(spec(2, "outbox_b")).unwrap_err().to_string();
    assert!(e.contains(&shards.name(2)) && e.contains("already served"), "{e}");
    assert!(sends_by_key(&rec).values().all(|&n| n == 1));
    fleet.stop(Duration::from_secs(5));
}

/// Sends of keys starting `hot-` take 20 ms a call, as a slow shard's would; others go at once.
struct SlowForHot(Arc<Recorder>);

impl Publisher for SlowForHot {
    fn publish(&self, events: &[OutboundEvent], timeout: Duration) -> Vec<SendOutcome> {
        if events.iter().any(|e| e.biz_no.starts_with("hot-")) {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.0.publish(events, timeout)
    }
}

#[test]
fn a_backlog_on_one_shard_does_not_hold_up_the_fresh_events_of_another() {
    let shards = Shards::new("fleet_fair", 2, &[]);
    shards.enqueue(0, "hot", 20_000);
    let rec = Recorder::new();
    let fleet = Fleet::builder(shards.config(0, 1), Arc::new(SlowForHot(rec.clone())))
        .start()
        .unwrap();
    assert!(wait_until(LIMIT, || sent_with_prefix(&rec, "hot-") > 0));
    shards.enqueue(1, "cold", 1);
    fleet.relay(&shards.name(1)).unwrap().notify();
    assert!(wait_until(LIMIT, || sent_with_prefix(&rec, "cold-") == 1));
    let hot_left = shards.count(0, "WAIT") + shards.count(0, "SENDING");
    assert!(
        hot_left > 0,
        "the cold shard's event went out only after the hot shard's whole backlog"
    );
    fleet.stop(Duration::from_secs(5));
}

#[test]
fn a_fleet_without_shards_or_with_a_bad_list_is_refused_naming_the_key() {
    let rec = Recorder::new();
    let e = Fleet::builder(Config::new(format!("{}/x", server_url())), rec.clone())
        .start()
        .unwrap_err()
        .to_string();
    assert!(e.contains("shards"), "{e}");
    let mut c = Config::default();
    let e = c
        .set("shards", "mysql://root:hunter2@h/o_{9..1}")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("shards") && e.contains("runs backwards") && !e.contains("hunter2"),
        "{e}"
    );
    c.shards = Some("mysql://root@h/a mysql://root@h/a".into());
    let e = Fleet::builder(c, rec).start().unwrap_err().to_string();
    assert!(e.contains("twice"), "{e}");
}

#[test]
fn a_relay_given_shards_refuses_to_start_and_points_to_the_fleet() {
    let db = crate::support::TestDb::new("fleet_one");
    let mut c = db.config();
    c.set("shards", &format!("{}/x_{{0..3}}", server_url())).unwrap();
    let e = outbox::Relay::start(c, Recorder::new()).unwrap_err().to_string();
    assert!(
        e.contains("shards") && e.contains("fleet") && e.contains("db.url"),
        "{e}"
    );
}

#[test]
fn the_watch_wakes_shards_whose_rows_are_due_and_a_server_it_cannot_read_is_named() {
    let shards = Shards::new("fleet_watch", 3, &[]);
    // The shards' own scans are a minute apart: only the watch gets fresh events out sooner.
    let mut cfg = shards.config(0, 2);
    cfg.shard_watch = Duration::from_millis(50);
    cfg.shard_scan_interval = Duration::from_secs(60);
    let rec = Recorder::new();
    let fleet = Fleet::builder(cfg, rec.clone()).start().unwrap();
    assert!(wait_until(LIMIT, || (0..3).all(|i| running(&fleet, &shards.name(i)))));
    for v in fleet.shards() {
        assert_eq!(v.relay().unwrap().config().scan_interval, Duration::from_secs(60));
    }
    for i in 0..3 {
        shards.enqueue(i, &format!("w{i}"), 10);
    }
    assert!(
        wait_until(Duration::from_secs(20), || sends_by_key(&rec).len() == 30),
        "the watch did not wake the shards: {} of 30 sent",
        sends_by_key(&rec).len()
    );
    assert!(fleet.watch_problems().is_empty());
    // A shard's table gone: the server's statement fails, and the watch says so by server.
    shards
        .pool(1)
        .get_conn()
        .unwrap()
        .query_drop("DROP TABLE t_event_record")
        .unwrap();
    assert!(wait_until(LIMIT, || fleet.watch_problems().iter().any(
        |(server, why)| server == "127.0.0.1:3306" && why.contains("t_event_record")
    )));
    assert!(sends_by_key(&rec).values().all(|&n| n == 1));
    fleet.stop(Duration::from_secs(5));
}

/// One shard behind a proxy that stalls, then drops, its connections: the watch still wakes the
/// other shard within its period (each server is read by a thread of its own), and the dropped
/// shard's server is named by the watch.
#[test]
fn a_shard_whose_connections_stall_or_drop_holds_up_no_other_shard_s_wake_ups() {
    use crate::proxy::{Mode, Proxy};
    let shards = Shards::new("fleet_proxy", 2, &[]);
    let proxy = Proxy::start("127.0.0.1:3306");
    let mut cfg = shards.config(0, 1);
    cfg.shards = Some(format!(
        "{} {}/{}",
        proxy.url(&shards.name(0)),
        server_url(),
        shards.name(1)
    ));
    cfg.shard_watch = Duration::from_millis(100);
    // Only the watch gets fresh events out within the test's limits.
    cfg.shard_scan_interval = Duration::from_secs(60);
    let rec = Recorder::new();
    let fleet = Fleet::builder(cfg, rec.clone()).start().unwrap();
    assert!(wait_until(LIMIT, || running(&fleet, &shards.name(0))
        && running(&fleet, &shards.name(1))));
    // Shard 0 stalls: its watch statement hangs (up to the 30 s read timeout); shard 1's events
    // are woken all the same, well within the scan interval of a minute.
    proxy.set(Mode::Stall);
    // Not a synchronisation: three watch periods, so that shard 0's server's read is the one
    // stalled when the events come (the test passes without it, but proves less).
    std::thread::sleep(Duration::from_millis(300));
    shards.enqueue(1, "b", 10);
    assert!(
        wait_until(Duration::from_secs(15), || sent_with_prefix(&rec, "b-") == 10),
        "shard 1 waited on shard 0's stalled server: {} of 10 sent",
        sent_with_prefix(&rec, "b-")
    );
    // Dropped: the watch names the proxy's server, and shard 1 goes on.
    proxy.set(Mode::Drop);
    let shown = format!("127.0.0.1:{}", proxy.port);
    assert!(wait_until(LIMIT, || fleet
        .watch_problems()
        .iter()
        .any(|(server, _)| *server == shown)));
    shards.enqueue(1, "c", 10);
    assert!(wait_until(Duration::from_secs(15), || sent_with_prefix(&rec, "c-") == 10));
    // Back: shard 0's events go out too.
    proxy.set(Mode::Pass);
    shards.enqueue(0, "a", 10);
    assert!(wait_until(Duration::from_secs(90), || sent_with_prefix(&rec, "a-") == 10));
    assert!(sends_by_key(&rec).values().all(|&n| n == 1));
    fleet.stop(Duration::from_secs(5));
}
