//! Migrations, the table name, and the scan/reclaim plans.

use mysql::prelude::Queryable;
use mysql::Row;
use std::time::Duration;

use crate::support::TestDb;
use outbox::store::Store;

#[test]
fn migrations_are_recorded_and_idempotent() {
    let db = TestDb::new("mig");
    let again = outbox::migrate(&db.pool).unwrap();
    assert!(again.applied.is_empty(), "second run applied {:?}", again.applied);
    let versions: Vec<u32> = db
        .conn()
        .query("SELECT version FROM outbox_schema_history WHERE table_name = 't_event_record' ORDER BY version")
        .unwrap();
    let all: Vec<u32> = outbox::migrate::MIGRATIONS.iter().map(|m| m.version).collect();
    assert_eq!(versions, all);
    // The ordered claim's head and run reads need status and id in the biz_no index (V6).
    let cols: Vec<String> = db
        .conn()
        .query(
            "SELECT COLUMN_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() \
             AND TABLE_NAME = 't_event_record' AND INDEX_NAME = 'idx_biz_no' ORDER BY SEQ_IN_INDEX",
        )
        .unwrap();
    assert_eq!(cols, vec!["biz_no".to_string(), "status".into(), "id".into()]);
}

#[test]
fn a_seed_era_table_is_upgraded_in_place() {
    let db = TestDb::new("seedtbl");
    let mut c = db.conn();
    // A table as the seed's users have it (second-precision times, no fencing columns).
    c.query_drop(
        "CREATE TABLE legacy_events (id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY, biz_no VARCHAR(64) NOT NULL,
         event_type VARCHAR(64) NOT NULL, payload MEDIUMBLOB NOT NULL, status VARCHAR(16) NOT NULL DEFAULT 'WAIT',
         retry_count INT UNSIGNED NOT NULL DEFAULT 0, next_retry_time DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP,
         claim_owner VARCHAR(128) NULL, claimed_at DATETIME NULL, create_time DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP,
         update_time DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP,
         KEY idx_status_next_retry (status, next_retry_time), KEY idx_status_claimed_at (status, claimed_at))",
    )
    .unwrap();
    c.query_drop("INSERT INTO legacy_events (biz_no, event_type, payload) VALUES ('ORD-1', 'ORDER_CREATED', 'x')")
        .unwrap();
    let r = outbox::migrate_table(&db.pool, "legacy_events").unwrap();
    let all: Vec<u32> = outbox::migrate::MIGRATIONS.iter().map(|m| m.version).collect();
    assert_eq!(r.applied, all);
    let (token, precision): (Option<u64>, u32) = c
        .query_first(
            "SELECT claim_token, (SELECT DATETIME_PRECISION FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE()
             AND TABLE_NAME = 'legacy_events' AND COLUMN_NAME = 'next_retry_time') FROM legacy_events",
        )
        .unwrap()
        .unwrap();
    assert_eq!(token, None);
    assert_eq!(precision, 3);
}

/// The seed's own DDL: signed ids and retry counts, TEXT payloads, a 64-character claim_owner,
/// second-precision times, the seed's two indexes.
pub(crate) fn create_seed_table(c: &mut mysql::PooledConn, name: &str) {
    c.query_drop(format!(
        "CREATE TABLE {name} (
           id              BIGINT       NOT NULL AUTO_INCREMENT,
           biz_no          VARCHAR(64)  NOT NULL,
           event_type      VARCHAR(64)  NOT NULL,
           payload         TEXT         NOT NULL,
           status          VARCHAR(16)  NOT NULL DEFAULT 'WAIT',
           retry_count     INT          NOT NULL DEFAULT 0,
           next_retry_time DATETIME     NOT NULL DEFAULT CURRENT_TIMESTAMP,
           claim_owner     VARCHAR(64)  NULL,
           claimed_at      DATETIME     NULL,
           create_time     DATETIME     NOT NULL DEFAULT CURRENT_TIMESTAMP,
           update_time     DATETIME     NOT NULL DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP,
           PRIMARY KEY (id),
           KEY idx_status_next_retry (status, next_retry_time),
           KEY idx_status_claimed_at (status, claimed_at)
         ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4"
    ))
    .unwrap();
}

/// `(column, COLUMN_TYPE, IS_NULLABLE, COLUMN_DEFAULT)` of every column of `table`, by name.
fn shape(c: &mut mysql::PooledConn, table: &str) -> Vec<(String, String, String, Option<String>)> {
    c.exec(
        "SELECT COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, COLUMN_DEFAULT FROM information_schema.COLUMNS \
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? ORDER BY COLUMN_NAME",
        (table,),
    )
    .unwrap()
}

#[test]
fn a_table_created_by_the_seed_ddl_is_migrated_to_the_shape_of_a_fresh_one() {
    let db = TestDb::new("seedddl");
    let mut c = db.conn();
    create_seed_table(&mut c, "seed_events");
    let mut cfg = db.config();
    cfg.table = "seed_events".into();
    let insert = |payload: Vec<u8>| -> outbox::Result<u64> {
        let mut conn = db.conn();
        let mut tx = conn.start_transaction(mysql::TxOpts::default()).unwrap();
        let id = outbox::enqueue_in_tx_with(&mut tx, &cfg, &outbox::NewEvent::new("ORD-1", "ORDER_CREATED", payload))?;
        tx.commit().unwrap();
        Ok(id)
    };
    // Before: what the seed's columns refuse.
    let raw = |payload: Vec<u8>| -> Option<u16> {
        match db.conn().exec_drop(
            "INSERT INTO seed_events (biz_no, event_type, payload) VALUES ('ORD-1', 'ORDER_CREATED', ?)",
            (payload,),
        ) {
            Ok(()) => None,
            Err(mysql::Error::MySqlError(me)) => Some(me.code),
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(
        raw(vec![0xff, 0xfe, 0x00, 0x80]),
        Some(1366),
        "binary payload into TEXT"
    );
    assert_eq!(raw(vec![b'x'; 100 * 1024]), Some(1406), "100 KiB payload into TEXT");
    c.query_drop("INSERT INTO seed_events (biz_no, event_type, payload) VALUES ('ORD-0', 'ORDER_CREATED', '{}')")
        .unwrap();

    let r = outbox::migrate_table(&db.pool, "seed_events").unwrap();
    let all: Vec<u32> = outbox::migrate::MIGRATIONS.iter().map(|m| m.version).collect();
    assert_eq!(r.applied, all);
    assert!(outbox::migrate_table(&db.pool, "seed_events")
        .unwrap()
        .applied
        .is_empty());
    // Every column has the type, nullability and default of the table the migrations create.
    let fresh = shape(&mut c, "t_event_record");
    let migrated = shape(&mut c, "seed_events");
    assert_eq!(migrated, fresh);
    for (col, ty) in [
        ("id", "bigint(20) unsigned"),
        ("payload", "mediumblob"),
        ("claim_owner", "varchar(128)"),
        ("retry_count", "int(10) unsigned"),
        ("next_retry_time", "datetime(3)"),
    ] {
        assert!(
            fresh.iter().any(|(c, t, _, _)| c == col && t == ty),
            "{col} {ty}: {fresh:?}"
        );
    }
    // The row from before is still there; binary and 100 KiB payloads now fit.
    let old: Option<String> = c
        .query_first("SELECT biz_no FROM seed_events WHERE biz_no = 'ORD-0'")
        .unwrap();
    assert_eq!(old.as_deref(), Some("ORD-0"));
    insert(vec![0xff, 0xfe, 0x00, 0x80]).unwrap();
    insert(vec![b'x'; 100 * 1024]).unwrap();
    // The fresh table was not changed by V7 (every definition already matched).
    assert_eq!(shape(&mut c, "t_event_record"), fresh);
}

#[test]
fn a_relay_refuses_a_table_whose_columns_cannot_hold_what_it_writes_naming_the_column_and_the_fix() {
    let db = TestDb::new("shapechk");
    let mut c = db.conn();
    create_seed_table(&mut c, "seed_events");
    // Not migrated: the relay checks the columns before any statement that would use them.
    let mut cfg = db.config();
    cfg.table = "seed_events".into();
    let e = outbox::Relay::start(cfg.clone(), crate::support::Recorder::new())
        .map(|_| ())
        .unwrap_err();
    let msg = e.to_string();
    for needle in [
        "seed_events",
        "payload",
        "TEXT",
        "1366",
        "MEDIUMBLOB",
        "4194304",
        "migrat",
    ] {
        assert!(msg.contains(needle), "{needle:?} missing: {msg}");
    }
    assert!(!e.is_retriable(), "{msg}");
    // Payload fixed, claim_owner still 64: an instance id of 65 characters cannot be stored.
    c.query_drop("ALTER TABLE seed_events MODIFY payload MEDIUMBLOB NOT NULL")
        .unwrap();
    cfg.instance_id = Some(format!("order-{}", "x".repeat(60)));
    let e = outbox::Relay::start(cfg.clone(), crate::support::Recorder::new())
        .map(|_| ())
        .unwrap_err();
    let msg = e.to_string();
    for needle in ["claim_owner", "VARCHAR(64)", "VARCHAR(66)", "outboxd migrate"] {
        assert!(msg.contains(needle), "{needle:?} missing: {msg}");
    }
    // After the migrations, the same relay starts.
    outbox::migrate_table(&db.pool, "seed_events").unwrap();
    outbox::Relay::start(cfg, crate::support::Recorder::new())
        .unwrap()
        .stop(Duration::from_secs(5));
}

#[test]
fn the_migration_plan_lists_pending_migrations_with_statements_and_lock_cost_and_changes_nothing() {
    let db = TestDb::new("plan");
    let mut c = db.conn();
    create_seed_table(&mut c, "seed_events");
    let before = shape(&mut c, "seed_events");
    let plan = outbox::migrate::plan(&db.pool, "seed_events").unwrap();
    let versions: Vec<u32> = plan.iter().map(|p| p.version).collect();
    let all: Vec<u32> = outbox::migrate::MIGRATIONS.iter().map(|m| m.version).collect();
    assert_eq!(versions, all);
    for p in &plan {
        assert!(!p.statements.is_empty() && !p.lock_cost.is_empty(), "{p:?}");
        assert!(
            p.statements
                .iter()
                .all(|s| !s.contains("t_event_record") || p.version == 4),
            "statements name the planned table: {p:?}"
        );
    }
    assert!(plan[1].statements[0].contains("ALGORITHM = INSTANT"), "{:?}", plan[1]);
    assert_eq!(shape(&mut c, "seed_events"), before, "a plan changes nothing");
    let recorded: Option<u64> = c
        .query_first("SELECT COUNT(*) FROM outbox_schema_history WHERE table_name = 'seed_events'")
        .unwrap();
    assert_eq!(recorded, Some(0));
    // A migrated table has nothing pending.
    assert!(outbox::migrate::plan(&db.pool, "t_event_record").unwrap().is_empty());
}

#[test]
fn table_name_with_sql_in_it_is_refused_everywhere() {
    let db = TestDb::new("badtbl");
    let err = outbox::migrate_table(&db.pool, "t_event_record; DROP TABLE x")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("t_event_record; DROP TABLE x") && err.contains("table"),
        "{err}"
    );
    let mut c = db.config();
    let err = c.set("table", "x`y").unwrap_err().to_string();
    assert!(err.contains("x`y"), "{err}");
}

fn explain(db: &TestDb, sql: &str) -> Vec<(String, Option<String>, String)> {
    // (type, key, Extra) of each row of the plan
    let rows: Vec<Row> = db.conn().query(format!("EXPLAIN {sql}")).unwrap();
    rows.into_iter()
        .map(|r| {
            let t: Option<String> = r.get("type").unwrap();
            let k: Option<String> = r.get("key").unwrap();
            let e: Option<String> = r.get("Extra").unwrap();
            (t.unwrap_or_default(), k, e.unwrap_or_default())
        })
        .collect()
}

#[test]
fn scan_and_reclaim_are_index_range_scans_on_a_large_table() {
    let db = TestDb::new("explain");
    let mut c = db.conn();
    c.query_drop(
        "INSERT INTO t_event_record (biz_no, event_type, payload, status, sent_at)
         SELECT CONCAT('ORD-', seq), 'ORDER_CREATED', 'x', 'SUCCESS', NOW(3) FROM seq_1_to_100000",
    )
    .unwrap();
    c.query_drop(
        "INSERT INTO t_event_record (biz_no, event_type, payload) SELECT CONCAT('NEW-', seq), 'ORDER_CREATED', 'x' FROM seq_1_to_50",
    )
    .unwrap();
    c.query_drop("ANALYZE TABLE t_event_record").unwrap();
    let store = Store::new(db.pool.clone(), &db.config(), "explain-1-abcdef".into());
    let mut ordered_cfg = db.config();
    ordered_cfg.ordering = outbox::config::Ordering::PerBizNo;
    let ordered = Store::new(db.pool.clone(), &ordered_cfg, "explain-2-abcdef".into());
    // A drain's next round starts after the last row of the previous one.
    let position = store
        .claim_skip_locked(1)
        .unwrap()
        .last
        .expect("a claimed row has a position");
    for (sql, index) in [
        (store.scan_sql(100, true), "idx_status_next_retry"),
        (
            store.scan_sql_after(100, true, Some(&position)),
            "idx_status_next_retry",
        ),
        (store.scan_sql(20, false), "idx_status_next_retry"),
        (store.reclaim_sql(500), "idx_status_next_retry"),
        (ordered.scan_sql(100, true), "idx_status_next_retry"),
    ] {
        let plan = explain(&db, &sql);
        assert_eq!(plan.len(), 1, "{sql}\n{plan:?}");
        let (ty, key, extra) = &plan[0];
        assert!(
            ty == "range" || ty == "ref",
            "{sql}\nplan type {ty} (expected range/ref)"
        );
        assert_eq!(key.as_deref(), Some(index), "{sql}");
        assert!(
            !extra.contains("filesort"),
            "{sql}\nfilesort means every matching row gets locked: {extra}"
        );
    }
    // The ordered claim's reads: the heads of the candidate keys as a loose index scan, the runs
    // as ranges of idx_biz_no.
    let (head, run) = ordered.ordered_sql(&["NEW-1", "NEW-2", "ORD-7"], &[("NEW-1", 1, 100_100), ("NEW-2", 2, 9)]);
    let plan = explain(&db, &head);
    assert_eq!(plan[0].1.as_deref(), Some("idx_biz_no"), "{head}\n{plan:?}");
    // A loose index scan where keys have many rows (the optimizer's choice; with one row per key a
    // plain range is as cheap), never a read of the table.
    assert!(plan[0].2.contains("Using index"), "{head}\n{plan:?}");
    assert!(plan[0].0 == "range", "{head}\n{plan:?}");
    let plan = explain(&db, &run);
    assert_eq!(
        (plan[0].0.as_str(), plan[0].1.as_deref()),
        ("range", Some("idx_biz_no")),
        "{run}\n{plan:?}"
    );
    // Rows examined by the scan stay at the batch, not the table: the handler reads ~batch rows.
    c.query_drop("FLUSH STATUS").unwrap();
    let _: Vec<Row> = c.query(store.scan_sql(20, false)).unwrap();
    let reads: Vec<(String, u64)> = c
        .query("SHOW SESSION STATUS WHERE Variable_name IN ('Handler_read_next', 'Handler_read_key', 'Handler_read_rnd_next')")
        .unwrap();
    let total: u64 = reads.iter().map(|(_, n)| n).sum();
    assert!(
        total <= 100,
        "scan read {total} rows with 100 050 in the table: {reads:?}"
    );
}

#[test]
fn a_consumer_only_database_gets_the_inbox_and_dead_letter_tables_alone() {
    let db = TestDb::empty("consumer_only");
    let tables = |db: &TestDb| -> Vec<String> {
        db.conn()
            .query("SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() ORDER BY 1")
            .unwrap()
    };
    let pending: Vec<u32> = outbox::migrate::plan_consumer(&db.pool)
        .unwrap()
        .iter()
        .map(|p| p.version)
        .collect();
    assert_eq!(pending, outbox::migrate::CONSUMER_MIGRATIONS);
    assert!(tables(&db).is_empty(), "the plan changed nothing");
    let r = outbox::migrate_consumer(&db.pool).unwrap();
    assert_eq!((r.applied.as_slice(), r.current), (&[8, 10, 11][..], 11));
    assert_eq!(
        tables(&db),
        ["outbox_inbox", "outbox_inbox_dead_letter", "outbox_schema_history"],
        "none of the relay's tables"
    );
    // A consumer starts its checks on it; a second run has nothing to do.
    outbox::consumer::Consumer::check(&outbox::consumer::ConsumerConfig::new("points"), &db.pool).unwrap();
    assert!(outbox::migrate_consumer(&db.pool).unwrap().applied.is_empty());
    assert!(outbox::migrate::plan_consumer(&db.pool).unwrap().is_empty());
    // The same database relaying later gets every migration (the consumer's run again, harmlessly).
    let all = outbox::migrate(&db.pool).unwrap();
    assert_eq!(all.applied.len(), outbox::migrate::MIGRATIONS.len());
    assert!(tables(&db).contains(&"t_event_record".to_string()));
}
