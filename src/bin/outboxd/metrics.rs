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

use outbox::{BreakerState, Fleet, Relay, ShardState, Stats};

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

/// What the endpoint reports on: the relay once it runs, and until then why it does not yet; or
/// a fleet, each shard's series labelled `shard`.
#[derive(Debug, Default)]
pub struct Target {
    relay: RwLock<Option<Arc<Relay>>>,
    starting: RwLock<Option<String>>,
    fleet: RwLock<Option<Arc<Fleet>>>,
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

    /// A fleet runs: report on each of its shards.
    pub fn set_fleet(&self, fleet: Arc<Fleet>) {
        *self.fleet.write().unwrap_or_else(|e| e.into_inner()) = Some(fleet);
    }

    fn fleet(&self) -> Option<Arc<Fleet>> {
        self.fleet.read().unwrap_or_else(|e| e.into_inner()).clone()
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

fn gauge(enc: &mut DescriptorEncoder, name: &str, help: &str, v: f64) -> Result<(), std::fmt::Error> {
    let g = ConstGauge::new(v);
    g.encode(enc.encode_descriptor(name, help, None, g.metric_type())?)
}

/// One relay's series: its shard (`None`: the one relay of `db.url`, unlabelled) and its stats.
type Row = (Option<String>, Arc<Relay>, Stats);

/// A family with one sample per row: labelled `shard` in a fleet, unlabelled for one relay.
fn family<M: EncodeMetric>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: Vec<(Option<String>, M)>,
) -> Result<(), std::fmt::Error> {
    let Some(kind) = samples.first().map(|s| s.1.metric_type()) else {
        return Ok(());
    };
    let mut family = enc.encode_descriptor(name, help, None, kind)?;
    if let [(None, m)] = samples.as_slice() {
        return m.encode(family);
    }
    for (shard, m) in &samples {
        let labels = [("shard", shard.clone().unwrap_or_default())];
        m.encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

fn counters(
    enc: &mut DescriptorEncoder,
    rows: &[Row],
    name: &str,
    help: &str,
    f: impl Fn(&Stats) -> u64,
) -> Result<(), std::fmt::Error> {
    let samples = rows
        .iter()
        .map(|(l, _, s)| (l.clone(), ConstCounter::new(f(s))))
        .collect();
    family(enc, name, help, samples)
}

/// A gauge per row that has a value.
fn gauges(
    enc: &mut DescriptorEncoder,
    rows: &[Row],
    name: &str,
    help: &str,
    f: impl Fn(&Stats) -> Option<f64>,
) -> Result<(), std::fmt::Error> {
    let samples = rows
        .iter()
        .filter_map(|(l, _, s)| f(s).map(|v| (l.clone(), ConstGauge::new(v))))
        .collect();
    family(enc, name, help, samples)
}

impl Collector for RelayCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let rows: Vec<Row> = if let Some(fleet) = self.target.fleet() {
            let shards = fleet.shards();
            let up = shards
                .iter()
                .filter(|v| v.is_here())
                .map(|v| {
                    let running = matches!(v.state, ShardState::Running(_));
                    (
                        Some(v.spec.name.clone()),
                        ConstGauge::new(if running { 1.0 } else { 0.0 }),
                    )
                })
                .collect();
            family(
                &mut enc,
                "outbox_shard_up",
                "1 while the shard's relay runs, 0 while it cannot be started (/healthz says why); with shard.coordination.url only the shards this relay holds",
                up,
            )?;
            if let Some(c) = fleet.coordination() {
                gauge(
                    &mut enc,
                    "outbox_fleet_coordination_failing",
                    "1 while the coordination database (shard.coordination.url) cannot be reached: the shards held are relayed, none is taken over (/healthz says why)",
                    if c.problem.is_some() { 1.0 } else { 0.0 },
                )?;
                if let (Some(members), Some(unowned)) = (c.members, c.unowned) {
                    gauge(
                        &mut enc,
                        "outbox_fleet_members",
                        "Live relays configured with the same shards, this one included (at the last coordination tick)",
                        members as f64,
                    )?;
                    gauge(
                        &mut enc,
                        "outbox_fleet_shards_unowned",
                        "Shards no relay of the fleet holds (at the last coordination tick)",
                        unowned as f64,
                    )?;
                }
                gauge(
                    &mut enc,
                    "outbox_fleet_shards_here",
                    "Shards this relay holds and serves",
                    shards.iter().filter(|v| v.is_here()).count() as f64,
                )?;
            }
            gauge(
                &mut enc,
                "outbox_shards",
                "Shards this fleet serves",
                shards.len() as f64,
            )?;
            gauge(
                &mut enc,
                "outbox_fleet_watch_failing_servers",
                "Database servers whose watch statement (shard.watch.ms) failed at its last tick (/healthz says why)",
                fleet.watch_problems().len() as f64,
            )?;
            shards
                .iter()
                .filter_map(|v| v.relay().map(|r| (Some(v.spec.name.clone()), r.clone(), r.stats())))
                .collect()
        } else if let Some(relay) = self.target.relay() {
            let s = relay.stats();
            vec![(None, relay, s)]
        } else {
            return gauge(
                &mut enc,
                "outbox_starting",
                "1 while outboxd waits for its database at start (/healthz says why)",
                1.0,
            );
        };
        let e = &mut enc;
        let r = rows.as_slice();
        counters(e, r, "outbox_claimed", "Rows claimed by this instance", |s| s.claimed)?;
        counters(
            e,
            r,
            "outbox_claim_conflicts",
            "Candidates another instance claimed first",
            |s| s.claim_conflicts,
        )?;
        counters(
            e,
            r,
            "outbox_sent",
            "Events acknowledged by the broker and marked SUCCESS",
            |s| s.sent,
        )?;
        counters(
            e,
            r,
            "outbox_retried",
            "Failed attempts returned to WAIT with backoff",
            |s| s.retried,
        )?;
        counters(e, r, "outbox_dead_lettered", "Events marked FAIL", |s| s.dead_lettered)?;
        counters(
            e,
            r,
            "outbox_reclaimed",
            "Expired leases returned to WAIT or FAIL",
            |s| s.reclaimed,
        )?;
        counters(e, r, "outbox_renewed", "Lease renewals", |s| s.renewed)?;
        counters(
            e,
            r,
            "outbox_released_unsent",
            "Events released without using an attempt",
            |s| s.released_unsent,
        )?;
        counters(
            e,
            r,
            "outbox_possible_duplicates",
            "Failed sends whose request may have reached the broker (each also used an attempt)",
            |s| s.possible_duplicates,
        )?;
        counters(
            e,
            r,
            "outbox_parked",
            "Ordered events returned to WAIT without an attempt because their queue's broker was down",
            |s| s.parked,
        )?;
        counters(
            e,
            r,
            "outbox_claim_blocked",
            "Ordered candidates left WAIT behind an earlier pending event of their key",
            |s| s.claim_blocked,
        )?;
        counters(
            e,
            r,
            "outbox_stale_acks",
            "Acks that matched no row because the lease was lost",
            |s| s.stale_acks,
        )?;
        counters(e, r, "outbox_breaker_opened", "Times the circuit breaker opened", |s| {
            s.breaker_opened
        })?;
        counters(e, r, "outbox_db_errors", "Database errors seen by the relay", |s| {
            s.db_errors
        })?;
        gauges(
            e,
            r,
            "outbox_breaker_state",
            "Circuit breaker: 0 closed, 1 half-open, 2 open",
            |s| {
                Some(match s.breaker_state {
                    BreakerState::Closed => 0.0,
                    BreakerState::HalfOpen => 1.0,
                    BreakerState::Open => 2.0,
                })
            },
        )?;
        gauges(
            e,
            r,
            "outbox_claim_failures_in_a_row",
            "Claim rounds that failed one after the other (0 after a success)",
            |s| Some(s.claim_failures_in_a_row as f64),
        )?;
        gauges(
            e,
            r,
            "outbox_write_failures_in_a_row",
            "Acks, releases, dead-letterings and renewals that failed one after the other",
            |s| Some(s.write_failures_in_a_row as f64),
        )?;
        gauges(
            e,
            r,
            "outbox_stalled",
            "1 while the relay cannot make progress (claims or writes failing in a row; /healthz says why)",
            |s| Some(if s.stalled.is_some() { 1.0 } else { 0.0 }),
        )?;
        gauges(
            e,
            r,
            "outbox_paused",
            "1 while an operator has paused claiming on the table (outboxd control, the console; /healthz says who and why)",
            |s| Some(if s.paused.is_some() { 1.0 } else { 0.0 }),
        )?;
        gauges(
            e,
            r,
            "outbox_last_claim_success_age_seconds",
            "Time since the last claim round that succeeded",
            |s| s.since_last_claim.map(|a| a.as_secs_f64()),
        )?;
        gauges(
            e,
            r,
            "outbox_ordered_blocked_seconds",
            "Ordered relays: how long due events have waited with nothing claimable and none of their keys in flight (0 otherwise)",
            |s| Some(s.ordered_blocked.map_or(0.0, |d| d.as_secs_f64())),
        )?;
        gauges(e, r, "outbox_in_flight", "Claimed events not yet recorded", |s| {
            Some(s.in_flight as f64)
        })?;
        gauges(e, r, "outbox_wait_rows", "Rows in WAIT", |s| {
            s.gauges.as_ref().map(|g| g.wait as f64)
        })?;
        gauges(e, r, "outbox_sending_rows", "Rows in SENDING", |s| {
            s.gauges.as_ref().map(|g| g.sending as f64)
        })?;
        gauges(e, r, "outbox_fail_rows", "Rows in FAIL (dead letters)", |s| {
            s.gauges.as_ref().map(|g| g.fail as f64)
        })?;
        let mut oldest = Vec::new();
        for (shard, relay, _) in r {
            let cfg = relay.config();
            if let Ok(by_topic) = outbox::admin::oldest_wait_by_topic(relay.pool(), &cfg.table, OLDEST_WAIT_SAMPLE) {
                for (topic, age) in by_topic {
                    let mut labels = vec![("topic".to_string(), topic.unwrap_or_else(|| cfg.topic.clone()))];
                    if let Some(shard) = shard {
                        labels.push(("shard".to_string(), shard.clone()));
                    }
                    oldest.push((labels, ConstGauge::new(age.as_secs_f64())));
                }
            }
        }
        let proto = ConstGauge::new(0.0);
        let mut family = e.encode_descriptor(
            "outbox_oldest_wait_age_seconds",
            "How long the most overdue WAIT row of each topic has been due (over the first due rows)",
            None,
            proto.metric_type(),
        )?;
        for (labels, g) in oldest {
            g.encode(family.encode_family(&labels)?)?;
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
                    "/healthz" if target.fleet().is_some() => {
                        let (code, body) = fleet_health(&target.fleet().expect("checked"));
                        (code, body, "text/plain")
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

/// A fleet's health: 200 while the broker is up and some shard relays, 503 otherwise (with
/// `shard.coordination.url`: a relay that holds no shard is healthy while it reaches the
/// coordination database: the others serve them all). A shard
/// that cannot be started, or whose relay reports its database down, stalled or paused, is named
/// on a line of its own either way (one shard down does not make the whole fleet unhealthy: its
/// `outbox_shard_up` is 0 and the alert rules name it).
pub fn fleet_health(fleet: &Fleet) -> (u16, String) {
    let shards = fleet.shards();
    let mut lines = Vec::new();
    let (mut healthy, mut broker, mut running) = (0, false, 0);
    let coordination = fleet.coordination();
    for v in &shards {
        let name = &v.spec.name;
        match &v.state {
            ShardState::Elsewhere { .. } => {}
            ShardState::Starting {
                attempts, last_error, ..
            } => lines.push(match last_error {
                Some(e) => format!("shard {name}: not relaying (attempt {attempts}): {e}"),
                None => format!("shard {name}: starting"),
            }),
            ShardState::Running(relay) => {
                running += 1;
                let (db, b) = relay.health();
                broker |= b;
                if db {
                    healthy += 1;
                } else {
                    lines.push(format!("shard {name}: db=down"));
                }
                if let Some(why) = relay.stalled() {
                    lines.push(format!("shard {name}: stalled: {why}"));
                }
                if let Some(paused) = relay.counters().paused {
                    lines.push(format!("shard {name}: {paused}"));
                }
            }
        }
    }
    for (server, why) in fleet.watch_problems() {
        lines.push(format!(
            "watch of server {server}: {why} (its shards scan every shard.scan.interval.ms meanwhile)"
        ));
    }
    let here = shards.iter().filter(|v| v.is_here()).count();
    let catalog_problem = fleet.catalog_problem();
    if let Some(why) = &catalog_problem {
        lines.push(format!("catalog: {why} (the shards listed before are served)"));
    }
    if shards.is_empty() {
        lines.push("no shards yet: shards and the catalog list none".into());
    }
    if let Some(c) = &coordination {
        if let Some(why) = &c.problem {
            lines.push(format!(
                "coordination: {why} (the shards held are relayed, none is taken over)"
            ));
        }
        if let Some(n) = c.unowned.filter(|n| *n > 0) {
            lines.push(format!("coordination: {n} shard(s) held by no relay yet"));
        }
    }
    let mut body = format!(
        "shards={}{} healthy={} broker={}\n",
        shards.len(),
        match &coordination {
            Some(c) => format!(
                " here={here} relays={}",
                c.members.map_or("unknown".into(), |m| m.to_string())
            ),
            None => String::new(),
        },
        healthy,
        // Only a running relay knows the broker.
        match (running, broker) {
            (0, _) => "unknown",
            (_, true) => "up",
            (_, false) => "down",
        }
    );
    for l in lines {
        body.push_str(&l);
        body.push('\n');
    }
    let ok = shards.is_empty() && catalog_problem.is_none()
        || match &coordination {
            // Holding nothing while the others hold everything is a healthy spare.
            Some(c) if here == 0 => c.problem.is_none(),
            _ => broker && healthy > 0,
        };
    (if ok { 200 } else { 503 }, body)
}
