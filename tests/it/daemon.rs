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
        // Sent rows stay SUCCESS for the tests to read (the default deletes them).
        .env("OUTBOX_SENT_ROWS", "keep")
        .env_remove("OUTBOX_CONFIG");
    c
}

/// `outboxd` for a fleet: no db.url (the fleet's keys say where), as [`outboxd`] otherwise,
/// relaying to `topic` on the loopback broker.
fn fleet_outboxd(topic: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_outboxd"));
    c.env_remove("OUTBOX_DB_URL")
        .env_remove("OUTBOX_CONFIG")
        .env("RUST_LOG", "info")
        .env("OUTBOX_SENT_ROWS", "keep")
        .env("OUTBOX_TOPIC", topic)
        .env("OUTBOX_ROCKETMQ_NAMESRV", "127.0.0.1:9876");
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
    // The filters, as flags: by business key, event type and time range.
    let listed = |args: &[&str]| -> Vec<u64> {
        let (code, stdout, err) = out({
            let mut c = outboxd(&db);
            c.args(["dead-letters", "list", "--json"]).args(args);
            c
        });
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
        v.as_array()
            .unwrap()
            .iter()
            .map(|d| d["id"].as_u64().unwrap())
            .collect()
    };
    assert_eq!(listed(&["--biz-no", "ORD-1"]), vec![ids[1]]);
    assert_eq!(listed(&["--event-type", "ORDER_CREATED", "--since", "1h"]).len(), 2);
    assert!(listed(&["--event-type", "ORDER_PAID"]).is_empty());
    assert!(listed(&["--until", "1h"]).is_empty(), "both failed within the hour");
    let (code, _, err) = out({
        let mut c = outboxd(&db);
        c.args(["dead-letters", "list", "--since", "yesterday'; DROP TABLE x"]);
        c
    });
    assert_eq!(code, 2, "a bad time is a usage error: {err}");

    // No filter: refused as a usage error. Dry run: nothing changes. Then a real replay by id.
    let (code, _, err) = out({
        let mut c = outboxd(&db);
        c.args(["dead-letters", "replay"]);
        c
    });
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--all") && err.contains("--biz-no"), "{err}");
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

/// Reads a child's stderr on a thread: lines as they come, and the whole text at the end.
struct Lines {
    rx: crossbeam_channel::Receiver<String>,
    seen: Vec<String>,
}

impl Lines {
    fn of(child: &mut std::process::Child) -> Lines {
        let (tx, rx) = crossbeam_channel::unbounded();
        let stderr = child.stderr.take().expect("stderr piped");
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Lines { rx, seen: Vec::new() }
    }

    /// Waits until a line containing `needle` has been printed.
    fn wait_for(&mut self, needle: &str, limit: Duration) -> bool {
        if self.seen.iter().any(|l| l.contains(needle)) {
            return true;
        }
        let end = std::time::Instant::now() + limit;
        while let Ok(line) = self.rx.recv_deadline(end) {
            let hit = line.contains(needle);
            self.seen.push(line);
            if hit {
                return true;
            }
        }
        false
    }

    /// Everything printed, once the process has ended (its stderr closed).
    fn all(mut self) -> Vec<String> {
        self.seen.extend(self.rx.iter());
        self.seen
    }
}

fn signal(child: &std::process::Child, sig: &str) {
    let status = Command::new("kill")
        .args([&format!("-{sig}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

fn exit_code(child: &mut std::process::Child, limit: Duration) -> Option<i32> {
    let mut exited = None;
    wait_until(limit, || {
        exited = child.try_wait().unwrap();
        exited.is_some()
    });
    exited.map(|s| s.code().unwrap_or(-1))
}

/// A database user with a password, so that what the daemon prints can be checked for it.
struct PasswordUser {
    pool: mysql::Pool,
    name: String,
    password: String,
}

impl PasswordUser {
    fn new(db: &TestDb) -> PasswordUser {
        let name = format!("u{:08x}", rand::random::<u32>());
        let password = format!("s3cret{:08x}", rand::random::<u32>());
        let mut c = db.conn();
        c.query_drop(format!("CREATE USER '{name}'@'%' IDENTIFIED BY '{password}'"))
            .unwrap();
        c.query_drop(format!("GRANT ALL ON {}.* TO '{name}'@'%'", db.name))
            .unwrap();
        PasswordUser {
            pool: db.pool.clone(),
            name,
            password,
        }
    }

    fn url(&self, db: &TestDb) -> String {
        format!("mysql://{}:{}@127.0.0.1:3306/{}", self.name, self.password, db.name)
    }
}

impl Drop for PasswordUser {
    fn drop(&mut self) {
        if let Ok(mut c) = self.pool.get_conn() {
            let _ = c.query_drop(format!("DROP USER IF EXISTS '{}'@'%'", self.name));
        }
    }
}

#[test]
fn run_relays_serves_metrics_and_drains_on_sigterm() {
    let db = TestDb::new("d_run");
    let user = PasswordUser::new(&db);
    let port = free_port();
    let broker = cfg!(feature = "rocketmq");
    #[cfg(feature = "rocketmq")]
    let _shared = crate::rocketmq_e2e::BROKER_LOCK.read();
    #[cfg(feature = "rocketmq")]
    crate::rocketmq_e2e::ensure_broker();
    let mut c = outboxd(&db);
    c.env("OUTBOX_DB_URL", user.url(&db))
        .env("OUTBOX_METRICS_LISTEN", format!("127.0.0.1:{port}"))
        .env("OUTBOX_SCAN_INTERVAL_MS", "100")
        .env("OUTBOX_TOPIC", format!("T_{}", db.name))
        .env("OUTBOX_PUBLISHER", if broker { "rocketmq" } else { "none" })
        .env("OUTBOX_ROCKETMQ_NAMESRV", "127.0.0.1:9876")
        .arg("run")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let lines = Lines::of(&mut child);
    assert!(
        wait_until(Duration::from_secs(60), || http_get(port, "/metrics").is_some()),
        "metrics endpoint never came up"
    );
    let ids = db.seed(300);
    if broker {
        assert!(
            wait_until(Duration::from_secs(120), || db.count("SUCCESS") == ids.len() as u64),
            "daemon did not relay"
        );
        let (code, body) = http_get(port, "/healthz").unwrap();
        assert_eq!(code, 200, "{body}");
        assert_eq!(body.trim(), "db=up broker=up");
    } else {
        eprintln!("built without rocketmq: run checked with publisher=none");
        let (code, body) = http_get(port, "/healthz").unwrap();
        assert_eq!(code, 503, "an enqueue-only daemon reports the broker down: {body}");
    }
    let (code, metrics) = http_get(port, "/metrics").unwrap();
    assert_eq!(code, 200);
    for name in [
        "outbox_claimed_total",
        "outbox_claim_conflicts_total",
        "outbox_sent_total",
        "outbox_retried_total",
        "outbox_dead_lettered_total",
        "outbox_reclaimed_total",
        "outbox_renewed_total",
        "outbox_breaker_state",
        "outbox_in_flight",
        "outbox_commit_to_ack_seconds_bucket",
        "outbox_sending_residence_seconds_bucket",
        "outbox_wait_rows",
        "outbox_sending_rows",
        "outbox_fail_rows",
        "outbox_oldest_wait_age_seconds",
        "outbox_claim_failures_in_a_row",
        "outbox_write_failures_in_a_row",
        "outbox_stalled 0",
        "outbox_ordered_blocked_seconds 0",
    ] {
        assert!(metrics.contains(name), "{name} missing from /metrics:\n{metrics}");
    }
    if broker {
        assert!(
            metrics.contains(&format!("outbox_sent_total {}", ids.len())),
            "{metrics}"
        );
        assert!(
            metrics.contains(&format!("outbox_commit_to_ack_seconds_count {}", ids.len())),
            "{metrics}"
        );
    }
    signal(&child, "TERM");
    assert_eq!(exit_code(&mut child, Duration::from_secs(30)), Some(0));
    let lines = lines.all();
    let err = lines.join("\n");
    assert!(err.contains("draining") && err.contains("stopped"), "{err}");
    // The startup line shows the database without its password, and nothing ever prints it.
    assert!(err.contains(&format!("{}:***@", user.name)), "{err}");
    assert!(!err.contains(&user.password), "the password was printed:\n{err}");
    // One line per state change, never one per event.
    assert!(
        lines.len() < ids.len() / 10,
        "{} log lines at INFO for {} events:\n{err}",
        lines.len(),
        ids.len()
    );
}

/// The first SIGTERM drains; a second one, while the drain waits on a send, exits at once.
#[cfg(feature = "rocketmq")]
#[test]
fn a_second_signal_exits_at_once_while_draining() {
    let db = TestDb::new("d_sig2");
    // A "name server" that accepts connections and never answers: sends wait for their timeout.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    let held = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
    let h2 = held.clone();
    std::thread::spawn(move || {
        for s in silent.incoming().flatten() {
            h2.lock().push(s);
        }
    });
    let mut c = outboxd(&db);
    c.env("OUTBOX_PUBLISHER", "rocketmq")
        .env("OUTBOX_ROCKETMQ_NAMESRV", format!("127.0.0.1:{silent_port}"))
        .env("OUTBOX_SEND_TIMEOUT_MS", "30000")
        .env("OUTBOX_SCAN_INTERVAL_MS", "100")
        .args(["run", "--drain", "60s"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let mut lines = Lines::of(&mut child);
    db.seed(1);
    // Claimed by a held round: the row locked (still WAIT) and named in the round's journal row.
    let journal = || -> u64 {
        db.conn()
            .query_first("SELECT COUNT(*) FROM outbox_claim")
            .unwrap()
            .unwrap_or(0)
    };
    assert!(
        wait_until(Duration::from_secs(60), || journal() == 1),
        "the event was never claimed"
    );
    signal(&child, "TERM");
    assert!(
        lines.wait_for("draining", Duration::from_secs(30)),
        "the first signal was not handled"
    );
    assert_eq!(child.try_wait().unwrap(), None, "the drain waits for the send");
    signal(&child, "TERM");
    assert_eq!(
        exit_code(&mut child, Duration::from_secs(10)),
        Some(130),
        "{}",
        lines.all().join("\n")
    );
    // The round ended with the process: the row is claimable again, untouched, and the journal
    // row tells the next relay to count the attempt and audit it. Nothing is lost.
    assert!(
        wait_until(Duration::from_secs(30), || db.count("WAIT") == 1),
        "{:?}",
        db.rows()
    );
    assert_eq!(journal(), 1);
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

/// Forwards every connection accepted on `listener` to `to` (a stand-in for a database that
/// comes up late, or a network that heals).
fn forward(listener: std::net::TcpListener, to: &'static str) {
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { return };
            let Ok(server) = TcpStream::connect(to) else { continue };
            let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut &client, &mut &server);
                let _ = server.shutdown(std::net::Shutdown::Both);
            });
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut &s2, &mut &c2);
                let _ = c2.shutdown(std::net::Shutdown::Both);
            });
        }
    });
}

#[test]
fn run_waits_for_a_database_that_is_unreachable_at_start_reporting_why_then_relays() {
    let db = TestDb::new("d_wait");
    let db_port = free_port();
    let metrics_port = free_port();
    let mut c = outboxd(&db);
    c.env("OUTBOX_DB_URL", format!("mysql://root@127.0.0.1:{db_port}/{}", db.name))
        .env("OUTBOX_METRICS_LISTEN", format!("127.0.0.1:{metrics_port}"))
        .env("OUTBOX_PUBLISHER", "none")
        .env("OUTBOX_STARTUP_DB_WAIT_MS", "120000")
        .arg("run")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let mut lines = Lines::of(&mut child);
    let expected = format!("cannot reach the database at 127.0.0.1:{db_port} (connection refused); retrying in");
    assert!(lines.wait_for(&expected, Duration::from_secs(30)), "{:?}", lines.seen);
    // Meanwhile /healthz is not OK and says why.
    let mut health = None;
    assert!(wait_until(Duration::from_secs(30), || {
        health = http_get(metrics_port, "/healthz");
        health.as_ref().is_some_and(|(_, b)| b.contains("starting"))
    }));
    let (code, body) = health.unwrap();
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains(&format!(
            "cannot reach the database at 127.0.0.1:{db_port} (connection refused)"
        )),
        "{body}"
    );
    let (_, metrics) = http_get(metrics_port, "/metrics").unwrap();
    assert!(metrics.contains("outbox_starting 1"), "{metrics}");
    assert_eq!(child.try_wait().unwrap(), None, "outboxd keeps waiting");
    // The database becomes reachable: the relay starts, /healthz reports on it.
    forward(
        std::net::TcpListener::bind(("127.0.0.1", db_port)).unwrap(),
        "127.0.0.1:3306",
    );
    assert!(
        wait_until(Duration::from_secs(60), || http_get(metrics_port, "/healthz")
            .is_some_and(|(_, b)| b.contains("db=up"))),
        "the relay never started"
    );
    signal(&child, "TERM");
    assert_eq!(exit_code(&mut child, Duration::from_secs(30)), Some(0));
    let err = lines.all().join("\n");
    for debug_text in ["DriverError", "CodecError", "IoError", "os error"] {
        assert!(!err.contains(debug_text), "plain words, not {debug_text}:\n{err}");
    }
}

#[test]
fn run_fails_at_once_when_waiting_cannot_help() {
    let db = TestDb::new("d_fatal");
    for (url, needle) in [
        (
            format!("mysql://root:wrong-password@127.0.0.1:3306/{}", db.name),
            "(access denied, error 1045): check the user and password in db.url",
        ),
        (
            format!("mysql://root@127.0.0.1:3306/{}_missing", db.name),
            "(unknown database, error 1049)",
        ),
    ] {
        let t0 = std::time::Instant::now();
        let mut c = outboxd(&db);
        c.env("OUTBOX_DB_URL", &url)
            .env("OUTBOX_PUBLISHER", "none")
            .env_remove("OUTBOX_STARTUP_DB_WAIT_MS")
            .arg("run");
        let (code, _, err) = out(c);
        assert_eq!(code, 1, "{err}");
        assert!(err.contains(needle), "{err}");
        assert!(!err.contains("wrong-password"), "{err}");
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "no waiting on {needle}: {:?}",
            t0.elapsed()
        );
    }
}

#[test]
fn migrate_dry_run_prints_the_plan_with_lock_costs_and_changes_nothing() {
    let db = TestDb::new("d_plan");
    db.conn()
        .query_drop(
            "CREATE TABLE seed_events (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, biz_no VARCHAR(64) NOT NULL,
             event_type VARCHAR(64) NOT NULL, payload TEXT NOT NULL, status VARCHAR(16) NOT NULL DEFAULT 'WAIT',
             retry_count INT NOT NULL DEFAULT 0, next_retry_time DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP,
             claim_owner VARCHAR(64) NULL, claimed_at DATETIME NULL,
             create_time DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP,
             update_time DATETIME NOT NULL DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP,
             KEY idx_status_next_retry (status, next_retry_time), KEY idx_status_claimed_at (status, claimed_at))",
        )
        .unwrap();
    let mut c = outboxd(&db);
    c.args(["--set", "table=seed_events", "migrate", "--dry-run"]);
    let (code, stdout, err) = out(c);
    assert_eq!(code, 0, "{err}");
    for needle in [
        "nothing was changed",
        "V2 add fencing and delivery columns",
        "ALGORITHM = INSTANT",
        "V7 seed-era table to the fresh shape",
        "ALTER TABLE seed_events",
        "MODIFY COLUMN payload         MEDIUMBLOB",
        "lock cost:",
        "ONE table copy",
    ] {
        assert!(stdout.contains(needle), "{needle:?} missing:\n{stdout}");
    }
    let payload: Option<String> = db
        .conn()
        .query_first(
            "SELECT DATA_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() \
             AND TABLE_NAME = 'seed_events' AND COLUMN_NAME = 'payload'",
        )
        .unwrap();
    assert_eq!(payload.as_deref(), Some("text"), "the dry run changed the table");
    // The migrated default table: nothing to do.
    let mut c = outboxd(&db);
    c.args(["migrate", "--dry-run"]);
    let (code, stdout, err) = out(c);
    assert_eq!(code, 0, "{err}");
    assert!(stdout.contains("up to date: nothing would run"), "{stdout}");
}

#[test]
fn the_seed_profile_sets_the_seed_values_and_later_keys_override_them() {
    let db = TestDb::new("d_profile");
    let mut c = outboxd(&db);
    c.env("OUTBOX_PROFILE", "seed")
        .args(["--set", "max.retry=7", "config", "check"]);
    let (code, stdout, err) = out(c);
    assert_eq!(code, 0, "{err}");
    let value = |key: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(&format!("{key} ")))
            .and_then(|l| l.split('=').nth(1))
            .map(|v| v.split_whitespace().next().unwrap_or("").to_string())
            .unwrap_or_else(|| panic!("{key} missing:\n{stdout}"))
    };
    assert_eq!(value("profile"), "seed");
    assert_eq!(value("batch.size"), "20");
    assert_eq!(value("scan.interval.ms"), "5000");
    assert_eq!(value("lease.ms"), "600000");
    assert_eq!(value("claim.strategy"), "per-row");
    assert_eq!(value("max.retry"), "7", "a later key overrides the profile");
}

#[test]
fn dead_letters_of_a_consumer_group_are_listed_replayed_and_discarded_by_the_cli() {
    let db = TestDb::new("d_cdl");
    db.conn()
        .query_drop(
            "INSERT INTO outbox_inbox_dead_letter (consumer_group, event_key, topic, queue_id, queue_offset, body, attempts, last_error) \
             VALUES ('points', 'k-1', 'orders', 2, 40, 'x', 5, 'order unknown'), \
                    ('points', 'k-2', 'orders', 2, 41, 'y', 5, 'order unknown'), \
                    ('billing', 'k-1', 'orders', 1, 7, 'z', 5, 'no account')",
        )
        .unwrap();
    let run = |args: &[&str]| -> (i32, String, String) {
        out({
            let mut c = outboxd(&db);
            c.args(["dead-letters"]).args(args);
            c
        })
    };
    let (code, stdout, err) = run(&["list", "--consumer-group", "points", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let rows = v.as_array().unwrap();
    assert_eq!(rows.len(), 2, "only the group's: {stdout}");
    assert_eq!(rows[0]["event_key"], "k-1");
    assert_eq!(rows[0]["queue_offset"], 40);
    assert_eq!(rows[0]["last_error"], "order unknown");
    let first = rows[0]["id"].as_u64().unwrap();
    // Filters of the relay's dead letters do not apply to a consumer group's.
    let (code, _, err) = run(&["list", "--consumer-group", "points", "--biz-no", "B"]);
    assert_eq!(code, 2, "{err}");
    let (code, stdout, _) = run(&["replay", "--consumer-group", "points", "--all", "--dry-run"]);
    assert_eq!(code, 0);
    assert!(stdout.contains("dry run: 2"), "{stdout}");
    let (code, stdout, err) = run(&["replay", "--consumer-group", "points", "--id", &first.to_string()]);
    assert_eq!(code, 0, "{err}");
    assert!(stdout.contains("1 dead letter(s) of consumer group points"), "{stdout}");
    let status = |key: &str, group: &str| -> String {
        db.conn()
            .exec_first(
                "SELECT status FROM outbox_inbox_dead_letter WHERE event_key = ? AND consumer_group = ?",
                (key, group),
            )
            .unwrap()
            .unwrap()
    };
    assert_eq!(status("k-1", "points"), "REPLAY");
    assert_eq!(status("k-2", "points"), "DEAD");
    assert_eq!(status("k-1", "billing"), "DEAD", "another group's row is untouched");
    let (code, stdout, _) = run(&["discard", "--consumer-group", "points", "--all"]);
    assert_eq!(code, 0);
    assert!(
        stdout.contains("2 dead letter(s) of consumer group points discarded"),
        "{stdout}"
    );
    let left: u64 = db
        .conn()
        .query_first("SELECT COUNT(*) FROM outbox_inbox_dead_letter")
        .unwrap()
        .unwrap();
    assert_eq!(left, 1);
    let (code, _, err) = run(&["replay", "--consumer-group", "bad group", "--all"]);
    assert_ne!(code, 0);
    assert!(err.contains("--consumer-group") && err.contains("bad group"), "{err}");
}

/// Parks `keys` for `group` in the default consumer dead-letter table; their ids, in order.
fn park(db: &TestDb, group: &str, keys: &[&str]) -> Vec<u64> {
    let mut c = db.conn();
    keys.iter()
        .map(|k| {
            c.exec_drop(
                "INSERT INTO outbox_inbox_dead_letter (consumer_group, event_key, topic, queue_id, queue_offset, body, attempts, last_error) \
                 VALUES (?, ?, 'orders', 0, 1, 'x', 5, 'order unknown')",
                (group, k),
            )
            .unwrap();
            c.last_insert_id()
        })
        .collect()
}

/// `(id, status)` of every consumer dead letter, by id.
fn parked(db: &TestDb) -> Vec<(u64, String)> {
    db.conn()
        .query("SELECT id, status FROM outbox_inbox_dead_letter ORDER BY id")
        .unwrap()
}

/// `outbox_audit` in order: `(table_name, event_id, action, actor, detail)`.
fn audit_rows(db: &TestDb) -> Vec<(String, u64, String, String, Option<String>)> {
    db.conn()
        .query("SELECT table_name, event_id, action, actor, detail FROM outbox_audit ORDER BY id")
        .unwrap()
}

#[test]
fn consumer_group_dead_letter_actions_are_batched_rate_limited_and_audited() {
    let db = TestDb::new("d_cdl_batch");
    let points = park(&db, "points", &["k-1", "k-2", "k-3", "k-4", "k-5"]);
    let billing = park(&db, "billing", &["k-1"]);
    // A row already handed back for a replay: a replay leaves it alone, a discard takes it.
    let pending = park(&db, "points", &["k-6"]);
    db.conn()
        .exec_drop(
            "UPDATE outbox_inbox_dead_letter SET status = 'REPLAY' WHERE id = ?",
            (pending[0],),
        )
        .unwrap();
    let before = parked(&db);
    let run = |args: &[&str], user: &str| -> (i32, String, String) {
        out({
            let mut c = outboxd(&db);
            c.env("USER", user).args(["dead-letters"]).args(args);
            c
        })
    };

    // Dry run: counted, nothing changed, nothing audited.
    let (code, stdout, err) = run(&["replay", "--consumer-group", "points", "--all", "--dry-run"], "carol");
    assert_eq!(code, 0, "{err}");
    assert!(
        stdout.contains("dry run: 5 dead letter(s) of consumer group points"),
        "{stdout}"
    );
    let (code, stdout, err) = run(
        &["discard", "--consumer-group", "points", "--all", "--dry-run"],
        "carol",
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        stdout.contains("dry run: 6 dead letter(s) of consumer group points"),
        "{stdout}"
    );
    assert_eq!(parked(&db), before);
    assert!(audit_rows(&db).is_empty());

    // 5 rows in batches of 2 at 4 rows/s: all 5 change, in 3 transactions (one audit INSERT
    // each, so one `at` each), the third not before 1 s after the first.
    let (code, stdout, err) = run(
        &[
            "replay",
            "--consumer-group",
            "points",
            "--all",
            "--batch",
            "2",
            "--rate",
            "4",
            "--actor",
            "alice@ops",
        ],
        "carol",
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        stdout.contains("5 dead letter(s) of consumer group points marked REPLAY by alice@ops"),
        "{stdout}"
    );
    let status: std::collections::HashMap<u64, String> = parked(&db).into_iter().collect();
    for id in &points {
        assert_eq!(status[id], "REPLAY", "row {id}");
    }
    assert_eq!(status[&billing[0]], "DEAD", "another group's row is untouched");
    let audit = audit_rows(&db);
    assert_eq!(
        audit.iter().map(|a| a.1).collect::<Vec<_>>(),
        points,
        "one audit row per changed row, nothing for the row already REPLAY"
    );
    for (i, (table, _, action, actor, detail)) in audit.iter().enumerate() {
        assert_eq!(
            (table.as_str(), action.as_str(), actor.as_str()),
            ("outbox_inbox_dead_letter", "replay", "alice@ops")
        );
        let detail = detail.as_deref().unwrap_or_default();
        assert!(
            detail.contains("consumer group points") && detail.contains(&format!("event key k-{}", i + 1)),
            "{detail}"
        );
    }
    let batches: Vec<(u64, f64)> = db
        .conn()
        .query(
            "SELECT COUNT(*), TIMESTAMPDIFF(MICROSECOND, (SELECT MIN(at) FROM outbox_audit), at) / 1e6 \
             FROM outbox_audit GROUP BY at ORDER BY at",
        )
        .unwrap();
    assert_eq!(
        batches.iter().map(|b| b.0).collect::<Vec<_>>(),
        vec![2, 2, 1],
        "{batches:?}"
    );
    assert!(batches[2].1 >= 0.99, "rows 5 went before 4 rows/s allows: {batches:?}");

    // A replay takes DEAD rows only: the ones now REPLAY are not changed twice.
    let (code, stdout, err) = run(&["replay", "--consumer-group", "points", "--all"], "carol");
    assert_eq!(code, 0, "{err}");
    assert!(stdout.contains("0 dead letter(s) of consumer group points"), "{stdout}");
    assert_eq!(audit_rows(&db).len(), 5);

    // Discard by id, default actor ($USER@hostname): exactly the selected rows of the group go
    // (an id of another group selects nothing), REPLAY ones included.
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into());
    let (code, stdout, err) = run(
        &[
            "discard",
            "--consumer-group",
            "points",
            "--id",
            &points[0].to_string(),
            "--id",
            &pending[0].to_string(),
            "--id",
            &billing[0].to_string(),
        ],
        "carol",
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        stdout.contains(&format!(
            "2 dead letter(s) of consumer group points discarded by carol@{host}"
        )),
        "{stdout}"
    );
    let left: Vec<u64> = parked(&db).into_iter().map(|r| r.0).collect();
    assert_eq!(left, vec![points[1], points[2], points[3], points[4], billing[0]]);
    let audit = audit_rows(&db);
    assert_eq!(audit.len(), 7);
    assert_eq!(
        audit[5..]
            .iter()
            .map(|a| (a.1, a.2.as_str(), a.3.clone()))
            .collect::<Vec<_>>(),
        vec![
            (points[0], "discard", format!("carol@{host}")),
            (pending[0], "discard", format!("carol@{host}"))
        ]
    );
    assert!(audit[6].4.as_deref().unwrap_or_default().contains("event key k-6"));
}

#[test]
fn bad_input_to_a_consumer_group_action_is_refused_naming_the_option_and_changes_nothing() {
    let db = TestDb::new("d_cdl_bad");
    park(&db, "points", &["k-1", "k-2"]);
    let before = parked(&db);
    let run = |args: &[&str]| -> (i32, String, String) {
        out({
            let mut c = outboxd(&db);
            c.args(["dead-letters"]).args(args);
            c
        })
    };
    for (args, option, value) in [
        (
            vec!["replay", "--consumer-group", "po ints;", "--all"],
            "--consumer-group",
            "po ints;",
        ),
        (
            vec!["discard", "--consumer-group", "points", "--all", "--batch", "0"],
            "--batch",
            "0",
        ),
        (
            vec!["replay", "--consumer-group", "points", "--all", "--actor", ""],
            "--actor",
            "''",
        ),
        (
            vec!["replay", "--consumer-group", "points", "--all", "--actor", " "],
            "--actor",
            "' '",
        ),
        (
            vec![
                "discard",
                "--consumer-group",
                "points",
                "--all",
                "--dead-letter-table",
                "x; DROP TABLE y",
            ],
            "--dead-letter-table",
            "x; DROP TABLE y",
        ),
    ] {
        let (code, stdout, err) = run(&args);
        assert_eq!(code, 2, "{args:?} is a usage error: {stdout}{err}");
        assert!(err.contains(option) && err.contains(value), "{args:?}: {err}");
    }
    // The relay's path refuses a batch of 0 the same way.
    let (code, _, err) = run(&["replay", "--all", "--batch", "0"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--batch") && err.contains('0'), "{err}");
    assert_eq!(parked(&db), before);
    assert!(audit_rows(&db).is_empty());
}

#[test]
fn the_help_of_replay_and_discard_says_what_each_does_to_a_consumer_group() {
    let help = |cmd: &str| -> String {
        let (code, stdout, err) = out({
            let mut c = Command::new(env!("CARGO_BIN_EXE_outboxd"));
            c.args(["dead-letters", cmd, "--help"]);
            c
        });
        assert_eq!(code, 0, "{err}");
        stdout
    };
    let replay = help("replay");
    assert!(
        replay.contains("--consumer-group") && replay.contains("REPLAY"),
        "{replay}"
    );
    assert!(replay.contains("running consumers"), "{replay}");
    assert!(replay.contains("back to WAIT"), "the relay's semantics too: {replay}");
    for option in ["--batch", "--rate", "--actor", "--dry-run"] {
        assert!(replay.contains(option), "{option}: {replay}");
    }
    assert!(replay.contains("outbox_audit"), "{replay}");
    let discard = help("discard");
    assert!(
        discard.contains("DISCARDED") && discard.contains("deleted"),
        "{discard}"
    );
}

/// The alerts and the dashboard in `deploy/` name only metrics that exist: `deploy/check.sh`
/// (promtool's rule checks and tests, then every metric name of the rules and the dashboard)
/// against a live scrape of `outboxd` relaying and of a consumer crediting what it relayed.
#[cfg(feature = "rocketmq")]
#[test]
fn the_shipped_alerts_and_dashboard_name_only_metrics_of_a_live_scrape() {
    use outbox::consumer::{Consumer, ConsumerConfig, HandlerError, Message};
    use outbox::rocketmq::{RocketMqSource, SourceConfig};
    use std::sync::Arc;

    let _shared = crate::rocketmq_e2e::BROKER_LOCK.read();
    crate::rocketmq_e2e::ensure_broker();
    let db = TestDb::new("d_deploy");
    let (port, topic) = (free_port(), format!("T_{}", db.name));
    let group = format!("points_{}", db.name);
    let mut c = outboxd(&db);
    c.env("OUTBOX_METRICS_LISTEN", format!("127.0.0.1:{port}"))
        .env("OUTBOX_SCAN_INTERVAL_MS", "100")
        .env("OUTBOX_TOPIC", &topic)
        .env("OUTBOX_ROCKETMQ_NAMESRV", "127.0.0.1:9876")
        .arg("run")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = c.spawn().unwrap();
    let src = RocketMqSource::start(&SourceConfig::new("127.0.0.1:9876", &topic, &group)).unwrap();
    let handler = |_: &mut mysql::Transaction<'_>, _: &Message| -> Result<(), HandlerError> { Ok(()) };
    let consumer = Consumer::start(
        ConsumerConfig::new(&group),
        db.pool.clone(),
        Arc::new(src),
        Arc::new(handler),
    )
    .unwrap();
    let ids = db.seed(20);
    assert!(
        wait_until(Duration::from_secs(120), || consumer.stats().processed
            >= ids.len() as u64),
        "the consumer credited {} of {}",
        consumer.stats().processed,
        ids.len()
    );
    // The lag is read every few seconds: the scrape is taken once it is known.
    assert!(
        wait_until(Duration::from_secs(60), || consumer.stats().lag.is_some()),
        "the consumer never knew its lag"
    );
    let (code, relay_scrape) = http_get(port, "/metrics").unwrap();
    assert_eq!(code, 200);
    // The same table as a fleet of one shard, split through its own database, for the series
    // only a fleet (and relays splitting one) have.
    let fleet_port = free_port();
    let mut c = outboxd(&db);
    c.env_remove("OUTBOX_DB_URL")
        .env("OUTBOX_SHARDS", &db.url)
        .env("OUTBOX_SHARD_COORDINATION_URL", &db.url)
        .env("OUTBOX_METRICS_LISTEN", format!("127.0.0.1:{fleet_port}"))
        .env("OUTBOX_TOPIC", &topic)
        .env("OUTBOX_ROCKETMQ_NAMESRV", "127.0.0.1:9876")
        .arg("run")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut fleet = c.spawn().unwrap();
    let mut fleet_scrape = String::new();
    assert!(
        wait_until(Duration::from_secs(60), || {
            fleet_scrape = http_get(fleet_port, "/metrics").map(|r| r.1).unwrap_or_default();
            fleet_scrape.contains("outbox_sent_total{shard=") && fleet_scrape.contains("outbox_fleet_members 1")
        }),
        "the fleet's scrape never showed its shard:\n{fleet_scrape}"
    );
    signal(&fleet, "TERM");
    assert_eq!(exit_code(&mut fleet, Duration::from_secs(30)), Some(0));
    let dir = std::env::temp_dir().join(format!("outbox-deploy-{}", db.name));
    std::fs::create_dir_all(&dir).unwrap();
    let (relay_file, consumer_file) = (dir.join("outboxd.txt"), dir.join("consumer.txt"));
    let fleet_file = dir.join("fleet.txt");
    std::fs::write(&relay_file, relay_scrape).unwrap();
    std::fs::write(&fleet_file, fleet_scrape).unwrap();
    std::fs::write(&consumer_file, consumer.stats().prometheus(&group)).unwrap();
    consumer.stop();
    signal(&child, "TERM");
    assert_eq!(exit_code(&mut child, Duration::from_secs(30)), Some(0));

    let (code, out, err) = out({
        let mut c = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/check.sh"));
        c.arg(&relay_file).arg(&fleet_file).arg(&consumer_file);
        c
    });
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(code, 0, "deploy/check.sh failed:\n{out}\n{err}");
    assert!(
        out.contains("metric names against"),
        "the names were not checked:\n{out}"
    );
}

/// `outboxd` sends the spans of traced events to an OTLP/HTTP collector, found through the
/// configuration key or the standard `OTEL_EXPORTER_OTLP_ENDPOINT` (with `OTEL_SERVICE_NAME`).
#[cfg(all(feature = "rocketmq", feature = "otlp"))]
#[test]
fn run_exports_the_spans_of_traced_events_over_otlp() {
    use std::sync::mpsc;

    let _shared = crate::rocketmq_e2e::BROKER_LOCK.read();
    crate::rocketmq_e2e::ensure_broker();
    for (via_env, tag) in [(false, "d_otlp_key"), (true, "d_otlp_env")] {
        let db = TestDb::new(tag);
        // A collector: every POST body to /v1/traces.
        let collector = tiny_http::Server::http("127.0.0.1:0").unwrap();
        let port = collector.server_addr().to_ip().unwrap().port();
        let (tx, rx) = mpsc::channel::<(String, Vec<u8>)>();
        std::thread::spawn(move || {
            for mut req in collector.incoming_requests() {
                let mut body = Vec::new();
                let _ = req.as_reader().read_to_end(&mut body);
                let _ = tx.send((req.url().to_string(), body));
                let _ = req.respond(tiny_http::Response::empty(200));
            }
        });
        let trace_id: [u8; 16] = rand::random();
        let tp = outbox::trace::TraceParent {
            version: 0,
            trace_id,
            parent_id: rand::random(),
            flags: 1,
        };
        {
            let mut conn = db.conn();
            let mut t = conn.start_transaction(mysql::TxOpts::default()).unwrap();
            let e = outbox::NewEvent::new("ORD-1", "ORDER_PAID", "{}").with_trace_context(tp.to_header(), None);
            outbox::enqueue_in_tx(&mut t, &e).unwrap();
            t.commit().unwrap();
        }
        let mut c = outboxd(&db);
        let endpoint = format!("http://127.0.0.1:{port}");
        if via_env {
            c.env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
                .env("OTEL_SERVICE_NAME", "points-relay");
        } else {
            c.env("OUTBOX_OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint);
        }
        let metrics_port = free_port();
        c.env("OUTBOX_TOPIC", format!("T_{}", db.name))
            .env("OUTBOX_ROCKETMQ_NAMESRV", "127.0.0.1:9876")
            .env("OUTBOX_METRICS_LISTEN", format!("127.0.0.1:{metrics_port}"))
            .arg("run")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = c.spawn().unwrap();
        assert!(
            wait_until(Duration::from_secs(60), || db.count("SUCCESS") == 1),
            "not relayed"
        );
        // The commit -> ack histogram names the event's trace as its exemplar (observed once the
        // round's record has committed, so a moment after the row reads SUCCESS).
        let hex: String = trace_id.iter().map(|b| format!("{b:02x}")).collect();
        let mut metrics = String::new();
        assert!(
            wait_until(Duration::from_secs(10), || {
                metrics = http_get(metrics_port, "/metrics").unwrap().1;
                metrics.lines().any(|l| {
                    l.starts_with("outbox_commit_to_ack_seconds_bucket")
                        && l.contains(&format!("# {{trace_id=\"{hex}\"}}"))
                })
            }),
            "no exemplar with the trace id:\n{metrics}"
        );
        // The last spans leave when outboxd stops.
        signal(&child, "TERM");
        assert_eq!(exit_code(&mut child, Duration::from_secs(30)), Some(0));
        let (url, body) = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the collector received nothing");
        assert_eq!(url, "/v1/traces");
        let contains = |needle: &[u8]| body.windows(needle.len()).any(|w| w == needle);
        assert!(contains(&trace_id), "the trace id is not in the export");
        assert!(contains(b"outbox.publish"));
        assert!(contains(if via_env { b"points-relay" } else { b"outboxd" }));
    }
}

#[test]
fn migrate_consumer_creates_the_consumer_s_tables_alone() {
    let db = TestDb::empty("d_mig_consumer");
    let mut c = outboxd(&db);
    c.args(["migrate", "--consumer", "--dry-run"]);
    let (code, stdout, err) = out(c);
    assert_eq!(code, 0, "{err}");
    assert!(
        stdout.contains("3 migration(s) would run on the consumer's tables"),
        "{stdout}"
    );
    let mut c = outboxd(&db);
    c.args(["migrate", "--consumer"]);
    let (code, stdout, err) = out(c);
    assert_eq!(code, 0, "{err}");
    assert!(
        stdout.contains("applied [8, 10, 11] to the consumer's tables; schema version 11"),
        "{stdout}"
    );
    let tables: Vec<String> = db
        .conn()
        .query("SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() ORDER BY 1")
        .unwrap();
    assert_eq!(
        tables,
        ["outbox_inbox", "outbox_inbox_dead_letter", "outbox_schema_history"]
    );
    let mut c = outboxd(&db);
    c.args(["migrate", "--consumer"]);
    let (code, stdout, err) = out(c);
    assert_eq!(code, 0, "{err}");
    assert!(stdout.contains("the consumer's tables are up to date"), "{stdout}");
}

#[test]
fn events_cancel_by_id_and_by_business_key_prints_each_outcome_and_status_shows_scheduled() {
    let db = TestDb::new("d_cancel");
    let mut conn = db.conn();
    let mut tx = conn.start_transaction(mysql::TxOpts::default()).unwrap();
    let later = |b: &str, t: &str| outbox::NewEvent::new(b, t, "x").deliver_after(Duration::from_secs(3600));
    let ids: Vec<u64> = [
        later("ORD-1", "ORDER_TIMEOUT"),
        later("ORD-2", "ORDER_TIMEOUT"),
        later("ORD-2", "ORDER_REMINDER"),
        outbox::NewEvent::new("ORD-3", "ORDER_CREATED", "x"),
    ]
    .iter()
    .map(|e| outbox::enqueue_in_tx(&mut tx, e).unwrap())
    .collect();
    tx.commit().unwrap();
    conn.exec_drop("UPDATE t_event_record SET status = 'SUCCESS' WHERE id = ?", (ids[3],))
        .unwrap();

    let (code, stdout, err) = out({
        let mut c = outboxd(&db);
        c.arg("status");
        c
    });
    assert_eq!(code, 0, "{err}");
    assert!(
        stdout.contains("of WAIT, scheduled for later: 3, the next in"),
        "{stdout}"
    );

    let (code, stdout, err) = out({
        let mut c = outboxd(&db);
        c.args(["events", "cancel", "--actor", "ops@test"]);
        c.args(["--id", &ids[0].to_string(), "--id", &ids[3].to_string()]);
        c
    });
    assert_eq!(code, 0, "{err}");
    assert!(stdout.contains(&format!("event {}: cancelled", ids[0])), "{stdout}");
    assert!(stdout.contains(&format!("event {}: already sent", ids[3])), "{stdout}");
    assert!(
        stdout.contains("2 in t_event_record: cancelled 1, already sent 1"),
        "{stdout}"
    );

    let (code, stdout, err) = out({
        let mut c = outboxd(&db);
        c.args([
            "events",
            "cancel",
            "--biz-no",
            "ORD-2",
            "--event-type",
            "ORDER_TIMEOUT",
            "--json",
        ]);
        c
    });
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["cancelled"], 1);
    assert_eq!(v["events"][0]["id"], ids[1]);
    let actors: Vec<(u64, String)> = db
        .conn()
        .query("SELECT event_id, actor FROM outbox_audit WHERE action = 'cancel' ORDER BY event_id")
        .unwrap();
    assert_eq!(actors[0], (ids[0], "ops@test".to_string()));
    assert_eq!(actors.len(), 2);

    // Bad input: an id never issued, neither --id nor --biz-no; nothing changes.
    let (code, _, err) = out({
        let mut c = outboxd(&db);
        c.args(["events", "cancel", "--id", "424242"]);
        c
    });
    assert_eq!(code, 1);
    assert!(err.contains("424242 is not an event of t_event_record"), "{err}");
    let (code, _, err) = out({
        let mut c = outboxd(&db);
        c.args(["events", "cancel"]);
        c
    });
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--id") && err.contains("--biz-no"), "{err}");
    assert_eq!(db.rows().len(), 2, "ORD-2's reminder and the sent row are left");
}

#[test]
fn re_emit_from_outboxd_counts_runs_stops_on_a_signal_and_resumes() {
    let db = TestDb::new("d_reemit");
    let events: Vec<outbox::NewEvent> = (0..2000)
        .map(|i| outbox::NewEvent::new(format!("ORD-{i}"), if i % 2 == 0 { "PAID" } else { "CREATED" }, "x"))
        .collect();
    db.enqueue(&events);
    db.conn()
        .query_drop("UPDATE t_event_record SET status = 'SUCCESS', event_key = UUID()")
        .unwrap();
    let count = |sql: &str| -> u64 { db.conn().query_first(sql).unwrap().unwrap() };
    // The count first: nothing is sent without --yes.
    let (code, stdout, err) = out({
        let mut c = outboxd(&db);
        c.args(["events", "re-emit", "--event-type", "PAID", "--since", "1h"]);
        c
    });
    assert_eq!(code, 0, "{err}");
    assert!(
        stdout.contains("1000 sent events match (type PAID, written since"),
        "{stdout}"
    );
    assert!(stdout.contains("keeps sent events back to"), "{stdout}");
    assert!(stdout.contains("add --yes to re-emit them at 1000/s"), "{stdout}");
    assert_eq!(count("SELECT COUNT(*) FROM outbox_reemit"), 0);
    // A bad rate names itself; nothing created.
    let (code, _, err) = out({
        let mut c = outboxd(&db);
        c.args(["events", "re-emit", "--event-type", "PAID", "--yes", "--rate", "0"]);
        c
    });
    assert_ne!(code, 0);
    assert!(err.contains("rate 0 must be 1 to 100000"), "{err}");
    assert_eq!(count("SELECT COUNT(*) FROM outbox_reemit"), 0);
    // Run at 400/s, stopped by SIGTERM after its first copies: it says how to resume.
    let mut child = {
        let mut c = outboxd(&db);
        c.args([
            "events",
            "re-emit",
            "--event-type",
            "PAID",
            "--yes",
            "--rate",
            "400",
            "--actor",
            "ops@test",
        ]);
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        c.spawn().unwrap()
    };
    assert!(wait_until(Duration::from_secs(30), || count(
        "SELECT COALESCE(MAX(emitted), 0) FROM outbox_reemit"
    ) >= 200));
    signal(&child, "TERM");
    assert_eq!(exit_code(&mut child, Duration::from_secs(30)), Some(0));
    let mut stdout = String::new();
    child.stdout.take().unwrap().read_to_string(&mut stdout).unwrap();
    assert!(stdout.contains("re-emit job 1: 1000 events (type PAID"), "{stdout}");
    assert!(
        stdout.contains("resume with: outboxd events re-emit --resume 1"),
        "{stdout}"
    );
    let emitted = count("SELECT emitted FROM outbox_reemit WHERE id = 1");
    assert!(emitted < 1000, "{emitted}");
    assert_eq!(
        count("SELECT COUNT(*) FROM t_event_record WHERE status = 'WAIT'"),
        emitted
    );
    let (code, stdout, err) = out({
        let mut c = outboxd(&db);
        c.args(["events", "re-emits"]);
        c
    });
    assert_eq!(code, 0, "{err}");
    assert!(
        stdout.contains(&format!("job 1: emitted {emitted} of 1000 (STOPPED)")),
        "{stdout}"
    );
    let (code, stdout, err) = out({
        let mut c = outboxd(&db);
        c.args(["events", "re-emit", "--resume", "1", "--json"]);
        c
    });
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(
        (v["state"].as_str(), v["emitted"].as_u64(), v["end"].as_str()),
        (Some("DONE"), Some(1000), Some("done"))
    );
    assert_eq!(
        count("SELECT COUNT(DISTINCT JSON_VALUE(headers, '$.reemitOf')) FROM t_event_record WHERE status = 'WAIT'"),
        1000
    );
    assert_eq!(
        count("SELECT COUNT(*) FROM t_event_record WHERE status = 'WAIT'"),
        1000,
        "none twice"
    );
    // A group forgets the job's events: a dry run counts the marks it holds.
    db.conn()
        .query_drop(
            "INSERT INTO outbox_inbox (consumer_group, event_key) SELECT 'points', event_key FROM t_event_record \
             WHERE status = 'SUCCESS' AND event_type = 'PAID' LIMIT 300",
        )
        .unwrap();
    let (code, stdout, err) = out({
        let mut c = outboxd(&db);
        c.args(["inbox", "forget", "--group", "points", "--job", "1", "--dry-run"]);
        c
    });
    assert_eq!(code, 0, "{err}");
    assert!(
        stdout.contains("group points: would forget 300 inbox marks in outbox_inbox of 1000 sent events"),
        "{stdout}"
    );
    let (code, stdout, err) = out({
        let mut c = outboxd(&db);
        c.args([
            "inbox",
            "forget",
            "--group",
            "points",
            "--event-type",
            "PAID",
            "--actor",
            "ops@test",
        ]);
        c
    });
    assert_eq!(code, 0, "{err}");
    assert!(stdout.contains("group points: forgot 300 inbox marks"), "{stdout}");
    assert_eq!(count("SELECT COUNT(*) FROM outbox_inbox"), 0);
    let actions: Vec<String> = db.conn().query("SELECT action FROM outbox_audit ORDER BY id").unwrap();
    assert_eq!(
        actions,
        [
            "reemit",
            "reemit-run",
            "reemit-stop",
            "reemit-run",
            "reemit-done",
            "inbox-forget"
        ],
        "{actions:?}"
    );
}

/// `outboxd` over a fleet (`shards`): each shard's series labelled, a missing shard named by
/// /healthz, `outbox_shard_up`, `status` and `migrate` (which go on past it and fail naming it),
/// commands that act on one database asking for `--shard`, and SIGHUP re-reading `shards` (a
/// list with an error changes nothing).
#[cfg(feature = "rocketmq")]
#[test]
fn run_over_a_fleet_labels_each_shard_names_a_missing_one_and_re_reads_shards_on_sighup() {
    let _shared = crate::rocketmq_e2e::BROKER_LOCK.read();
    crate::rocketmq_e2e::ensure_broker();
    let shards = crate::fleet::Shards::new("d_fleet", 3, &[2]);
    let server = crate::support::server_url();
    let dir = std::env::temp_dir().join(format!("outbox-fleet-{}", shards.base));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("outbox.toml");
    let write = |list: &str| std::fs::write(&file, format!("shards = \"{list}\"\n")).unwrap();
    write(&format!("{server}/{}_{{0..2}}", shards.base));
    let port = free_port();
    let cli = || {
        let mut c = fleet_outboxd(&format!("T_{}", shards.base));
        c.arg("--config").arg(&file);
        c
    };
    let (s0, s1, s2) = (shards.name(0), shards.name(1), shards.name(2));

    // Over the fleet, status and migrate go on past the missing shard and fail naming it.
    let (code, stdout, stderr) = out({
        let mut c = cli();
        c.arg("migrate");
        c
    });
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(
        stdout.contains(&format!("== shard {s0} (1/3)")) && stdout.contains(&format!("shard {s2}: FAILED")),
        "{stdout}"
    );
    assert!(stderr.contains(&format!("1 of 3 shards failed: {s2}")), "{stderr}");
    let (code, stdout, stderr) = out({
        let mut c = cli();
        c.arg("status");
        c
    });
    assert_eq!(code, 1, "{stdout}{stderr}");
    assert!(
        stdout.contains(&s0) && stdout.contains(&format!("{s2:<24} cannot read")),
        "{stdout}"
    );
    // The configuration of a fleet checks as a whole.
    let (code, stdout, stderr) = out({
        let mut c = cli();
        c.args(["config", "check"]);
        c
    });
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(
        stdout.contains("configuration OK") && stdout.contains("shards"),
        "{stdout}"
    );
    // A command on one database needs --shard; with it, it acts on that shard alone.
    let (code, _, stderr) = out({
        let mut c = cli();
        c.args(["dead-letters", "list"]);
        c
    });
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("--shard NAME") && stderr.contains(&s0), "{stderr}");
    let (code, _, stderr) = out({
        let mut c = cli();
        c.args(["--shard", "nope", "status"]);
        c
    });
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("\"nope\" is not one of the shards"), "{stderr}");

    let mut child = cli()
        .env("OUTBOX_METRICS_LISTEN", format!("127.0.0.1:{port}"))
        .env("OUTBOX_SCAN_INTERVAL_MS", "100")
        .arg("run")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = Lines::of(&mut child);
    shards.enqueue(0, "a", 30);
    shards.enqueue(1, "b", 20);
    assert!(
        wait_until(Duration::from_secs(120), || shards.count(0, "SUCCESS") == 30
            && shards.count(1, "SUCCESS") == 20),
        "the fleet did not relay"
    );
    let (code, metrics) = http_get(port, "/metrics").unwrap();
    assert_eq!(code, 200);
    for line in [
        format!("outbox_sent_total{{shard=\"{s0}\"}} 30"),
        format!("outbox_sent_total{{shard=\"{s1}\"}} 20"),
        format!("outbox_shard_up{{shard=\"{s0}\"}} 1"),
        format!("outbox_shard_up{{shard=\"{s2}\"}} 0"),
        "outbox_shards 3".into(),
    ] {
        assert!(metrics.contains(&line), "{line} missing from /metrics:\n{metrics}");
    }
    let (code, body) = http_get(port, "/healthz").unwrap();
    assert_eq!(code, 200, "one shard down leaves the fleet serving: {body}");
    assert!(body.starts_with("shards=3 healthy=2 broker=up"), "{body}");
    assert!(
        body.contains(&format!("shard {s2}: not relaying")) && body.contains(&s2),
        "{body}"
    );

    // SIGHUP: a list with an error changes nothing; a good one drops the missing shard.
    write("mysql://root@127.0.0.1:3306/x_{3..1}");
    signal(&child, "HUP");
    assert!(lines.wait_for("configuration error, shards unchanged", Duration::from_secs(30)));
    write(&format!("{server}/{}_{{0..1}}", shards.base));
    signal(&child, "HUP");
    assert!(lines.wait_for("0 added, 1 removed, 0 replaced; serving 2", Duration::from_secs(30)));
    let (_, metrics) = http_get(port, "/metrics").unwrap();
    assert!(
        !metrics.contains(&s2) && metrics.contains("outbox_shards 2"),
        "{metrics}"
    );
    let (code, body) = http_get(port, "/healthz").unwrap();
    assert_eq!(code, 200, "{body}");
    assert!(body.starts_with("shards=2 healthy=2 broker=up"), "{body}");
    shards.enqueue(1, "c", 10);
    assert!(wait_until(Duration::from_secs(60), || shards.count(1, "SUCCESS") == 30));

    signal(&child, "TERM");
    assert_eq!(exit_code(&mut child, Duration::from_secs(30)), Some(0));
    let err = lines.all().join("\n");
    assert!(err.contains("stopped 2 shards"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Two `outboxd run` over one fleet with `shard.coordination.url`: they split its shards (each
/// names its part in /healthz and /metrics), one is SIGKILLed, and the other takes its shards over
/// when their holds run out: every event of every shard, before and after the kill, ends SUCCESS.
#[cfg(feature = "rocketmq")]
#[test]
fn two_outboxd_split_a_fleet_and_the_shards_of_one_killed_are_taken_over() {
    let _shared = crate::rocketmq_e2e::BROKER_LOCK.read();
    crate::rocketmq_e2e::ensure_broker();
    let shards = crate::fleet::Shards::new("d_share", 4, &[]);
    let coord = crate::support::TestDb::empty("d_share_c");
    let server = crate::support::server_url();
    let dir = std::env::temp_dir().join(format!("outbox-share-{}", shards.base));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("outbox.toml");
    std::fs::write(
        &file,
        format!(
            "shards = \"{server}/{}_{{0..3}}\"\n\"shard.coordination.url\" = \"{}\"\n\"shard.lease.ms\" = 2000\n",
            shards.base, coord.url
        ),
    )
    .unwrap();
    let start = |id: &str, port: u16| {
        let mut c = fleet_outboxd(&format!("T_{}", shards.base));
        c.env("OUTBOX_INSTANCE_ID", id)
            .env("OUTBOX_METRICS_LISTEN", format!("127.0.0.1:{port}"))
            .arg("--config")
            .arg(&file)
            .arg("run")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (pa, pb) = (free_port(), free_port());
    let mut a = start("share-a", pa);
    let mut b = start("share-b", pb);
    let mut lines_b = Lines::of(&mut b);
    let _lines_a = Lines::of(&mut a);
    let healthz = |port| http_get(port, "/healthz").map(|(_, body)| body).unwrap_or_default();
    assert!(
        wait_until(Duration::from_secs(60), || healthz(pa)
            .starts_with("shards=4 here=2 relays=2")
            && healthz(pb).starts_with("shards=4 here=2 relays=2")),
        "not split: a {:?}, b {:?}",
        healthz(pa),
        healthz(pb)
    );
    for i in 0..4 {
        shards.enqueue(i, &format!("s{i}"), 20);
    }
    assert!(
        wait_until(Duration::from_secs(120), || (0..4)
            .all(|i| shards.count(i, "SUCCESS") == 20)),
        "the split fleet did not relay"
    );
    // As of a's last tick (every third of the lease), which may predate b's claims by a tick.
    let lines = [
        "outbox_fleet_members 2",
        "outbox_fleet_shards_here 2",
        "outbox_fleet_shards_unowned 0",
    ];
    let mut metrics = String::new();
    assert!(
        wait_until(Duration::from_secs(30), || {
            metrics = http_get(pa, "/metrics").map(|r| r.1).unwrap_or_default();
            lines.iter().all(|l| metrics.contains(l))
        }),
        "{lines:?} not all in /metrics:\n{metrics}"
    );
    // status names each shard's relay: two each.
    let (code, stdout, stderr) = out({
        let mut c = fleet_outboxd(&format!("T_{}", shards.base));
        c.arg("--config").arg(&file).arg("status");
        c
    });
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("relayed by"), "{stdout}");
    for id in ["share-a", "share-b"] {
        assert_eq!(stdout.matches(&format!("  {id}\n")).count(), 2, "{id} in:\n{stdout}");
    }

    // a dies without a word: b takes its shards when their holds (2 s) run out.
    a.kill().unwrap();
    let _ = a.wait();
    for i in 0..4 {
        shards.enqueue(i, &format!("t{i}"), 10);
    }
    assert!(
        wait_until(Duration::from_secs(60), || healthz(pb)
            .starts_with("shards=4 here=4 relays=1")),
        "b did not take over: {:?}",
        healthz(pb)
    );
    assert!(
        wait_until(Duration::from_secs(120), || (0..4)
            .all(|i| shards.count(i, "SUCCESS") == 30)),
        "events of the killed relay's shards were not relayed"
    );
    signal(&b, "TERM");
    assert_eq!(exit_code(&mut b, Duration::from_secs(30)), Some(0));
    assert!(lines_b.wait_for("left; its shards are free", Duration::from_secs(5)));
    let held: u64 = coord
        .conn()
        .query_first("SELECT COUNT(*) FROM outbox_fleet_shard WHERE owner <> ''")
        .unwrap()
        .unwrap();
    assert_eq!(held, 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `outboxd run` over a fleet listed by a catalog alone (`shard.catalog.url`, no `shards`):
/// its shard relayed, `status` reading the catalog, a row added served at the next read.
#[cfg(feature = "rocketmq")]
#[test]
fn run_over_a_catalog_follows_its_rows() {
    let _shared = crate::rocketmq_e2e::BROKER_LOCK.read();
    crate::rocketmq_e2e::ensure_broker();
    let shards = crate::fleet::Shards::new("d_catalog", 2, &[]);
    let catalog = TestDb::empty("d_catalog_c");
    let server = crate::support::server_url();
    catalog
        .conn()
        .exec_drop(
            "CREATE TABLE outbox_shards (url VARCHAR(255)) SELECT ? AS url",
            (format!("{server}/{}", shards.name(0)),),
        )
        .unwrap();
    let port = free_port();
    let cli = || {
        let mut c = fleet_outboxd(&format!("T_{}", shards.base));
        c.env("OUTBOX_SHARD_CATALOG_URL", &catalog.url)
            .env("OUTBOX_SHARD_CATALOG_RELOAD_MS", "1000");
        c
    };
    let (code, stdout, stderr) = out({
        let mut c = cli();
        c.arg("status");
        c
    });
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(
        stdout.contains(&shards.name(0)) && !stdout.contains(&shards.name(1)),
        "{stdout}"
    );
    let mut child = cli()
        .env("OUTBOX_METRICS_LISTEN", format!("127.0.0.1:{port}"))
        .arg("run")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let _lines = Lines::of(&mut child);
    shards.enqueue(0, "a", 10);
    assert!(wait_until(Duration::from_secs(60), || shards.count(0, "SUCCESS") == 10));
    catalog
        .conn()
        .exec_drop(
            "INSERT INTO outbox_shards VALUES (?)",
            (format!("{server}/{}", shards.name(1)),),
        )
        .unwrap();
    shards.enqueue(1, "b", 10);
    assert!(wait_until(Duration::from_secs(60), || shards.count(1, "SUCCESS") == 10));
    let (code, body) = http_get(port, "/healthz").unwrap();
    assert_eq!(code, 200, "{body}");
    assert!(body.starts_with("shards=2 healthy=2 broker=up"), "{body}");
    signal(&child, "TERM");
    assert_eq!(exit_code(&mut child, Duration::from_secs(30)), Some(0));
}
