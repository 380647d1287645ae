//! A fleet whose shards come from a catalog table (`shard.catalog.url`, `shard.catalog.query`):
//! its rows and `shards` served together, a row added or deleted followed at the next read, and
//! a catalog that lists a bad entry or cannot be read reported while the shards stay as they are.
//! Real MariaDB databases; a recording publisher.

use std::time::Duration;

use mysql::prelude::Queryable;

use crate::fleet::{sends_by_key, Shards};
use crate::support::{server_url, wait_until, Recorder, TestDb};
use outbox::{Config, Fleet};

const LIMIT: Duration = Duration::from_secs(30);

fn served(fleet: &Fleet) -> Vec<String> {
    let mut names: Vec<String> = fleet.shards().into_iter().map(|v| v.spec.name).collect();
    names.sort();
    names
}

#[test]
fn the_catalog_s_rows_and_shards_are_served_together_and_followed_as_rows_come_and_go() {
    let shards = Shards::new("catalog", 4, &[]);
    outbox::migrate_table(&shards.pool(2), "outbox_c").unwrap();
    let catalog = TestDb::empty("catalog_c");
    let server = server_url();
    let mut conn = catalog.conn();
    conn.query_drop("CREATE TABLE tenants (url VARCHAR(255) NOT NULL, tbl VARCHAR(64) NULL, active TINYINT NOT NULL)")
        .unwrap();
    conn.exec_drop(
        "INSERT INTO tenants VALUES (?, NULL, 1), (?, 'outbox_c', 1), (?, NULL, 0)",
        (
            format!("{server}/{}", shards.name(1)),
            format!("{server}/{}", shards.name(2)),
            format!("{server}/{}", shards.name(3)),
        ),
    )
    .unwrap();
    let mut cfg = shards.config(0, 0);
    cfg.shard_catalog_url = Some(catalog.url.clone());
    cfg.shard_catalog_query = "SELECT url, tbl FROM tenants WHERE active = 1".into();
    cfg.shard_catalog_reload = Duration::from_millis(1000);
    let rec = Recorder::new();
    let fleet = Fleet::builder(cfg, rec.clone()).start().unwrap();
    assert_eq!(served(&fleet), [shards.name(0), shards.name(1), shards.name(2)]);
    let table_of = |i: usize| {
        fleet
            .shards()
            .into_iter()
            .find(|v| v.spec.name == shards.name(i))
            .map(|v| v.spec.table)
    };
    assert_eq!(table_of(2).as_deref(), Some("outbox_c"));
    shards.enqueue(1, "b", 10);
    assert!(wait_until(LIMIT, || shards.count(1, "SUCCESS") == 10));

    // A tenant switched on is served at the next read; one switched off is stopped.
    conn.query_drop("UPDATE tenants SET active = 1 - active").unwrap();
    assert!(
        wait_until(LIMIT, || served(&fleet) == [shards.name(0), shards.name(3)]),
        "{:?}",
        served(&fleet)
    );
    shards.enqueue(3, "d", 10);
    assert!(wait_until(LIMIT, || shards.count(3, "SUCCESS") == 10));
    assert!(fleet.catalog_problem().is_none());

    // A bad row: reported by key, and the shards stay as they were.
    conn.query_drop("INSERT INTO tenants VALUES ('http://nowhere/x', NULL, 1)")
        .unwrap();
    assert!(wait_until(LIMIT, || fleet.catalog_problem().is_some_and(|p| p
        .contains("shard.catalog.query")
        && p.contains("http://nowhere/x"))));
    assert_eq!(served(&fleet), [shards.name(0), shards.name(3)]);
    // The catalog gone: reported, the shards still served.
    conn.query_drop("DROP TABLE tenants").unwrap();
    assert!(wait_until(LIMIT, || fleet
        .catalog_problem()
        .is_some_and(|p| p.contains("tenants"))));
    shards.enqueue(0, "a", 10);
    assert!(wait_until(LIMIT, || shards.count(0, "SUCCESS") == 10));
    assert!(sends_by_key(&rec).values().all(|&n| n == 1));
    fleet.stop(Duration::from_secs(5));
}

#[test]
fn a_catalog_with_a_bad_row_is_refused_at_start_and_a_relay_given_a_catalog_points_to_the_fleet() {
    let catalog = TestDb::empty("catalog_bad");
    catalog
        .conn()
        .query_drop("CREATE TABLE outbox_shards (url VARCHAR(255)); INSERT INTO outbox_shards VALUES ('mysql://u:pw7@h/o_{3..1}')")
        .unwrap();
    let mut cfg = Config::default();
    cfg.set("shard.catalog.url", &catalog.url).unwrap();
    let e = Fleet::builder(cfg, Recorder::new()).start().unwrap_err().to_string();
    assert!(
        e.contains("shard.catalog.query") && e.contains("runs backwards") && !e.contains("pw7"),
        "{e}"
    );
    let db = TestDb::new("catalog_relay");
    let mut c = db.config();
    c.set("shard.catalog.url", &catalog.url).unwrap();
    let e = outbox::Relay::start(c, Recorder::new()).unwrap_err().to_string();
    assert!(e.contains("shard.catalog.url") && e.contains("fleet"), "{e}");
}

#[test]
fn an_empty_catalog_starts_a_fleet_of_no_shard_that_takes_the_first_row_when_it_comes() {
    let shards = Shards::new("catalog_empty", 1, &[]);
    let catalog = TestDb::empty("catalog_empty_c");
    catalog
        .conn()
        .query_drop("CREATE TABLE outbox_shards (url VARCHAR(255))")
        .unwrap();
    let mut cfg = Config::default();
    cfg.set("shard.catalog.url", &catalog.url).unwrap();
    cfg.set("shard.catalog.reload.ms", "1000").unwrap();
    cfg.sent_rows = outbox::SentRows::Keep;
    let rec = Recorder::new();
    let fleet = Fleet::builder(cfg, rec.clone()).start().unwrap();
    assert!(fleet.shards().is_empty());
    assert!(fleet.catalog_problem().is_none());
    catalog
        .conn()
        .exec_drop(
            "INSERT INTO outbox_shards VALUES (?)",
            (format!("{}/{}", server_url(), shards.name(0)),),
        )
        .unwrap();
    shards.enqueue(0, "a", 5);
    assert!(wait_until(LIMIT, || shards.count(0, "SUCCESS") == 5));
    assert!(fleet.catalog_problem().is_none());
    fleet.stop(Duration::from_secs(5));
}
