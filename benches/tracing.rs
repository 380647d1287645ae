//! What tracing costs the relay's drain (docs/tracing.md), in one run: the unordered drain of N
//! seeded events through the real broker,
//!
//! - **compiled out**: this bench built without the `otel` feature (a child process: the bench
//!   builds and runs it), events carrying a trace context that nothing reads;
//! - **compiled in, no context**: events without a trace context (what a service that does not
//!   trace pays);
//! - **compiled in, traced, no provider**: every event traced, no tracer provider installed
//!   (OpenTelemetry's no-op);
//! - **compiled in, traced, OTLP, no collector**: every event traced, the OTLP exporter `outboxd`
//!   installs, pointed at a port where nothing listens;
//!
//! in rounds taking turns (the machine's speed drifts). Rates from the database's clock, first
//! claim to last ack.
//!
//! `cargo bench --features rocketmq,otlp --bench tracing [-- --events N] [--rounds R]`

use std::sync::Arc;
use std::time::{Duration, Instant};

use mysql::prelude::Queryable;
use mysql::{Opts, Pool};

use outbox::rocketmq::RocketMqPublisher;
use outbox::{Config, Relay};

const SERVER: &str = "mysql://root@127.0.0.1:3306";
const NAMESRV: &str = "127.0.0.1:9876";
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// Seeds `n` events (traced or not) in a database of their own and drains them with one relay:
/// events/s, first claim to last ack.
fn drain(tag: &str, n: u64, traced: bool) -> f64 {
    let db = format!("outbox_bench_trace_{tag}_{}", std::process::id());
    let server = Pool::new(Opts::from_url(SERVER).unwrap()).expect("MariaDB on 127.0.0.1:3306");
    let mut s = server.get_conn().unwrap();
    s.query_drop(format!("DROP DATABASE IF EXISTS {db}")).unwrap();
    s.query_drop(format!("CREATE DATABASE {db}")).unwrap();
    let url = format!("{SERVER}/{db}");
    let mut cfg = Config::new(&url);
    cfg.topic = format!("TRACE_BENCH_{}", std::process::id());
    cfg.rocketmq.namesrv = NAMESRV.into();
    let pool = outbox::connect(&cfg).unwrap();
    outbox::migrate(&pool).unwrap();
    let headers = if traced {
        format!("'{{\"traceparent\":\"{TRACEPARENT}\"}}'")
    } else {
        "NULL".into()
    };
    let mut c = pool.get_conn().unwrap();
    let mut done = 0;
    while done < n {
        let k = (n - done).min(100_000);
        c.query_drop(format!(
            "INSERT INTO t_event_record (biz_no, event_type, payload, headers, event_key) \
             SELECT CONCAT('ORD-', seq + {done}), 'ORDER_PAID', REPEAT('x', 200), {headers}, UUID() FROM seq_1_to_{k}"
        ))
        .unwrap();
        done += k;
    }
    let relay = Relay::start(cfg.clone(), Arc::new(RocketMqPublisher::start(&cfg).unwrap())).unwrap();
    let end = Instant::now() + Duration::from_secs(600);
    while relay.counters().sent < n {
        assert!(Instant::now() < end, "{tag}: the relay did not drain {n} events");
        std::thread::sleep(Duration::from_millis(20));
    }
    relay.stop(Duration::from_secs(10));
    let us: i64 = c
        .query_first("SELECT TIMESTAMPDIFF(MICROSECOND, MIN(claimed_at), MAX(sent_at)) FROM t_event_record")
        .unwrap()
        .flatten()
        .unwrap_or(1);
    s.query_drop(format!("DROP DATABASE {db}")).unwrap();
    n as f64 / (us.max(1) as f64 / 1e6)
}

#[cfg(feature = "otlp")]
mod compiled_in {
    use super::*;
    use opentelemetry::global;

    /// Builds this bench without `otel` and returns its executable.
    pub fn build_compiled_out() -> std::path::PathBuf {
        let out = std::process::Command::new(env!("CARGO"))
            .args([
                "bench",
                "--no-run",
                "--features",
                "rocketmq",
                "--bench",
                "tracing",
                "--message-format",
                "json",
            ])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .stderr(std::process::Stdio::inherit())
            .output()
            .expect("cargo builds the compiled-out bench");
        assert!(out.status.success(), "building the compiled-out bench failed");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["target"]["name"] == "tracing")
            .find_map(|v| v["executable"].as_str().map(std::path::PathBuf::from))
            .expect("the compiled-out bench's executable")
    }

    /// One drain in the compiled-out build.
    pub fn drain_compiled_out(exe: &std::path::Path, n: u64, round: usize) -> f64 {
        let out = std::process::Command::new(exe)
            .args(["--child", &n.to_string(), &round.to_string()])
            .stderr(std::process::Stdio::inherit())
            .output()
            .unwrap();
        assert!(out.status.success(), "the compiled-out drain failed");
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("the child prints its rate")
    }

    pub fn run(n: u64, rounds: usize) {
        println!("building the bench without the otel feature ...");
        let exe = build_compiled_out();
        let names = [
            "compiled out (events traced, nothing reads it)",
            "compiled in, events without a trace context",
            "compiled in, traced, no tracer provider",
            "compiled in, traced, OTLP exporter, no collector",
        ];
        let mut rates: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
        for round in 0..rounds {
            rates[0].push(drain_compiled_out(&exe, n, round));
            rates[1].push(drain(&format!("nocx{round}"), n, false));
            global::set_tracer_provider(opentelemetry::trace::noop::NoopTracerProvider::new());
            rates[2].push(drain(&format!("noop{round}"), n, true));
            // Port 9 (discard): nothing listens on this machine.
            let guard = outbox::telemetry::otlp::install(Some("http://127.0.0.1:9"), "bench").unwrap();
            rates[3].push(drain(&format!("otlp{round}"), n, true));
            drop(guard);
            println!(
                "  round {}: {}",
                round + 1,
                rates
                    .iter()
                    .map(|r| format!("{:.0}", r.last().unwrap()))
                    .collect::<Vec<_>>()
                    .join(" / ")
            );
        }
        let median = |v: &[f64]| {
            let mut v = v.to_vec();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let base = median(&rates[0]);
        println!("\n| configuration | median events/s | vs compiled out | rounds |");
        println!("|---|---:|---:|---|");
        for (name, r) in names.iter().zip(&rates) {
            println!(
                "| {name} | {:.0} | {:.0} % | {} |",
                median(r),
                100.0 * median(r) / base,
                r.iter().map(|x| format!("{x:.0}")).collect::<Vec<_>>().join(", ")
            );
        }
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (mut n, mut rounds) = (50_000u64, 3usize);
    while let Some(a) = args.next() {
        match a.as_str() {
            // The compiled-out build's one drain, for the parent: prints events/s.
            "--child" => {
                let n: u64 = args.next().and_then(|v| v.parse().ok()).expect("--child N ROUND");
                let round = args.next().unwrap_or_default();
                println!("{:.0}", drain(&format!("out{round}"), n, true));
                return;
            }
            "--events" => n = args.next().and_then(|v| v.parse().ok()).expect("--events N"),
            "--rounds" => rounds = args.next().and_then(|v| v.parse().ok()).expect("--rounds R"),
            "--bench" => {}
            other => {
                eprintln!("tracing bench: unknown argument {other:?} (--events N, --rounds R)");
                std::process::exit(2);
            }
        }
    }
    println!("== relay drain with tracing: {n} events per drain, {rounds} rounds taking turns");
    #[cfg(feature = "otlp")]
    compiled_in::run(n, rounds);
    #[cfg(not(feature = "otlp"))]
    {
        let _ = rounds;
        eprintln!("built without the otlp feature: run with --features rocketmq,otlp to compare");
        std::process::exit(2);
    }
}
