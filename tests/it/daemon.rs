//! `outboxd` driven as a user would: a spawned process against a real database.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use mysql::prelude::Queryable;

use crate::support::{wait_until, TestDb};

fn outboxd(db: &TestDb) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_outboxd"));
    c.env("OUTBOX_DB_URL", &db.url)
        .env("RUST_LOG", "info")
        .env_remove("OUTBOX_CONFIG");
    c
}

fn out(mut c: Command) -> (i32, String, String) {
    let Output { status, stdout, stderr } = c.output().unwrap();
    (
        status.code().unwrap_or(-1),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let code = buf.split_whitespace().nth(1)?.parse().ok()?;
    let body = buf
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((code, body))
}

#[test]
fn config_errors_exit_2_naming_key_value_and_source() {
    let db = TestDb::new("d_conf");
    let mut c = outboxd(&db);
    c.env("OUTBOX_SCAN_INTERVAL_MS", "soon")
        .args(["--set", "claim.strategy=magic", "config", "check"]);
    let (code, _, err) = out(c);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("scan.interval.ms") && err.contains("soon") && err.contains("OUTBOX_SCAN_INTERVAL_MS"),
        "{err}"
    );
    assert!(
        err.contains("claim.strategy") && err.contains("magic") && err.contains("--set"),
        "{err}"
    );
    // `run` refuses the same way.
    let mut c = outboxd(&db);
    c.env("OUTBOX_TABLE", "t; DROP TABLE x").arg("run");
    let (code, _, err) = out(c);
    assert_eq!(code, 2);
    assert!(err.contains("t; DROP TABLE x"), "{err}");
}

#[test]
fn env_overrides_the_file_and_secrets_are_redacted() {
    let db = TestDb::new("d_env");
    let dir = std::env::temp_dir().join(format!("outboxd-{}", db.name));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("outbox.toml");
    std::fs::write(&file, "\"rocketmq.access.key\" = \"AK\"\n\"rocketmq.secret.key\" = \"SUPERSECRET\"\n[batch]\nsize = 7\n[scan]\ninterval.ms = 250\n").unwrap();
    let mut c = outboxd(&db);
    c.env("OUTBOX_BATCH_SIZE", "42")
        .arg("--config")
        .arg(&file)
        .args(["config", "check"]);
    let (code, stdout, err) = out(c);
    assert_eq!(code, 0, "{err}");
    let line = |k: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(&format!("{k} ")))
            .unwrap_or("")
            .to_string()
    };
    assert!(
        line("batch.size").contains("42") && line("batch.size").contains("env OUTBOX_BATCH_SIZE"),
        "{stdout}"
    );
    assert!(
        line("scan.interval.ms").contains("250") && line("scan.interval.ms").contains("file"),
        "{stdout}"
    );
    assert!(!stdout.contains("SUPERSECRET"), "{stdout}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn migrate_status_dead_letters_and_purge_on_seeded_rows() {
    let db = TestDb::new("d_admin");
    let (code, stdout, err) = out({
        let mut c = outboxd(&db);
        c.arg("migrate");
        c
    });
    assert_eq!(code, 0, "{err}");
    assert!(stdout.contains("up to date"), "{stdout}");
    let ids = db.seed(6);
    let mut conn = db.conn();
    conn.exec_drop(
        "UPDATE t_event_record SET status = 'FAIL', last_error = 'too large' WHERE id IN (?, ?)",
        (ids[0], ids[1]),
    )
    .unwrap();
    conn.exec_drop(
        "UPDATE t_event_record SET status = 'SUCCESS', next_retry_time = NOW(3) - INTERVAL 3 DAY, update_time = NOW(3) - INTERVAL 3 DAY WHERE id = ?",
        (ids[2],),
    )
    .unwrap();
    conn.exec_drop("UPDATE t_event_record SET status = 'SUCCESS' WHERE id = ?", (ids[3],))
        .unwrap();

    let (code, stdout, _) = out({
        let mut c = outboxd(&db);
        c.args(["status", "--json"]);
        c
    });
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["counts"]["FAIL"], 2);
    assert_eq!(v["counts"]["WAIT"], 2);
    assert_eq!(v["dead_last_day"], 2);

    let (_, stdout, _) = out({
        let mut c = outboxd(&db);
        c.args(["dead-letters", "list", "--json"]);
        c
    });
    let list: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 2);

    // No filter: refused. Dry run: nothing changes. Then a real replay by id.
    let (code, _, err) = out({
        let mut c = outboxd(&db);
        c.args(["dead-letters", "replay"]);
        c
    });
    assert_ne!(code, 0);
    assert!(err.contains("filter"), "{err}");
    let (code, stdout, _) = out({
        let mut c = outboxd(&db);
        c.args(["dead-letters", "replay", "--all", "--dry-run"]);
        c
    });
    assert_eq!(code, 0);
    assert!(stdout.contains("would be replayed") && stdout.contains('2'), "{stdout}");
    assert_eq!(db.count("FAIL"), 2);
    let (code, stdout, err) = out({
        let mut c = outboxd(&db);
        c.args(["dead-letters", "replay", "--id", &ids[0].to_string(), "--actor", "bob"]);
        c
    });
    assert_eq!(code, 0, "{err}");
    assert!(stdout.contains("1 dead letter(s) replayed by bob"), "{stdout}");
    let (code, _, _) = out({
        let mut c = outboxd(&db);
        c.args(["dead-letters", "discard", "--id", &ids[1].to_string(), "--actor", "bob"]);
        c
    });
    assert_eq!(code, 0);
    assert_eq!(db.count("FAIL"), 0);
    assert_eq!(db.count("DISCARDED"), 1);
    let audit: Vec<(u64, String, String)> = db
        .conn()
        .query("SELECT event_id, action, actor FROM outbox_audit ORDER BY id")
        .unwrap();
    assert_eq!(
        audit,
        vec![
            (ids[0], "replay".into(), "bob".into()),
            (ids[1], "discard".into(), "bob".into())
        ]
    );

    // Purge: only the SUCCESS row older than a day goes.
    let (code, stdout, err) = out({
        let mut c = outboxd(&db);
        c.args(["purge", "--older-than", "1d"]);
        c
    });
    assert_eq!(code, 0, "{err}");
    assert!(stdout.contains("purged 1 row"), "{stdout}");
    assert_eq!(db.count("SUCCESS"), 1);
    assert_eq!(db.rows().len(), 5);
}

#[test]
fn run_relays_serves_metrics_and_drains_on_sigterm() {
    let db = TestDb::new("d_run");
    let port = free_port();
    let broker = crate::support::broker_available();
    let mut c = outboxd(&db);
    c.env("OUTBOX_METRICS_LISTEN", format!("127.0.0.1:{port}"))
        .env("OUTBOX_SCAN_INTERVAL_MS", "100")
        .env("OUTBOX_TOPIC", format!("T_{}", db.name))
        .env("OUTBOX_PUBLISHER", if broker { "rocketmq" } else { "none" })
        .arg("run")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    assert!(
        wait_until(Duration::from_secs(60), || http_get(port, "/metrics").is_some()),
        "metrics endpoint never came up"
    );
    let ids = db.seed(20);
    if broker {
        assert!(
            wait_until(Duration::from_secs(120), || db.count("SUCCESS") == 20),
            "daemon did not relay"
        );
        let (code, body) = http_get(port, "/healthz").unwrap();
        assert_eq!(code, 200, "{body}");
    } else {
        eprintln!("no RocketMQ broker on 127.0.0.1:9876 (or built without it): run checked with publisher=none");
        let (code, body) = http_get(port, "/healthz").unwrap();
        assert_eq!(code, 503, "an enqueue-only daemon reports the broker down: {body}");
    }
    let (code, metrics) = http_get(port, "/metrics").unwrap();
    assert_eq!(code, 200);
    for name in [
        "outbox_sent_total",
        "outbox_claimed_total",
        "outbox_breaker_state",
        "outbox_commit_to_ack_seconds_bucket",
        "outbox_wait_rows",
    ] {
        assert!(metrics.contains(name), "{name} missing from /metrics:\n{metrics}");
    }
    if broker {
        assert!(
            metrics.contains(&format!("outbox_sent_total {}", ids.len())),
            "{metrics}"
        );
    }
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let mut exited = None;
    assert!(wait_until(Duration::from_secs(30), || {
        exited = child.try_wait().unwrap();
        exited.is_some()
    }));
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert_eq!(exited.unwrap().code(), Some(0), "{err}");
    assert!(err.contains("draining") && err.contains("stopped"), "{err}");
    assert!(!err.contains("SENT_PER_EVENT"), "no per-event lines at INFO");
}

#[test]
fn the_committed_example_config_documents_every_key_and_loads() {
    let (code, stdout, _) = out({
        let mut c = Command::new(env!("CARGO_BIN_EXE_outboxd"));
        c.args(["config", "example"]);
        c
    });
    assert_eq!(code, 0);
    let committed = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/outbox.example.toml")).unwrap();
    assert_eq!(
        committed, stdout,
        "outbox.example.toml is stale: regenerate it with `outboxd config example > outbox.example.toml`"
    );
    for k in outbox::KEYS {
        assert!(
            committed.contains(&format!("\"{}\"", k.key)),
            "{} is not documented",
            k.key
        );
    }
    // And it is a valid configuration as it stands.
    let mut c = Command::new(env!("CARGO_BIN_EXE_outboxd"));
    c.env_remove("OUTBOX_DB_URL").args([
        "--config",
        concat!(env!("CARGO_MANIFEST_DIR"), "/outbox.example.toml"),
        "config",
        "check",
    ]);
    let (code, _, err) = out(c);
    assert_eq!(code, 0, "{err}");
}
