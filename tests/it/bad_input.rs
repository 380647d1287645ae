//! Bad input, each with a clear error and no crash or lost row: every configuration key with
//! invalid values, payloads that are empty or too large, a table name with SQL in it, a database
//! that refuses connections at start, a broker that is unreachable at start; and property tests
//! of the configuration parser and of event validation.
//!
//! A database that disappears mid-run is covered by the long fault suite (`scripts/faults`,
//! `examples/faults/`), which restarts MariaDB under load.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use mysql::prelude::Queryable;
use mysql::TxOpts;

use crate::support::{wait_until, Recorder, TestDb};
use outbox::config::SECRET_KEYS;
use outbox::{Config, ConfigError, Error, NewEvent, Relay, KEYS};

/// Invalid values for every configuration key. A key added to `outbox::KEYS` without an entry
/// here (or in [`ANY_VALUE`]) fails `every_key_has_bad_values_in_the_table`.
const BAD_VALUES: &[(&str, &[&str])] = &[
    (
        "db.url",
        &[
            "",
            "not a url",
            "postgres://root@127.0.0.1:5432/x",
            "mysql://root@127.0.0.1:99999/x",
            "mysql://root@127.0.0.1:port/x",
        ],
    ),
    ("profile", &["", "seed-compatible", "Seed", "fast"]),
    ("startup.db.wait.ms", &["-1", "86400001", "5m", "soon"]),
    ("db.pool.max", &["0", "-1", "1025", "many", "1.5"]),
    (
        "shards",
        &[
            "mysql://u@h/o_{3..1}",
            "mysql://u@h/o_{a..b}",
            "mysql://u@h/",
            "mysql://u@h/a#no-such-table!",
            "http://h/a",
            "mysql://u@h/a mysql://u@h/a",
        ],
    ),
    ("shard.workers", &["0", "257", "one"]),
    ("shard.watch.ms", &["-1", "60001", "fast"]),
    ("shard.scan.interval.ms", &["0", "3600001", "slow"]),
    ("shard.db.pool.max", &["0", "1025", "two"]),
    (
        "shard.coordination.url",
        &["not a url", "postgres://root@127.0.0.1:5432/x", "mysql://root@127.0.0.1:port/x"],
    ),
    ("shard.lease.ms", &["999", "600001", "long"]),
    ("shard.catalog.url", &["not a url", "mysql://root@127.0.0.1:port/x"]),
    ("shard.catalog.query", &["SELECT url\nFROM t"]),
    ("shard.catalog.reload.ms", &["999", "86400001", "often"]),
    (
        "table",
        &[
            "",
            "t; DROP TABLE x",
            "t_event_record LIMIT 0; DROP TABLE victim",
            "1abc",
            "t-x",
            "t`x",
            "tbl name",
            "schema.table",
            "tábla",
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        ],
    ),
    ("instance.id", &["has space", "bell\u{7}", "new\nline"]),
    ("service.name", &["", "a b", "tab\tbed", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"]),
    ("service.port", &["0", "65536", "-1", "http", "80.5"]),
    ("claim.strategy", &["", "skip_locked", "SKIP-LOCKED", "magic", "hold"]),
    ("sent.rows", &["", "drop", "DELETE", "kept"]),
    ("batch.size", &["0", "10001", "-5", "ten", "1e3"]),
    ("scan.interval.ms", &["0", "3600001", "soon", "1s", "-1"]),
    ("scan.coalesce.ms", &["", "-1", "1001", "soon", "5 ms"]),
    ("scan.drain", &["", "maybe", "2", "truthy"]),
    ("reclaim.interval.ms", &["9", "3600001", "x", "60s"]),
    ("lease.ms", &["99", "86400001", "2m", "-120000"]),
    ("lease.renew.fraction", &["-0.1", "0.91", "1", "NaN", "inf", "half"]),
    ("max.retry", &["-1", "1001", "three", "3.0"]),
    ("backoff.policy", &["", "linear", "Fixed", "n^2"]),
    ("backoff.base.ms", &["-1", "86400001", "5s"]),
    ("backoff.max.ms", &["-1", "604800001", "10m"]),
    ("backoff.jitter", &["-0.01", "1.01", "NaN", "-inf", "lots"]),
    ("workers", &["0", "257", "four"]),
    ("publish.batch.max", &["0", "1001", "x"]),
    ("max.in.flight", &["0", "1000001", "x"]),
    ("send.timeout.ms", &["9", "600001", "3s", "0"]),
    ("payload.max.bytes", &["0", "16777216", "4MB", "-1"]),
    (
        "topic",
        &[
            "",
            "has space",
            "topic/with/slash",
            "tópico",
            "semi;colon",
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        ],
    ),
    ("breaker.failure.threshold", &["0", "1000001", "x"]),
    ("breaker.open.ms", &["9", "3600001", "x"]),
    ("ordering", &["", "per_biz_no", "global", "NONE"]),
    ("ordering.dead.head", &["", "drop", "Skip"]),
    ("publisher", &["", "kafka", "RocketMQ"]),
    (
        "rocketmq.namesrv",
        &[
            "",
            "localhost",
            "127.0.0.1:",
            ":9876",
            "127.0.0.1:0",
            "127.0.0.1:65536",
            "127.0.0.1:9876;",
            "127.0.0.1:x",
        ],
    ),
    ("rocketmq.producer.group", &["", "a b", "ctl\u{1}"]),
    ("rocketmq.retries", &["-1", "17", "x"]),
    ("rocketmq.tag.source", &["", "tag", "EVENT-TYPE"]),
    ("retention.age.ms", &["-1", "315360000001", "7d"]),
    ("retention.batch.size", &["0", "100001", "x"]),
    ("retention.interval.ms", &["9", "86400001", "x"]),
    ("retention.round.max.ms", &["9", "3600001", "x"]),
    ("log.level", &["loud", "verbose", "3", "warning"]),
    ("db.pool.wait.ms", &["-1", "86400001", "5s"]),
    (
        "metrics.listen",
        &["localhost:9464", "127.0.0.1", "127.0.0.1:x", ":9464", "127.0.0.1:65536"],
    ),
    ("consumer.threads", &["0", "257", "-1", "four"]),
    ("consumer.batch.max", &["0", "4097", "-1", "all", "1e3"]),
    ("consumer.max.attempts", &["0", "1001", "x"]),
    ("consumer.backoff.initial.ms", &["0", "3600001", "1s"]),
    ("consumer.backoff.max.ms", &["0", "86400001", "10s"]),
    ("consumer.queue.capacity", &["0", "100001", "x"]),
    ("consumer.persist.interval.ms", &["0", "3600001", "1s"]),
    ("consumer.replay.interval.ms", &["0", "3600001", "2s"]),
    ("consumer.inbox", &["", "maybe", "2"]),
    ("consumer.start.from", &["", "middle", "FIRST", "latest"]),
    ("consumer.route", &["", "user", "QUEUE", "property:", "property:a b", "bizno"]),
    ("otel.exporter.otlp.endpoint", &["collector:4318", "ftp://x", "http://", "http:// spaced"]),
    ("otel.service.name", &["", "a\tb"]),
    ("console.enabled", &["", "maybe", "2"]),
    ("console.listen", &["", "9470", "localhost", "127.0.0.1:http", "127.0.0.1:70000"]),
    ("console.admin.token", &["short", "has a space in it, long enough", "tab\there-and-long-enough"]),
    ("console.read.token", &["0123456789abcde", "ünïcödé-is-not-allowed-here"]),
    ("console.read.open", &["", "yes please", "-1"]),
    ("console.consumer.db.url", &["not a url", "postgres://db/x", "mysql://root@db:port/x"]),
    ("consumer.pull.batch", &["0", "1025", "x"]),
    ("inbox.table", &["", "inbox; DROP TABLE x", "1inbox", "in box"]),
    ("inbox.dead_letter.table", &["", "dl`x", "schema.dl"]),
    ("inbox.retention.ms", &["1", "3599999", "-1", "7d"]),
    ("inbox.retention.interval.ms", &["0", "86400001", "1m"]),
];

/// Keys that accept every value: the ACL credentials are opaque secrets (and an error would have
/// to echo the secret). Whatever they are set to, `set` must not panic and `get` gives it back.
const ANY_VALUE: &[&str] = &["rocketmq.access.key", "rocketmq.secret.key"];

fn bad_values(key: &str) -> &'static [&'static str] {
    BAD_VALUES
        .iter()
        .find(|(k, _)| *k == key)
        .map(|(_, v)| *v)
        .unwrap_or(&[])
}

#[test]
fn every_key_has_bad_values_in_the_table() {
    let keys: HashSet<&str> = KEYS.iter().map(|k| k.key).collect();
    for k in KEYS {
        assert!(
            !bad_values(k.key).is_empty() || ANY_VALUE.contains(&k.key),
            "key {} has no invalid values in BAD_VALUES (and is not in ANY_VALUE)",
            k.key
        );
    }
    for (k, _) in BAD_VALUES {
        assert!(
            keys.contains(k),
            "BAD_VALUES names {k}, which is not a configuration key"
        );
    }
}

#[test]
fn every_key_with_an_invalid_value_is_an_error_naming_the_key_and_the_value() {
    let base = Config::new("mysql://root@127.0.0.1:3306/test");
    let mut checked = 0;
    for k in KEYS {
        for &bad in bad_values(k.key) {
            let mut c = base.clone();
            let e = c
                .set(k.key, bad)
                .expect_err(&format!("set({}, {bad:?}) was accepted", k.key));
            match &e {
                ConfigError::InvalidValue { key, value, reason } => {
                    assert_eq!(key, k.key);
                    // A secret is never repeated, not even in the error for a bad one.
                    let shown = if SECRET_KEYS.contains(&k.key) {
                        "***"
                    } else {
                        bad.trim()
                    };
                    assert_eq!(value, shown, "the error carries the value given for {}", k.key);
                    assert!(!reason.is_empty(), "an empty reason for {} = {bad:?}", k.key);
                }
                other => panic!("set({}, {bad:?}) gave {other:?}, not InvalidValue", k.key),
            }
            let msg = e.to_string();
            assert!(
                msg.contains(k.key)
                    && (msg.contains(&format!("{:?}", bad.trim()))
                        || SECRET_KEYS.contains(&k.key) && !msg.contains(bad)),
                "the message names the key and the value: {msg}"
            );
            // The library error wraps it without losing either.
            let lib: Error = e.clone().into();
            assert!(lib.to_string().contains(k.key), "{lib}");
            assert!(!lib.is_retriable(), "a bad value is not worth retrying: {lib}");
            assert_eq!(
                c, base,
                "a refused value leaves the configuration unchanged ({})",
                k.key
            );
            checked += 1;
        }
    }
    assert!(
        checked >= 2 * (KEYS.len() - ANY_VALUE.len()),
        "only {checked} bad values checked"
    );
}

#[test]
fn keys_that_accept_any_value_give_it_back_and_redact_it() {
    for key in ANY_VALUE {
        for v in ["AK-1", "with space", "semi;colon", "ünïcode", "ctl\u{1}x"] {
            let mut c = Config::default();
            c.set(key, v).unwrap();
            assert_eq!(c.get(key).as_deref(), Some(v));
            assert_eq!(c.get_redacted(key).as_deref(), Some("***"));
        }
    }
}

#[test]
fn an_unknown_key_is_a_distinct_error_naming_it() {
    for key in [
        "",
        "scan.intervall.ms",
        "SCAN.INTERVAL.MS",
        "db.url ",
        "table\0",
        "rocketmq",
    ] {
        let mut c = Config::default();
        let e = c.set(key, "1").unwrap_err();
        assert_eq!(e, ConfigError::UnknownKey { key: key.into() });
        assert!(e.to_string().contains(&format!("{key:?}")), "{e}");
    }
}

/// The instance id goes into claim_owner (128 characters after the migrations): an explicit id
/// or a service name whose derived id could be longer is refused, naming the key and the value.
#[test]
fn an_instance_id_that_cannot_fit_claim_owner_is_refused_naming_the_key_and_the_value() {
    let mut c = Config::new("mysql://root@127.0.0.1:3306/test");
    let long = "i".repeat(129);
    let e = Config::default().set("instance.id", &long).unwrap_err().to_string();
    assert!(e.contains("instance.id") && e.contains(&long), "{e}");
    // Fields written past `set` are checked by validate (Relay::start calls it).
    c.instance_id = Some(long.clone());
    let e = c.validate().unwrap_err().to_string();
    assert!(
        e.contains("instance.id") && e.contains(&long) && e.contains("128"),
        "{e}"
    );
    c.instance_id = Some("i".repeat(128));
    c.validate().unwrap();
    c.instance_id = None;
    c.service_name = "s".repeat(111);
    let e = c.validate().unwrap_err().to_string();
    assert!(
        e.contains("service.name") && e.contains(&"s".repeat(111)) && e.contains("at most 110"),
        "{e}"
    );
    c.service_name = "s".repeat(110);
    c.validate().unwrap();
    // The longest name `set` accepts derives an id that fits, whatever the port or pid.
    let mut d = Config::new("mysql://root@127.0.0.1:3306/test");
    d.set("service.name", &"s".repeat(64)).unwrap();
    assert!(d.longest_derived_instance_id() <= outbox::config::CLAIM_OWNER_MAX_CHARS);
    assert!(outbox::relay::default_instance_id(&d).len() <= d.longest_derived_instance_id());
    d.validate().unwrap();
}

/// The whole table through the daemon in one go: every bad value is reported (not only the
/// first), each naming its key, its value and where it came from; exit code 2.
#[cfg(feature = "daemon")]
#[test]
fn outboxd_reports_every_bad_key_at_once_and_exits_2() {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_outboxd"));
    cmd.env_remove("OUTBOX_CONFIG")
        .env("OUTBOX_DB_URL", "mysql://root@127.0.0.1:3306/test");
    let mut expected = Vec::new();
    for k in KEYS {
        // One value per key that survives a command line (no control characters).
        if let Some(bad) = bad_values(k.key).iter().find(|v| !v.chars().any(char::is_control)) {
            cmd.arg("--set").arg(format!("{}={bad}", k.key));
            expected.push((k.key, *bad));
        }
    }
    cmd.args(["config", "check"]);
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    for (key, bad) in expected {
        let line = err
            .lines()
            .find(|l| l.contains(&format!(" for {key}:")) || l.contains(&format!(" for {key} ")))
            .unwrap_or_else(|| panic!("no error line for {key}:\n{err}"));
        if SECRET_KEYS.contains(&key) {
            assert!(
                line.contains("\"***\"") && !line.contains(bad),
                "a secret is never repeated: {line}"
            );
        } else {
            assert!(line.contains(&format!("{:?}", bad.trim())), "{line}");
        }
        assert!(line.contains("--set"), "the source is named: {line}");
    }
}

#[cfg(feature = "daemon")]
#[test]
fn outboxd_reports_checks_across_keys_together_with_bad_values() {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_outboxd"));
    cmd.env_remove("OUTBOX_CONFIG")
        .env_remove("OUTBOX_DB_URL")
        .env("OUTBOX_SEND_TIMEOUT_MS", "60000")
        .args([
            "--set",
            "lease.ms=100000",
            "--set",
            "batch.size=lots",
            "config",
            "check",
        ]);
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let line = |needle: &str| {
        err.lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no line with {needle:?}:\n{err}"))
            .to_string()
    };
    assert!(line("batch.size").contains("\"lots\""), "{err}");
    assert!(line("db.url").contains("is required"), "{err}");
    let both = line("send.timeout.ms");
    assert!(
        both.contains("lease.ms") && both.contains("60000") && both.contains("100000"),
        "{both}"
    );
    assert!(
        both.contains("OUTBOX_SEND_TIMEOUT_MS"),
        "the source of the keys is named: {both}"
    );
    assert!(err.contains("3 configuration error(s)"), "{err}");
}

#[test]
fn empty_and_oversized_payloads_are_refused_naming_the_field_and_the_transaction_goes_on() {
    let db = TestDb::new("bad_payload");
    let mut cfg = db.config();
    cfg.set("payload.max.bytes", "1024").unwrap();
    let rec = Recorder::new();
    let relay = Relay::start(cfg.clone(), rec.clone()).unwrap();
    let mut conn = db.conn();
    conn.query_drop("CREATE TABLE orders (no VARCHAR(32) PRIMARY KEY)")
        .unwrap();
    let mut tx = conn.start_transaction(TxOpts::default()).unwrap();
    tx.exec_drop("INSERT INTO orders (no) VALUES ('ORD-1')", ()).unwrap();
    let before = relay
        .enqueue_in_tx(&mut tx, &NewEvent::new("ORD-1", "ORDER_CREATED", b"{}".to_vec()))
        .unwrap();

    let e = relay
        .enqueue_in_tx(&mut tx, &NewEvent::new("ORD-1", "ORDER_CREATED", Vec::new()))
        .unwrap_err();
    assert!(
        matches!(&e, Error::InvalidEvent { field: "payload", .. }) && e.to_string().contains("empty"),
        "{e}"
    );
    let e = relay
        .enqueue_in_tx(&mut tx, &NewEvent::new("ORD-1", "ORDER_CREATED", vec![b'x'; 1025]))
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(&e, Error::InvalidEvent { field: "payload", .. })
            && msg.contains("1025")
            && msg.contains("payload.max.bytes = 1024"),
        "{msg}"
    );
    // The largest accepted payload, with bytes that are not UTF-8 and NULs, arrives unchanged.
    let mut max: Vec<u8> = (0..1024u32).map(|i| (i % 256) as u8).collect();
    max[0] = 0xff;
    let at_max = relay
        .enqueue_in_tx(&mut tx, &NewEvent::new("ORD-1", "ORDER_CREATED", max.clone()))
        .unwrap();
    // Other fields: blank, too long, NUL; each names its field.
    for (event, field) in [
        (NewEvent::new(" ", "T", b"x".to_vec()), "biz_no"),
        (NewEvent::new("b".repeat(65), "T", b"x".to_vec()), "biz_no"),
        (NewEvent::new("B", "", b"x".to_vec()), "event_type"),
        (NewEvent::new("B\0", "T", b"x".to_vec()), "biz_no"),
        (NewEvent::new("B", "T", b"x".to_vec()).with_topic("bad topic"), "topic"),
        (
            NewEvent::new("B", "T", b"x".to_vec()).with_header("eventId", "1"),
            "headers",
        ),
        (
            NewEvent::new("B", "T", b"x".to_vec()).with_header("k", "v\0"),
            "headers",
        ),
    ] {
        match relay.enqueue_in_tx(&mut tx, &event) {
            Err(Error::InvalidEvent { field: f, reason }) => assert_eq!(f, field, "{reason}"),
            other => panic!("{event:?} gave {other:?}"),
        }
    }
    relay.commit(tx).unwrap();
    assert!(wait_until(Duration::from_secs(30), || db.count("SUCCESS") == 2));
    relay.stop(Duration::from_secs(5));
    assert_eq!(db.rows().len(), 2, "only the two valid events have rows");
    assert_eq!(rec.sends_of(before), 1);
    assert_eq!(rec.sends_of(at_max), 1);
    let sent = rec.sent_events.lock();
    assert_eq!(sent.iter().find(|e| e.id == at_max).unwrap().payload, max);
    let orders: u64 = conn.query_first("SELECT COUNT(*) FROM orders").unwrap().unwrap();
    assert_eq!(orders, 1, "the business row committed with its events");
}

/// `Config::set` refuses such a name (see BAD_VALUES); this is the same name written straight
/// into the public field, past `set`. No statement may run with it: nothing is dropped.
///
/// (Before `Config::validate` checked `table`, `Relay::start` ran `SELECT id FROM {table}
/// LIMIT 0` with it as a multi-statement query and the victim table was dropped. Enqueue is
/// refused because its INSERT is a prepared statement, which cannot hold several statements.)
#[test]
fn a_table_name_with_sql_written_past_set_is_refused_before_any_statement_runs() {
    let db = TestDb::new("bad_table");
    db.conn().query_drop("CREATE TABLE victim (id INT)").unwrap();
    let victim_exists = |db: &TestDb| -> bool {
        db.conn()
            .query_first::<u64, _>(format!(
                "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = '{}' AND table_name = 'victim'",
                db.name
            ))
            .unwrap()
            .unwrap()
            == 1
    };
    let mut cfg = db.config();
    cfg.table = "t_event_record LIMIT 0; DROP TABLE victim; SELECT id FROM t_event_record".into();
    let started = Relay::start(cfg.clone(), Recorder::new()).map(|r| r.stop(Duration::from_secs(5)));
    assert!(victim_exists(&db), "Relay::start ran SQL from the table name");
    let e = started.unwrap_err();
    assert!(e.to_string().contains("table"), "{e}");
    let mut conn = db.conn();
    let mut tx = conn.start_transaction(TxOpts::default()).unwrap();
    let r = outbox::enqueue_in_tx_with(&mut tx, &cfg, &NewEvent::new("B", "T", b"x".to_vec()));
    drop(tx);
    assert!(r.is_err());
    assert!(victim_exists(&db), "enqueue ran SQL from the table name");
}

/// A port on 127.0.0.1 where nothing listens (bound, then released).
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    port
}

#[test]
fn a_database_that_refuses_connections_at_start_fails_start_with_a_clear_error() {
    let port = closed_port();
    let url = format!("mysql://root:s3cret@127.0.0.1:{port}/outbox");
    let t0 = Instant::now();
    let e = Relay::start(Config::new(&url), Recorder::new())
        .map(|_| ())
        .unwrap_err();
    let msg = e.to_string();
    eprintln!("database refusing connections: {msg}");
    assert!(matches!(e, Error::Db(_)), "{e:?}");
    assert!(msg.to_lowercase().contains("refused"), "{msg}");
    assert!(!msg.contains("s3cret"), "the password never shows: {msg}");
    assert!(e.is_retriable(), "an unreachable database is worth retrying later");
    // Enqueue-only (publisher = none) fails the same way, at once.
    let mut c = Config::new(&url);
    c.set("publisher", "none").unwrap();
    let e = outbox::open(c, None).map(|_| ()).unwrap_err();
    assert!(matches!(e, Error::Db(_)), "{e:?}");
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "refused connections fail fast: {:?}",
        t0.elapsed()
    );
}

#[cfg(feature = "daemon")]
#[test]
fn outboxd_run_against_a_database_that_refuses_connections_exits_non_zero_with_the_reason() {
    let port = closed_port();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_outboxd"))
        .env_remove("OUTBOX_CONFIG")
        .env("OUTBOX_DB_URL", format!("mysql://root:s3cret@127.0.0.1:{port}/outbox"))
        .env("OUTBOX_PUBLISHER", "none")
        .env("OUTBOX_STARTUP_DB_WAIT_MS", "0")
        .env("RUST_LOG", "warn")
        .arg("run")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "cannot reach the database at 127.0.0.1:{port} (connection refused) (startup.db.wait.ms = 0: not retrying)"
        )),
        "{err}"
    );
    assert!(!err.contains("s3cret"), "{err}");
}

/// What happens when the broker is unreachable at start: the publisher starts (the client only
/// connects on the first send), the relay starts, the first sends fail as "unavailable", the
/// breaker opens, and the rows go back to WAIT without using an attempt. Nothing is lost: a
/// relay that can reach the broker later delivers every row.
#[cfg(feature = "rocketmq")]
#[test]
fn a_broker_unreachable_at_start_opens_the_breaker_and_rows_stay_wait_without_using_retries() {
    use outbox::rocketmq::RocketMqPublisher;
    use std::sync::Arc;

    let db = TestDb::new("bad_nobroker");
    let topic = format!("outbox_bad_nobroker_{:08x}", rand::random::<u32>());
    let mut cfg = db.config();
    cfg.topic = topic.clone();
    cfg.rocketmq.namesrv = format!("127.0.0.1:{}", closed_port());
    cfg.rocketmq.producer_group = format!("outbox_bad_{:08x}", rand::random::<u32>());
    cfg.send_timeout = Duration::from_secs(1);
    cfg.breaker_failure_threshold = 2;
    cfg.breaker_open = Duration::from_millis(300);
    cfg.max_retry = 1;
    let publisher = RocketMqPublisher::start(&cfg).expect("the publisher starts without a reachable name server");
    let relay = Relay::builder(cfg.clone())
        .publisher(Arc::new(publisher))
        .start()
        .unwrap();
    let ids = db.seed(40);
    relay.notify();
    assert!(
        wait_until(Duration::from_secs(60), || relay.counters().breaker_opened >= 1),
        "the breaker opened: {:?}",
        relay.counters()
    );
    // Let it probe a few times while the broker stays unreachable.
    let probes_from = relay.counters().publish_calls;
    assert!(wait_until(Duration::from_secs(30), || relay.counters().publish_calls
        >= probes_from + 3));
    assert_eq!(relay.health(), (true, false), "healthy database, broker down");
    let s = relay.counters();
    relay.stop(Duration::from_secs(10));
    eprintln!(
        "unreachable broker: opened {} released_unsent {} retried {} dead {} calls {}",
        s.breaker_opened, s.released_unsent, s.retried, s.dead_lettered, s.publish_calls
    );
    assert_eq!(s.dead_lettered, 0);
    assert_eq!(s.retried, 0, "an unreachable broker uses no attempt");
    let rows = db.rows();
    assert_eq!(rows.len(), ids.len());
    for (id, status, retry_count, _) in &rows {
        assert_eq!(status, "WAIT", "event {id}");
        assert_eq!(*retry_count, 0, "event {id} used an attempt");
    }

    // Nothing lost: a relay that reaches the broker delivers every row. (Shared use of the
    // broker: tests that kill it hold this lock exclusively.)
    let _shared = crate::rocketmq_e2e::BROKER_LOCK.read();
    crate::rocketmq_e2e::ensure_broker();
    let mut good = cfg.clone();
    good.rocketmq.namesrv = "127.0.0.1:9876".into();
    good.breaker_open = Duration::from_secs(1);
    let publisher = RocketMqPublisher::start(&good).unwrap();
    let relay = Relay::builder(good).publisher(Arc::new(publisher)).start().unwrap();
    relay.notify();
    let drained = wait_until(Duration::from_secs(180), || db.count("SUCCESS") == ids.len() as u64);
    relay.stop(Duration::from_secs(10));
    assert!(drained, "rows left: {:?}", db.rows());
    let back = outbox::rocketmq::testing::read_topic("127.0.0.1:9876", &topic, ids.len(), Duration::from_secs(120))
        .expect("the topic reads back");
    let got: HashSet<u64> = back.messages.iter().filter_map(|m| m.event_id()).collect();
    let want: HashSet<u64> = ids.iter().copied().collect();
    assert_eq!(got, want, "every row delivered once the broker is reachable");
}

mod properties {
    //! Property tests (proptest). A short run by default so they fit in `cargo test`;
    //! `PROPTEST_CASES=5000 cargo test bad_input::properties` for a longer one.

    use super::*;
    use proptest::prelude::*;

    fn cases() -> u32 {
        std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(128)
    }

    /// A configuration key: mostly real ones, sometimes near misses or junk.
    fn any_key() -> impl Strategy<Value = String> {
        let real: Vec<String> = KEYS.iter().map(|k| k.key.to_string()).collect();
        prop_oneof![
            6 => proptest::sample::select(real.clone()),
            1 => proptest::sample::select(real).prop_map(|k| format!("{k}x")),
            1 => any::<String>(),
        ]
    }

    /// A value: the bad and the plausible, numbers at and around the edges, arbitrary text.
    fn any_value() -> impl Strategy<Value = String> {
        let words: Vec<String> = [
            "true",
            "false",
            "yes",
            "off",
            "none",
            "skip-locked",
            "per-row",
            "per-biz-no",
            "fixed",
            "quadratic",
            "exponential",
            "skip",
            "block",
            "rocketmq",
            "event-type",
            "127.0.0.1:9876",
            "127.0.0.1:9464",
            "[::1]:9464",
            "mysql://root@127.0.0.1:3306/db",
            "mysql://u:p@h/db?pool_min=1",
            "mysql://",
            "t_event_record",
            "0.5",
            "-0",
            "1e3",
            "NaN",
            "inf",
            "0x10",
            "+7",
            " 42 ",
            "",
            " ",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        prop_oneof![
            3 => proptest::sample::select(words),
            3 => any::<i64>().prop_map(|n| n.to_string()),
            2 => (0u64..100_000_000).prop_map(|n| n.to_string()),
            1 => any::<f64>().prop_map(|x| x.to_string()),
            1 => "[a-z0-9.:;/@_%|-]{0,40}",
            2 => any::<String>(),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

        /// `set` never panics; an error leaves the config as it was; an accepted value reads
        /// back through `get` in a form that `set` accepts and that gives the same config.
        #[test]
        fn set_never_panics_and_accepted_values_round_trip(key in any_key(), value in any_value()) {
            let base = Config::new("mysql://root@127.0.0.1:3306/test");
            let mut c = base.clone();
            match c.set(&key, &value) {
                Ok(()) => {
                    let got = c.get(&key).expect("an accepted key has a value");
                    let mut again = base.clone();
                    prop_assert!(again.set(&key, &got).is_ok(), "get({key}) = {got:?} is refused by set");
                    prop_assert_eq!(&again, &c, "set({}, {:?}) then get gave {:?}", key, value, got);
                    prop_assert_eq!(again.get(&key), Some(got));
                }
                Err(ConfigError::UnknownKey { key: k }) => {
                    prop_assert_eq!(&k, &key);
                    prop_assert!(!KEYS.iter().any(|i| i.key == key));
                    prop_assert!(c.get(&key).is_none());
                    prop_assert_eq!(&c, &base);
                }
                Err(e @ ConfigError::InvalidValue { .. }) => {
                    prop_assert!(e.to_string().contains(&key), "{}", e);
                    prop_assert_eq!(&c, &base, "a refused value changed the config");
                }
                Err(e) => prop_assert!(false, "set gave {:?}", e),
            }
            // Whatever was set, validating never panics.
            let _ = c.validate();
        }

        /// Event validation never panics, whatever the fields; an error names a real field; an
        /// accepted event fits the columns.
        #[test]
        fn event_validation_never_panics(
            biz_no in any::<String>(),
            event_type in prop_oneof!["[A-Z_]{0,70}", any::<String>()],
            payload in proptest::collection::vec(any::<u8>(), 0..300),
            topic in proptest::option::of(prop_oneof!["[A-Za-z0-9_%|-]{0,130}", any::<String>()]),
            tag in proptest::option::of(any::<String>()),
            headers in proptest::collection::btree_map(any::<String>(), any::<String>(), 0..4),
            max in 0usize..400,
        ) {
            let e = NewEvent { biz_no, event_type, payload, topic, tag, headers: headers.into_iter().collect::<BTreeMap<_, _>>(), schedule: None };
            match e.validate(max) {
                Ok(()) => {
                    prop_assert!(!e.payload.is_empty() && e.payload.len() <= max);
                    prop_assert!(!e.biz_no.trim().is_empty() && e.biz_no.chars().count() <= 64);
                    prop_assert!(!e.event_type.trim().is_empty() && e.event_type.chars().count() <= 64);
                    prop_assert!(!e.biz_no.contains('\0') && !e.event_type.contains('\0'));
                    if let Some(t) = &e.topic {
                        prop_assert!(!t.is_empty() && t.len() <= 127);
                    }
                }
                Err(Error::InvalidEvent { field, reason }) => {
                    prop_assert!(
                        ["biz_no", "event_type", "payload", "topic", "tag", "headers"].contains(&field),
                        "unknown field {}", field
                    );
                    prop_assert!(!reason.is_empty());
                }
                Err(other) => prop_assert!(false, "validate gave {:?}", other),
            }
        }
    }
}

/// Regression (issue 12 §6b): a wrong password or database name stays wrong; a retry loop around
/// start must end, so neither is retriable, and both read as words.
#[test]
fn access_denied_and_unknown_database_are_not_retriable() {
    let db = TestDb::new("denied");
    let host = db.url.split('@').nth(1).expect("a URL with a user");
    let mut c = Config::new(format!("mysql://outbox_nobody:s3cret@{host}"));
    c.set("publisher", "none").unwrap();
    let e = outbox::open(c, None).map(|_| ()).unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(&e, Error::Db(mysql::Error::MySqlError(me)) if me.code == 1045),
        "{e:?}"
    );
    assert!(!e.is_retriable(), "access denied is not worth retrying: {msg}");
    assert!(
        msg.contains("access denied") && !msg.contains("MySqlError") && !msg.contains("s3cret"),
        "{msg}"
    );

    let mut c = Config::new(format!("{}_missing", db.url));
    c.set("publisher", "none").unwrap();
    let e = outbox::open(c, None).map(|_| ()).unwrap_err();
    assert!(
        matches!(&e, Error::Db(mysql::Error::MySqlError(me)) if me.code == 1049),
        "{e:?}"
    );
    assert!(!e.is_retriable(), "an unknown database is not worth retrying: {e}");
    assert!(e.to_string().contains("unknown database"), "{e}");
}
