//! Several relays over one fleet (`shard.coordination.url`): the shards split between them, each
//! event sent once, a relay that stops handing its shards over at once, a relay that died
//! (its heartbeat and holds left to run out) taken over after its lease and not before, and a
//! coordination database that cannot be reached named while nothing is taken over. Real MariaDB
//! databases for the shards and the coordination; recording publishers.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use mysql::prelude::Queryable;

use crate::fleet::{sends_by_key, Shards};
use crate::support::{server_url, wait_until, Recorder, TestDb};
use outbox::{Config, Fleet, ShardState};

const LIMIT: Duration = Duration::from_secs(30);

/// The fleet's configuration over shards `0..=to`, split through `coord` as `instance`.
fn config(shards: &Shards, to: usize, coord: &TestDb, instance: &str) -> Config {
    let mut c = shards.config(0, to);
    c.shard_coordination_url = Some(coord.url.clone());
    c.shard_lease = Duration::from_millis(1500);
    c.instance_id = Some(instance.into());
    c
}

/// The shards this relay serves (by name).
fn here(fleet: &Fleet) -> BTreeSet<String> {
    fleet
        .shards()
        .into_iter()
        .filter(|v| matches!(v.state, ShardState::Running(_)))
        .map(|v| v.spec.name)
        .collect()
}

fn all_sent_once(recs: &[&Recorder], total: usize) -> bool {
    let mut by_key: HashMap<String, usize> = HashMap::new();
    for r in recs {
        for (k, n) in sends_by_key(r) {
            *by_key.entry(k).or_insert(0) += n;
        }
    }
    by_key.len() == total && by_key.values().all(|&n| n == 1)
}

#[test]
fn two_relays_split_the_shards_send_each_event_once_and_a_stopping_relay_hands_its_shards_over() {
    let shards = Shards::new("share_split", 6, &[]);
    let coord = TestDb::empty("share_split_c");
    for i in 0..6 {
        shards.enqueue(i, &format!("s{i}"), 20);
    }
    let (ra, rb) = (Recorder::new(), Recorder::new());
    let a = Fleet::builder(config(&shards, 5, &coord, "relay-a"), ra.clone())
        .start()
        .unwrap();
    let b = Fleet::builder(config(&shards, 5, &coord, "relay-b"), rb.clone())
        .start()
        .unwrap();
    // Each holds three, none holds what the other holds, and every shard is served.
    assert!(
        wait_until(LIMIT, || here(&a).len() == 3
            && here(&b).len() == 3
            && here(&a).is_disjoint(&here(&b))),
        "not split: a {:?}, b {:?}",
        here(&a),
        here(&b)
    );
    assert!(wait_until(LIMIT, || (0..6).all(|i| shards.count(i, "SUCCESS") == 20)));
    assert!(all_sent_once(&[&ra, &rb], 120));
    // As of a's last tick, which may predate b's claims by a tick: waited for, not sampled.
    let settled = || {
        let c = a.coordination().unwrap();
        (c.instance.as_str(), c.members, c.unowned, c.problem.is_none()) == ("relay-a", Some(2), Some(0), true)
            // The other's shards are named with their holder.
            && a.shards().iter().filter(|v| !v.is_here()).all(|v| {
                matches!(&v.state, ShardState::Elsewhere { owner: Some(o) } if o == "relay-b")
            })
    };
    assert!(
        wait_until(LIMIT, settled),
        "{:?} {:?}",
        a.coordination(),
        a.shards().iter().map(|v| v.state.clone()).collect::<Vec<_>>()
    );
    let held: BTreeSet<String> = coord
        .conn()
        .query("SELECT owner FROM outbox_fleet_shard")
        .unwrap()
        .into_iter()
        .collect();
    assert_eq!(held, BTreeSet::from(["relay-a".to_string(), "relay-b".to_string()]));

    // a stops: its holds are given up at once, and b serves all six long before a lease would
    // have run out.
    a.stop(Duration::from_secs(5));
    assert!(wait_until(LIMIT, || here(&b).len() == 6), "b serves {:?}", here(&b));
    for i in 0..6 {
        shards.enqueue(i, &format!("t{i}"), 5);
    }
    assert!(wait_until(LIMIT, || (0..6).all(|i| shards.count(i, "SUCCESS") == 25)));
    assert!(all_sent_once(&[&ra, &rb], 150));
    assert_eq!(b.coordination().unwrap().members, Some(1));
    b.stop(Duration::from_secs(5));
    let left: u64 = coord
        .conn()
        .query_first("SELECT COUNT(*) FROM outbox_fleet_shard WHERE owner <> ''")
        .unwrap()
        .unwrap();
    assert_eq!(left, 0, "a stopped relay holds nothing");
}

#[test]
fn a_relay_that_died_has_its_shards_taken_over_when_its_holds_run_out_and_not_before() {
    let shards = Shards::new("share_dead", 4, &[]);
    let coord = TestDb::empty("share_dead_c");
    let (ra, rb) = (Recorder::new(), Recorder::new());
    let cfg = config(&shards, 3, &coord, "relay-a");
    // relay-a serves alone, then dies: its heartbeat and holds stay as they were, to run out.
    let a = Fleet::builder(cfg.clone(), ra.clone()).start().unwrap();
    assert!(wait_until(LIMIT, || here(&a).len() == 4));
    a.stop(Duration::from_secs(5));
    // What its last tick would have left: the holds renewed for a lease from now.
    let mut conn = coord.conn();
    conn.query_drop("UPDATE outbox_fleet_shard SET owner = 'relay-a', lease_until = NOW(3) + INTERVAL 3 SECOND")
        .unwrap();
    let view: String = conn
        .query_first("SELECT view FROM outbox_fleet_member LIMIT 1")
        .unwrap()
        .unwrap_or_default();
    assert!(view.is_empty(), "a stopped relay leaves no heartbeat");
    let started = std::time::Instant::now();
    let b = Fleet::builder(config(&shards, 3, &coord, "relay-b"), rb.clone())
        .start()
        .unwrap();
    for i in 0..4 {
        shards.enqueue(i, &format!("s{i}"), 10);
    }
    // While the dead relay's holds run, b serves none of its shards.
    assert!(wait_until(LIMIT, || b.coordination().unwrap().members.is_some()));
    if started.elapsed() < Duration::from_secs(2) {
        assert!(
            here(&b).is_empty(),
            "b took over before the holds ran out: {:?}",
            here(&b)
        );
        assert_eq!(b.coordination().unwrap().unowned, Some(0));
    }
    assert!(wait_until(LIMIT, || here(&b).len() == 4));
    assert!(
        started.elapsed() >= Duration::from_millis(2500),
        "taken over after {:?}",
        started.elapsed()
    );
    assert!(wait_until(LIMIT, || (0..4).all(|i| shards.count(i, "SUCCESS") == 10)));
    assert!(all_sent_once(&[&ra, &rb], 40));
    let takes: u64 = conn
        .query_first("SELECT SUM(takes) FROM outbox_fleet_shard")
        .unwrap()
        .unwrap();
    assert_eq!(takes, 8, "4 shards taken by a, then 4 by b");
    b.stop(Duration::from_secs(5));
}

#[test]
fn a_coordination_database_that_cannot_be_reached_is_named_and_nothing_is_served_until_it_can() {
    let shards = Shards::new("share_down", 2, &[]);
    shards.enqueue(0, "s0", 5);
    let name = format!("outbox_t_share_coord_{:08x}", rand::random::<u32>());
    let mut cfg = shards.config(0, 1);
    cfg.shard_coordination_url = Some(format!("{}/{name}", server_url()));
    cfg.shard_lease = Duration::from_millis(1500);
    let rec = Recorder::new();
    let fleet = Fleet::builder(cfg, rec.clone()).start().unwrap();
    assert!(wait_until(LIMIT, || fleet
        .coordination()
        .unwrap()
        .problem
        .is_some_and(|p| p.contains(&name) && p.contains("coordination"))));
    assert!(here(&fleet).is_empty());
    assert_eq!(rec.total_sent(), 0);
    // The database appears: the relay, alone, takes every shard.
    let server = mysql::Pool::new(mysql::Opts::from_url(&server_url()).unwrap()).unwrap();
    server
        .get_conn()
        .unwrap()
        .query_drop(format!("CREATE DATABASE {name}"))
        .unwrap();
    assert!(wait_until(LIMIT, || here(&fleet).len() == 2));
    assert!(fleet.coordination().unwrap().problem.is_none());
    assert!(wait_until(LIMIT, || shards.count(0, "SUCCESS") == 5));
    fleet.stop(Duration::from_secs(5));
    server
        .get_conn()
        .unwrap()
        .query_drop(format!("DROP DATABASE {name}"))
        .unwrap();
}

#[test]
fn a_coordination_url_without_shards_is_refused_naming_the_key() {
    let mut c = Config::new(format!("{}/x", server_url()));
    c.set("shard.coordination.url", "mysql://root:hunter2@h/coord").unwrap();
    let e = c.validate().unwrap_err().to_string();
    assert!(
        e.contains("shard.coordination.url") && e.contains("without shards") && !e.contains("hunter2"),
        "{e}"
    );
}
