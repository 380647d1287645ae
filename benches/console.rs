//! The operator console's pages on a large table while a relay drains it: each page's time to
//! answer (p50, p95, max over R requests) through `Console::handle`, the way `outboxd` serves it,
//! with 10 M rows in the outbox table (mostly sent, some dead letters, spread over 30 days), a
//! million inbox marks, and a writer committing 1 000 events/s that a relay publishes to
//! RocketMQ meanwhile. The target is p95 ≤ 200 ms for every page. Requests are answered in
//! process (no HTTP: what is measured is the console and its queries).
//!
//! `cargo bench --features rocketmq,console --bench console [-- --rows N] [--requests R] [--backlog N] [--keep]`
//!
//! Before measuring, `--backlog` rows (200 000) are added WAIT for the relay to drain flat out;
//! every page is requested once per round, R rounds (40), the first round not counted.
//!
//! Loading 10 M rows takes a few minutes; `--keep` leaves the database (`outbox_bench_console`)
//! for the next run, which then reuses it when it holds at least N rows.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mysql::prelude::Queryable;
use mysql::{Opts, Pool};

use outbox::console::{Console, Request, Response};
use outbox::rocketmq::RocketMqPublisher;
use outbox::{Config, NewEvent, Relay};

const SERVER: &str = "mysql://root@127.0.0.1:3306";
const DB: &str = "outbox_bench_console";
const NAMESRV: &str = "127.0.0.1:9876";
const ADMIN: &str = "bench-admin-token-0123456789";
const READ: &str = "bench-read-token-0123456789";
const TARGET_P95_MS: f64 = 200.0;
/// Events committed per second by the writer while pages are measured.
const WRITE_RATE: u64 = 1_000;

fn server() -> Pool {
    Pool::new(Opts::from_url(SERVER).unwrap()).expect("MariaDB on 127.0.0.1:3306")
}

fn url() -> String {
    format!("{SERVER}/{DB}")
}

/// The table, loaded (or reused when it already holds `rows`).
fn load(rows: u64) -> Pool {
    let mut s = server().get_conn().unwrap();
    s.query_drop(format!("CREATE DATABASE IF NOT EXISTS {DB}")).unwrap();
    let pool = Pool::new(Opts::from_url(&url()).unwrap()).unwrap();
    outbox::migrate(&pool).unwrap();
    let mut c = pool.get_conn().unwrap();
    let have: u64 = c
        .query_first("SELECT COALESCE(MAX(id), 0) FROM t_event_record")
        .unwrap()
        .unwrap();
    if have >= rows {
        println!("reusing {DB}: {have} rows");
        return pool;
    }
    for t in [
        "t_event_record",
        "outbox_inbox",
        "outbox_inbox_dead_letter",
        "outbox_audit",
    ] {
        c.query_drop(format!("TRUNCATE {t}")).unwrap();
    }
    let started = Instant::now();
    const CHUNK: u64 = 500_000;
    let span_s = 30 * 86_400u64;
    let mut done = 0;
    while done < rows {
        let n = CHUNK.min(rows - done);
        // Rows in id order over the last 30 days; one in 2 000 a dead letter, the rest sent.
        // Topics, types and business keys vary as an order service's do.
        c.query_drop(format!(
                "INSERT INTO t_event_record (biz_no, event_type, payload, topic, status, retry_count, \
                 next_retry_time, create_time, sent_at, event_key, last_error) \
                 SELECT CONCAT('ORD-', LPAD(seq + {done}, 9, '0')), \
                        ELT(1 + seq % 3, 'ORDER_CREATED', 'ORDER_PAID', 'ORDER_SHIPPED'), \
                        CONCAT('{{\"order\":', seq + {done}, ',\"amount\":', seq % 997, '}}'), \
                        ELT(1 + seq % 4, 'orders', 'payments', 'shipping', 'points'), \
                        IF((seq + {done}) % 2000 = 0, 'FAIL', 'SUCCESS'), \
                        IF((seq + {done}) % 2000 = 0, 8, 0), \
                        NOW(3) - INTERVAL ({span_s} * ({rows} - seq - {done}) DIV {rows}) SECOND, \
                        NOW(3) - INTERVAL ({span_s} * ({rows} - seq - {done}) DIV {rows}) SECOND, \
                        IF((seq + {done}) % 2000 = 0, NULL, NOW(3) - INTERVAL ({span_s} * ({rows} - seq - {done}) DIV {rows}) SECOND), \
                        UUID(), \
                        IF((seq + {done}) % 2000 = 0, \
                           ELT(1 + seq % 3, 'send timed out after 3000 ms', 'broker refused: topic not found', \
                               'no route to broker-b'), NULL) \
                 FROM seq_1_to_{n}"
        ))
        .unwrap();
        done += n;
        let secs = started.elapsed().as_secs_f64();
        println!(
            "  loaded {done}/{rows} rows ({:.0} rows/s, {:.0} s left)",
            done as f64 / secs,
            (rows - done) as f64 / (done as f64 / secs)
        );
    }
    // A consumer group's marks and dead letters, for the consumer pages.
    c.query_drop(
        "INSERT INTO outbox_inbox (consumer_group, event_key, topic, processed_at) \
         SELECT 'points', UUID(), 'orders', NOW(3) - INTERVAL seq SECOND FROM seq_1_to_1000000",
    )
    .unwrap();
    c.query_drop(
        "INSERT INTO outbox_inbox_dead_letter (consumer_group, event_key, topic, body, attempts, last_error) \
         SELECT 'points', UUID(), 'orders', '{}', 3, 'handler: account locked' FROM seq_1_to_2000",
    )
    .unwrap();
    c.query_drop("ANALYZE TABLE t_event_record, outbox_inbox, outbox_inbox_dead_letter")
        .unwrap();
    println!("loaded {rows} rows in {:.0} s", started.elapsed().as_secs_f64());
    pool
}

fn get(url: &str, cookie: &str) -> Request {
    let mut r = Request {
        method: "GET".into(),
        url: url.into(),
        remote: "127.0.0.1:1".into(),
        ..Request::default()
    };
    r.headers.insert("cookie".into(), cookie.into());
    r
}

fn body(r: &Response) -> String {
    String::from_utf8_lossy(&r.body).into_owned()
}

/// An admin's session cookie and CSRF token, logged in as a browser does.
fn login(console: &Console) -> (String, String) {
    let form = console.handle(&get("/login", ""));
    let cookie_of = |r: &Response| {
        r.headers
            .iter()
            .find(|(k, _)| k == "Set-Cookie")
            .map(|(_, v)| v.split(';').next().unwrap().to_string())
            .unwrap()
    };
    let csrf_of = |page: &str| {
        let at = page.find("name=\"csrf\" value=\"").unwrap() + 19;
        page[at..].split('"').next().unwrap().to_string()
    };
    let mut req = get("/login", &cookie_of(&form));
    req.method = "POST".into();
    req.body = format!("csrf={}&name=bench&token={ADMIN}", csrf_of(&body(&form))).into_bytes();
    let session = cookie_of(&console.handle(&req));
    let csrf = csrf_of(&body(&console.handle(&get("/controls", &session))));
    (session, csrf)
}

struct Timing {
    page: String,
    p50: f64,
    p95: f64,
    max: f64,
}

/// One request, timed in milliseconds.
fn timed(console: &Console, page: &str, req: &Request) -> f64 {
    let t = Instant::now();
    let r = console.handle(req);
    let took = t.elapsed().as_secs_f64() * 1000.0;
    assert!(r.status == 200, "{page}: {} {}", r.status, body(&r));
    took
}

fn summary(page: &str, mut ms: Vec<f64>) -> Timing {
    ms.sort_by(f64::total_cmp);
    let at = |q: f64| ms[((ms.len() as f64 * q).ceil() as usize).clamp(1, ms.len()) - 1];
    Timing {
        page: page.into(),
        p50: at(0.50),
        p95: at(0.95),
        max: *ms.last().unwrap(),
    }
}

fn main() {
    let (mut rows, mut requests, mut keep, mut backlog) = (10_000_000u64, 40usize, false, 200_000u64);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--rows" => rows = args.next().and_then(|v| v.parse().ok()).expect("--rows N"),
            "--requests" => requests = args.next().and_then(|v| v.parse().ok()).expect("--requests R"),
            "--keep" => keep = true,
            "--backlog" => backlog = args.next().and_then(|v| v.parse().ok()).expect("--backlog N"),
            "--bench" => {}
            other => {
                eprintln!("console bench: unknown argument {other:?} (--rows N, --requests R, --backlog N, --keep)");
                std::process::exit(2);
            }
        }
    }
    println!("console bench: {rows} rows, {requests} requests per page, target p95 ≤ {TARGET_P95_MS} ms");
    let pool = load(rows);
    let some_fail: u64 = pool
        .get_conn()
        .unwrap()
        .query_first("SELECT id FROM t_event_record WHERE status = 'FAIL' ORDER BY id DESC LIMIT 1")
        .unwrap()
        .unwrap();

    // A backlog for the relay to drain flat out while pages are measured, on top of what a writer
    // commits at WRITE_RATE events/s.
    pool.get_conn()
        .unwrap()
        .query_drop(format!(
            "INSERT INTO t_event_record (biz_no, event_type, payload, event_key) \
             SELECT CONCAT('BACKLOG-', seq), 'ORDER_CREATED', '{{\"backlog\":true}}', UUID() FROM seq_1_to_{backlog}"
        ))
        .unwrap();
    // A relay draining what a writer commits at WRITE_RATE events/s, all through the measurement.
    let mut cfg = Config::new(url());
    cfg.topic = format!("CONSOLE_BENCH_{}", std::process::id());
    cfg.rocketmq.namesrv = NAMESRV.into();
    cfg.console.admin_token = Some(ADMIN.into());
    cfg.console.read_token = Some(READ.into());
    let relay = Arc::new(Relay::start(cfg.clone(), Arc::new(RocketMqPublisher::start(&cfg).unwrap())).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (pool, stop) = (pool.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut conn = pool.get_conn().unwrap();
            let (tick, per_tick) = (Duration::from_millis(50), WRITE_RATE / 20);
            let mut next = Instant::now();
            let mut n = 0u64;
            while !stop.load(Relaxed) {
                let mut tx = conn.start_transaction(mysql::TxOpts::default()).unwrap();
                for _ in 0..per_tick {
                    n += 1;
                    let e = NewEvent::new(format!("LIVE-{n}"), "ORDER_CREATED", format!("{{\"n\":{n}}}"));
                    outbox::enqueue_in_tx(&mut tx, &e).unwrap();
                }
                tx.commit().unwrap();
                next += tick;
                if let Some(wait) = next.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait); // pacing the offered load, not waiting for a result
                }
            }
            n
        })
    };
    let console = Console::new(&cfg).unwrap();
    console.attach(relay.clone());
    let (session, csrf) = login(&console);
    // Measure once the relay drains at the writer's pace (a second's worth sent).
    let warm = Instant::now() + Duration::from_secs(60);
    while relay.counters().sent < WRITE_RATE {
        assert!(
            Instant::now() < warm,
            "the relay sent nothing in 60 s: is the broker up?"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let sent_before = relay.counters().sent;
    let started = Instant::now();

    // A list's page `pages` further on, as its "Older" links lead.
    let deeper = |first: &str, pages: usize| {
        let mut url = first.to_string();
        for _ in 0..pages {
            let page = body(&console.handle(&get(&url, &session)));
            let at = page.find("class=\"next\" href=\"").expect("an Older link") + 19;
            url = page[at..].split('"').next().unwrap().replace("&amp;", "&");
        }
        url
    };
    let pages: Vec<(&str, String)> = vec![
        ("overview", "/".into()),
        ("overview, live part", "/partials/overview".into()),
        ("overview JSON", "/api/overview.json".into()),
        ("events (newest)", "/events".into()),
        ("events, 5th page", deeper("/events", 4)),
        ("events, status=SUCCESS, 5th page", deeper("/events?status=SUCCESS", 4)),
        ("events, status=FAIL", "/events?status=FAIL".into()),
        ("events, status=WAIT", "/events?status=WAIT".into()),
        ("events, status=SUCCESS", "/events?status=SUCCESS".into()),
        ("events, biz_no", "/events?biz_no=ORD-004000000".into()),
        ("events, topic", "/events?topic=payments".into()),
        ("events, since 1h", "/events?since=1h".into()),
        ("events, a day 20 days ago", "/events?since=20d&until=19d".into()),
        ("events, error contains", "/events?error=no+route".into()),
        (
            "events, type + topic, rare",
            "/events?event_type=ORDER_PAID&topic=points&status=FAIL".into(),
        ),
        ("event detail", format!("/events/{some_fail}")),
        ("dead letters", "/dead-letters".into()),
        ("dead letters, error contains", "/dead-letters?error=timed+out".into()),
        ("dead letters by error", "/dead-letters/groups".into()),
        ("ordered keys", "/ordered".into()),
        ("consumers", "/consumers".into()),
        ("consumer group", "/consumers/points".into()),
        ("consumer group, 5th page", deeper("/consumers/points", 4)),
        ("controls", "/controls".into()),
        ("audit", "/audit".into()),
    ];
    let mut reqs: Vec<(&str, Request)> = pages.iter().map(|(name, url)| (*name, get(url, &session))).collect();
    // The confirmation step of "replay every dead letter matching a filter": counts what it takes.
    let mut preview = get("/dead-letters/preview", &session);
    preview.method = "POST".into();
    preview.body = format!("csrf={csrf}&action=replay&scope=matching&error=topic+not+found").into_bytes();
    reqs.push(("dead letters, replay preview (by filter)", preview));
    // Round after round over every page, as operators clicking around would, while the relay
    // drains; the first round warms up and is not counted.
    let mut ms: Vec<Vec<f64>> = vec![Vec::with_capacity(requests); reqs.len()];
    let mut sent_during = Vec::new();
    for round in 0..=requests {
        for (i, (name, req)) in reqs.iter().enumerate() {
            let took = timed(&console, name, req);
            if round > 0 {
                ms[i].push(took);
            }
        }
        sent_during.push(relay.counters().sent);
    }
    let timings: Vec<Timing> = reqs.iter().zip(ms).map(|((name, _), ms)| summary(name, ms)).collect();

    let secs = started.elapsed().as_secs_f64();
    let drained = relay.counters().sent - sent_before;
    stop.store(true, Relaxed);
    let written = writer.join().unwrap();
    relay.stop(Duration::from_secs(10));

    println!();
    println!("| page | p50 ms | p95 ms | max ms |");
    println!("|---|---:|---:|---:|");
    for t in &timings {
        println!("| {} | {:.2} | {:.2} | {:.2} |", t.page, t.p50, t.p95, t.max);
    }
    let worst = timings.iter().max_by(|a, b| a.p95.total_cmp(&b.p95)).unwrap();
    println!();
    let backlog_left: u64 = pool
        .get_conn()
        .unwrap()
        .query_first("SELECT COUNT(*) FROM t_event_record WHERE status = 'WAIT'")
        .unwrap()
        .unwrap();
    let rounds_draining = sent_during.windows(2).filter(|w| w[1] > w[0]).count();
    println!(
        "while measuring ({secs:.0} s): {written} events committed, the relay sent {drained} ({:.0}/s), \
         sending in {rounds_draining} of {requests} rounds; {backlog_left} still WAIT at the end",
        drained as f64 / secs
    );
    println!(
        "slowest p95: {} at {:.1} ms: target p95 ≤ {TARGET_P95_MS} ms {}",
        worst.page,
        worst.p95,
        if worst.p95 <= TARGET_P95_MS { "met" } else { "NOT met" }
    );
    if !keep {
        server()
            .get_conn()
            .unwrap()
            .query_drop(format!("DROP DATABASE {DB}"))
            .unwrap();
    }
}
