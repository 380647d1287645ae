//! The Prometheus endpoint: `/metrics` (text format) and `/healthz`, on a small blocking server.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::exemplar::HistogramWithExemplars;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use outbox::{BreakerState, Relay};

/// Due WAIT rows the per-topic age gauge looks at per scrape (keeps a scrape cheap with any backlog).
const OLDEST_WAIT_SAMPLE: usize = 10_000;

/// The exemplar of a latency: the trace of the event it measured (OpenMetrics exemplars).
type TraceExemplar = Vec<(String, String)>;

/// The latency histograms, fed by the relay's latency hook.
#[derive(Clone)]
pub struct Latency {
    /// With the trace id of an event that carried a trace context as each bucket's exemplar.
    pub commit_to_ack: HistogramWithExemplars<TraceExemplar>,
    pub residence: Histogram,
}

impl Latency {
    pub fn new() -> Latency {
        Latency {
            // 1 ms .. ~65 s
            commit_to_ack: HistogramWithExemplars::new(exponential_buckets(0.001, 2.0, 17)),
            residence: Histogram::new(exponential_buckets(0.001, 2.0, 17)),
        }
    }

    pub fn observe(&self, commit_to_ack: Duration, residence: Duration, trace_id: Option<[u8; 16]>) {
        let exemplar = trace_id.map(|id| {
            let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
            vec![("trace_id".to_string(), hex)]
        });
        self.commit_to_ack.observe(commit_to_ack.as_secs_f64(), exemplar, None);
        self.residence.observe(residence.as_secs_f64());
    }
}

/// What the endpoint reports on: the relay once it runs, and until then why it does not yet.
#[derive(Debug, Default)]
pub struct Target {
    relay: RwLock<Option<Arc<Relay>>>,
    starting: RwLock<Option<String>>,
}

impl Target {
    pub fn new() -> Arc<Target> {
        Arc::new(Target::default())
    }

    /// The relay runs: report on it.
    pub fn set_relay(&self, relay: Arc<Relay>) {
        *self.relay.write().unwrap_or_else(|e| e.into_inner()) = Some(relay);
        *self.starting.write().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// The relay is not running yet, and why (reported by /healthz).
    pub fn set_starting(&self, why: String) {
        *self.starting.write().unwrap_or_else(|e| e.into_inner()) = Some(why);
    }

    fn relay(&self) -> Option<Arc<Relay>> {
        self.relay.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn starting(&self) -> Option<String> {
        self.starting.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Reads the relay's counters and the table's gauges at each scrape.
#[derive(Debug)]
struct RelayCollector {
    target: Arc<Target>,
}

fn counter(enc: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> Result<(), std::fmt::Error> {
    let c = ConstCounter::new(v);
    c.encode(enc.encode_descriptor(name, help, None, c.metric_type())?)
}

fn gauge(enc: &mut DescriptorEncoder, name: &str, help: &str, v: f64) -> Result<(), std::fmt::Error> {
    let g = ConstGauge::new(v);
    g.encode(enc.encode_descriptor(name, help, None, g.metric_type())?)
}

impl Collector for RelayCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(relay) = self.target.relay() else {
            return gauge(
                &mut enc,
                "outbox_starting",
                "1 while outboxd waits for its database at start (/healthz says why)",
                1.0,
            );
        };
        let s = relay.stats();
        counter(&mut enc, "outbox_claimed", "Rows claimed by this instance", s.claimed)?;
        counter(
            &mut enc,
            "outbox_claim_conflicts",
            "Candidates another instance claimed first",
            s.claim_conflicts,
        )?;
        counter(
            &mut enc,
            "outbox_sent",
            "Events acknowledged by the broker and marked SUCCESS",
            s.sent,
        )?;
        counter(
            &mut enc,
            "outbox_retried",
            "Failed attempts returned to WAIT with backoff",
            s.retried,
        )?;
        counter(&mut enc, "outbox_dead_lettered", "Events marked FAIL", s.dead_lettered)?;
        counter(
            &mut enc,
            "outbox_reclaimed",
            "Expired leases returned to WAIT or FAIL",
            s.reclaimed,
        )?;
        counter(&mut enc, "outbox_renewed", "Lease renewals", s.renewed)?;
        counter(
            &mut enc,
            "outbox_released_unsent",
            "Events released without using an attempt",
            s.released_unsent,
        )?;
        counter(
            &mut enc,
            "outbox_possible_duplicates",
            "Failed sends whose request may have reached the broker (each also used an attempt)",
            s.possible_duplicates,
        )?;
        counter(
            &mut enc,
            "outbox_parked",
            "Ordered events returned to WAIT without an attempt because their queue's broker was down",
            s.parked,
        )?;
        counter(
            &mut enc,
            "outbox_claim_blocked",
            "Ordered candidates left WAIT behind an earlier pending event of their key",
            s.claim_blocked,
        )?;
        counter(
            &mut enc,
            "outbox_stale_acks",
            "Acks that matched no row because the lease was lost",
            s.stale_acks,
        )?;
        counter(
            &mut enc,
            "outbox_breaker_opened",
            "Times the circuit breaker opened",
            s.breaker_opened,
        )?;
        counter(
            &mut enc,
            "outbox_db_errors",
            "Database errors seen by the relay",
            s.db_errors,
        )?;
        let state = match s.breaker_state {
            BreakerState::Closed => 0.0,
            BreakerState::HalfOpen => 1.0,
            BreakerState::Open => 2.0,
        };
        gauge(
            &mut enc,
            "outbox_breaker_state",
            "Circuit breaker: 0 closed, 1 half-open, 2 open",
            state,
        )?;
        gauge(
            &mut enc,
            "outbox_claim_failures_in_a_row",
            "Claim rounds that failed one after the other (0 after a success)",
            s.claim_failures_in_a_row as f64,
        )?;
        gauge(
            &mut enc,
            "outbox_write_failures_in_a_row",
            "Acks, releases, dead-letterings and renewals that failed one after the other",
            s.write_failures_in_a_row as f64,
        )?;
        gauge(
            &mut enc,
            "outbox_stalled",
            "1 while the relay cannot make progress (claims or writes failing in a row; /healthz says why)",
            if s.stalled.is_some() { 1.0 } else { 0.0 },
        )?;
        gauge(
            &mut enc,
            "outbox_paused",
            "1 while an operator has paused claiming on the table (outboxd control, the console; /healthz says who and why)",
            if s.paused.is_some() { 1.0 } else { 0.0 },
        )?;
        if let Some(age) = s.since_last_claim {
            gauge(
                &mut enc,
                "outbox_last_claim_success_age_seconds",
                "Time since the last claim round that succeeded",
                age.as_secs_f64(),
            )?;
        }
        gauge(
            &mut enc,
            "outbox_ordered_blocked_seconds",
            "Ordered relays: how long due events have waited with nothing claimable and none of their keys in flight (0 otherwise)",
            s.ordered_blocked.map_or(0.0, |d| d.as_secs_f64()),
        )?;
        gauge(
            &mut enc,
            "outbox_in_flight",
            "Claimed events not yet recorded",
            s.in_flight as f64,
        )?;
        if let Some(g) = s.gauges {
            gauge(&mut enc, "outbox_wait_rows", "Rows in WAIT", g.wait as f64)?;
            gauge(&mut enc, "outbox_sending_rows", "Rows in SENDING", g.sending as f64)?;
            gauge(
                &mut enc,
                "outbox_fail_rows",
                "Rows in FAIL (dead letters)",
                g.fail as f64,
            )?;
        }
        let cfg = relay.config();
        if let Ok(oldest) = outbox::admin::oldest_wait_by_topic(relay.pool(), &cfg.table, OLDEST_WAIT_SAMPLE) {
            let proto = ConstGauge::new(0.0);
            let mut family = enc.encode_descriptor(
                "outbox_oldest_wait_age_seconds",
                "How long the most overdue WAIT row of each topic has been due (over the first due rows)",
                None,
                proto.metric_type(),
            )?;
            for (topic, age) in oldest {
                let topic = topic.unwrap_or_else(|| cfg.topic.clone());
                let labels = [("topic", topic)];
                ConstGauge::new(age.as_secs_f64()).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// Serves `/metrics` and `/healthz` on `addr` until the process ends.
pub fn serve(addr: &str, target: Arc<Target>, latency: Latency) -> std::io::Result<std::thread::JoinHandle<()>> {
    let server =
        tiny_http::Server::http(addr).map_err(|e| std::io::Error::other(format!("metrics.listen = {addr}: {e}")))?;
    let mut registry = Registry::default();
    registry.register(
        "outbox_commit_to_ack_seconds",
        "From the event's commit (create_time) to the broker's ack",
        latency.commit_to_ack.clone(),
    );
    registry.register(
        "outbox_sending_residence_seconds",
        "How long an event was held SENDING by this instance",
        latency.residence.clone(),
    );
    registry.register_collector(Box::new(RelayCollector { target: target.clone() }));
    log::info!("metrics on http://{addr}/metrics and /healthz");
    std::thread::Builder::new()
        .name("outbox-metrics".into())
        .spawn(move || {
            for req in server.incoming_requests() {
                let (code, body, ctype) = match req.url() {
                    "/metrics" => {
                        let mut text = String::new();
                        match prometheus_client::encoding::text::encode(&mut text, &registry) {
                            Ok(()) => (200, text, "application/openmetrics-text; version=1.0.0; charset=utf-8"),
                            Err(e) => (500, format!("encoding failed: {e}\n"), "text/plain"),
                        }
                    }
                    "/healthz" => match target.relay() {
                        None => (
                            503,
                            format!(
                                "starting: {}\n",
                                target
                                    .starting()
                                    .unwrap_or_else(|| "the relay is not running yet".into())
                            ),
                            "text/plain",
                        ),
                        Some(relay) => {
                            let (db, broker) = relay.health();
                            let mut body = format!(
                                "db={} broker={}\n",
                                if db { "up" } else { "down" },
                                if broker { "up" } else { "down" }
                            );
                            if let Some(why) = relay.stalled() {
                                body.push_str(&format!("stalled: {why}\n"));
                            }
                            // Paused on purpose: said, but not unhealthy.
                            if let Some(paused) = relay.counters().paused {
                                body.push_str(&format!("{paused}\n"));
                            }
                            (if db && broker { 200 } else { 503 }, body, "text/plain")
                        }
                    },
                    _ => (404, "not found: try /metrics or /healthz\n".into(), "text/plain"),
                };
                let header =
                    tiny_http::Header::from_bytes(&b"Content-Type"[..], ctype.as_bytes()).expect("static header");
                let _ = req.respond(
                    tiny_http::Response::from_string(body)
                        .with_status_code(code)
                        .with_header(header),
                );
            }
        })
}
